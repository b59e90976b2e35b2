"""Pooling lowerings: avg_pool2d (and avg_pool1d and local_response_norm, which reach it).

Each output element sums its window in eager's order (rows, then columns, in the compute dtype,
from 0), the window's taps unrolled: a tap outside the input is a masked read that leaves the
sum as it is. The divisor follows eager: `divisor_override`, else the window's size clipped to
the padded input (count_include_pad) or to the input itself. Windows of more than MAX_TAPS taps
stay aten calls (the unrolled body grows with the window). Registered in LOWERINGS
(lowering_common.py) on import.
"""
from __future__ import annotations

import torch

from .lowering_common import _out, register_lowering

aten = torch.ops.aten

MAX_TAPS = 64


def _pair(v, default=None):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if not v:
        return default
    return v * 2 if len(v) == 1 else v


@register_lowering(aten.avg_pool2d.default)
def lower_avg_pool2d(g, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                     count_include_pad=True, divisor_override=None):
    size, out_dtype = _out(node)
    if not out_dtype.is_floating_point:
        raise NotImplementedError("avg_pool2d of an integer tensor")
    # eager sums in the op-math type: float for bf16/fp16, rounded once on store
    acc_dtype = torch.float32 if out_dtype in (torch.bfloat16, torch.float16) else out_dtype
    (kh, kw), (ph, pw) = _pair(kernel_size), _pair(padding)
    sh, sw = _pair(stride, [kh, kw])
    if kh * kw > MAX_TAPS:
        raise NotImplementedError(f"avg_pool2d window of {kh * kw} taps (unrolled up to {MAX_TAPS})")
    h_in, w_in = x.size[-2], x.size[-1]
    load = x.make_loader()
    i64 = torch.int64

    def span(ops, start, k, pad, n):
        """(window extent clipped to the padded input, extent clipped to the input) along one dim."""
        lo, hi = ops.index_expr(start, i64), ops.index_expr(start + k, i64)
        hi = ops.minimum(hi, ops.constant(n + pad, i64))
        padded = ops.sub(hi, lo)
        inner = ops.sub(ops.minimum(hi, ops.constant(n, i64)), ops.maximum(lo, ops.constant(0, i64)))
        return padded, inner

    def fn(ops, index):
        *lead, oh, ow = index
        h0, w0 = oh * sh - ph, ow * sw - pw
        acc = ops.constant(0, acc_dtype)
        for dh in range(kh):
            for dw in range(kw):
                ih, iw = h0 + dh, w0 + dw
                checks = [ops.ge(ops.index_expr(ih, i64), ops.constant(0, i64)),
                          ops.lt(ops.index_expr(ih, i64), ops.constant(h_in, i64)),
                          ops.ge(ops.index_expr(iw, i64), ops.constant(0, i64)),
                          ops.lt(ops.index_expr(iw, i64), ops.constant(w_in, i64))]
                inside = ops.logical_and(ops.logical_and(checks[0], checks[1]),
                                         ops.logical_and(checks[2], checks[3]))
                tap = ops.masked(inside, lambda ih=ih, iw=iw: ops.to_dtype(load(ops, [*lead, ih, iw]), acc_dtype),
                                 ops.constant(0, acc_dtype))
                acc = ops.where(inside, ops.add(acc, tap), acc)
        if divisor_override:
            divisor = ops.constant(divisor_override, i64)
        else:
            (ph_all, h_inner), (pw_all, w_inner) = span(ops, h0, kh, ph, h_in), span(ops, w0, kw, pw, w_in)
            divisor = ops.mul(ph_all, pw_all) if count_include_pad else ops.mul(h_inner, w_inner)
            # an empty window (eager writes 0) divides 0 by 1
            divisor = ops.maximum(divisor, ops.constant(1, i64))
        return ops.to_dtype(ops.div(acc, ops.to_dtype(divisor, acc_dtype)), out_dtype)
    return g.pointwise(node, size, out_dtype, fn, (x,))
