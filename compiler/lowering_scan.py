"""Scans along one dim: cumsum and cumprod (cummax and cummin below), for dims of at most SCAN_UNROLL elements.

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
    dim, size_n = _scan_dim(size, dim)
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


def _scan_dim(size, dim):
    """(scan dim or None for a 0-d tensor, its length) when it is short enough to unroll."""
    dim, n = (None, 1) if not size else (dim % len(size), size[dim % len(size)])
    if not isinstance(n, int) or n > SCAN_UNROLL:
        raise NotImplementedError(f"scan over a dim of {n} elements (unrolled up to {SCAN_UNROLL})")
    return dim, n


def _lower_running_extreme(compare, g, node, x, dim):
    """cummax / cummin: (values, indices), eager's rule: element j takes over when it is NaN, or
    when the running value is not NaN and `compare(x[j], running)` holds (>= for cummax, <= for
    cummin, so ties move the index to the later element)."""
    size, out_dtype = tuple(node.meta["val"][0].shape), node.meta["val"][0].dtype
    dim, n = _scan_dim(size, dim)
    load, floating = x.make_loader(), out_dtype.is_floating_point

    def at(ops, index, j):
        src = list(index)
        if dim is not None:
            src[dim] = j
        return load(ops, src)

    def fold(ops, index):
        value, where_from = at(ops, index, 0), ops.constant(0, torch.int64)
        if dim is None:
            return value, where_from
        i = ops.index_expr(index[dim], torch.int64)
        for j in range(1, n):
            v = at(ops, index, j)
            beats = getattr(ops, compare)(v, value)
            if floating:
                beats = ops.logical_or(ops.isnan(v), ops.logical_and(ops.logical_not(ops.isnan(value)), beats))
            take = ops.logical_and(ops.ge(i, ops.constant(j, torch.int64)), beats)
            value, where_from = ops.where(take, v, value), ops.where(take, ops.constant(j, torch.int64), where_from)
        return value, where_from
    values = g.pointwise(node, size, out_dtype, lambda ops, index: fold(ops, index)[0], (x,))
    indices = g.pointwise(node, size, torch.int64, lambda ops, index: fold(ops, index)[1], (x,))
    return g.realize(values), g.realize(indices)


@register_lowering(aten.cummax.default)
def lower_cummax(g, node, x, dim):
    return _lower_running_extreme("ge", g, node, x, dim)


@register_lowering(aten.cummin.default)
def lower_cummin(g, node, x, dim):
    return _lower_running_extreme("le", g, node, x, dim)
