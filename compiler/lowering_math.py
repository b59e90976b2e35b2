"""Pointwise ops whose scalar parameters the ops table's rows (ops.py) do not take:
`round.decimals`. Registered in LOWERINGS (lowering_common.py) on import.
"""
from __future__ import annotations

import torch

from .lowering_common import _out, register_lowering

aten = torch.ops.aten


@register_lowering(aten.round.decimals)
def lower_round_decimals(g, node, x, *, decimals=0):
    """Eager's formula, so the values are equal: with p = 10**|decimals| rounded to the dtype,
    nearbyint(x * p) / p, or nearbyint(x / p) * p for negative decimals."""
    size, out_dtype = _out(node)
    if not out_dtype.is_floating_point:
        raise NotImplementedError("round.decimals of an integer tensor (eager rejects it)")
    if out_dtype in (torch.bfloat16, torch.float16):
        raise NotImplementedError("round.decimals in bf16/fp16 (eager rounds after each step)")
    load, p = x.make_loader(), float(10.0 ** abs(decimals))

    def fn(ops, index):
        v, scale = ops.to_dtype(load(ops, index), out_dtype), ops.constant(p, out_dtype)
        if decimals >= 0:
            return ops.div(ops.round(ops.mul(v, scale)), scale)
        return ops.mul(ops.round(ops.div(v, scale)), scale)
    return g.pointwise(node, size, out_dtype, fn, (x,))
