"""Lowerings of ops that allocate or rearrange without arithmetic: the empty factories,
`prims.rev` (flip), `diagonal`, `unsafe_split`.

empty / empty_permuted / empty_strided have unspecified contents: they are lowered as a fill
with zeros (one cheap store loop that dead-buffer elimination drops when nothing reads the
values, as after a decomposition that only takes the empty's shape). The rest are Pointwise
reads of their input at remapped indices, fused into their readers like views. Registered in
LOWERINGS (lowering_common.py) on import.
"""
from __future__ import annotations

import torch

from .ir import View, as_size
from .lowering_common import _out, register_lowering

aten = torch.ops.aten
prims = torch.ops.prims


@register_lowering(aten.empty.memory_format, aten.empty_permuted, aten.empty_strided)
def lower_empty(g, node, *args, **kwargs):
    size, out_dtype = _out(node)
    return g.pointwise(node, size, out_dtype, lambda ops, index: ops.constant(0, out_dtype))


@register_lowering(prims.rev)
def lower_rev(g, node, x, dims):
    """x read backwards along `dims` (negative dims allowed)."""
    size, out_dtype = _out(node)
    nd, load = len(size), x.make_loader()
    flipped = {d % nd for d in dims} if nd else set()

    def fn(ops, index):
        return load(ops, [size[d] - 1 - i if d in flipped else i for d, i in enumerate(index)])
    return g.pointwise(node, size, out_dtype, fn, (x,))


@register_lowering(aten.diagonal)
def lower_diagonal(g, node, x, offset=0, dim1=0, dim2=1):
    """The result's last dim walks x's (dim1, dim2) diagonal shifted by `offset` (as eager: above
    the main diagonal for offset > 0); the other dims keep their order."""
    size, out_dtype = _out(node)
    nd, load = len(x.size), x.make_loader()
    dim1, dim2 = dim1 % nd, dim2 % nd
    rest = [d for d in range(nd) if d not in (dim1, dim2)]
    row, col = max(-offset, 0), max(offset, 0)

    def fn(ops, index):
        src = [None] * nd
        for d, i in zip(rest, index[:-1]):
            src[d] = i
        src[dim1], src[dim2] = index[-1] + row, index[-1] + col
        return load(ops, src)
    return g.pointwise(node, size, out_dtype, fn, (x,))


@register_lowering(aten.unsafe_split.Tensor, aten.unsafe_split_with_sizes.default)
def lower_unsafe_split(g, node, x, split, dim=0):
    """Slices of `x` along `dim`, one View each (index remaps, as split's slices): the pieces'
    sizes come from the node's values. `x` is realized first: its pieces' readers are not
    counted as its readers, so a lazy `x` would be recomputed by each of them."""
    x = g.realize(x)
    dim = dim % max(len(x.size), 1)
    pieces, start = [], 0
    for val in node.meta["val"]:
        size = tuple(as_size(s) for s in val.shape)   # symbolic pieces: expressions of the size symbols
        pieces.append(View(x, size, _shifted(dim, start)))
        start += size[dim]
    return pieces


def _shifted(dim, start):
    """Index into a tensor from an index into its piece that starts at `start` along `dim`."""
    def reindex(index):
        index = list(index)
        index[dim] = index[dim] + start
        return index
    return reindex
