"""Scans along one dim: cumsum and cumprod, for dims of at most SCAN_UNROLL elements.

Element i of the result folds x[0..i] in eager's order, sequentially, in eager's accumulation
type (double for float32 and float64, float for bf16/fp16, int64 for integers and bool),
rounded once on store: the values equal eager's. Each element unrolls the whole scan dim (x[j]
joins the fold only where j <= i, a `where`, so -0.0 and NaN propagate as in eager): O(n) work
per element, so longer dims stay aten calls (a linear scan), as do sizes that are not
compile-time integers. Registered in LOWERINGS (lowering_common.py) on import.
"""
from __future__ import annotations

import torch

from .lowering_common import _out, register_lowering

aten = torch.ops.aten

SCAN_UNROLL = 32     # longest scan dim lowered: its unrolled fold costs n/2 operations per element on average


def _accumulation_dtype(dtype):
    """Eager's CPU accumulation type (at::acc_type<T, false>): double for float32/float64, float
    for bf16/fp16, int64 for integers and bool."""
    if dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return torch.float64 if dtype.is_floating_point else torch.int64


def _lower_scan(combine, g, node, x, dim, *, dtype=None):
    size, out_dtype = _out(node)
    if not size:
        size_n, dim = 1, None
    else:
        dim = dim % len(size)
        size_n = size[dim]
    if not isinstance(size_n, int) or size_n > SCAN_UNROLL:
        raise NotImplementedError(f"scan over a dim of {size_n} elements (unrolled up to {SCAN_UNROLL})")
    acc_dtype = _accumulation_dtype(out_dtype)
    load = x.make_loader()

    def at(ops, index, j):
        src = list(index)
        if dim is not None:
            src[dim] = j
        # eager converts to the result dtype first (cumsum(dtype=...)), then accumulates
        return ops.to_dtype(ops.to_dtype(load(ops, src), out_dtype), acc_dtype)

    def fn(ops, index):
        acc = at(ops, index, 0)
        if dim is not None:
            i = ops.index_expr(index[dim], torch.int64)
            for j in range(1, size_n):
                joins = ops.ge(i, ops.constant(j, torch.int64))
                acc = ops.where(joins, getattr(ops, combine)(acc, at(ops, index, j)), acc)
        return ops.to_dtype(acc, out_dtype)
    return g.pointwise(node, size, out_dtype, fn, (x,))


@register_lowering(aten.cumsum.default)
def lower_cumsum(g, node, x, dim, *, dtype=None):
    return _lower_scan("add", g, node, x, dim, dtype=dtype)


@register_lowering(aten.cumprod.default)
def lower_cumprod(g, node, x, dim, *, dtype=None):
    return _lower_scan("mul", g, node, x, dim, dtype=dtype)
