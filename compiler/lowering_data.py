"""Data-movement lowerings: cat, constant_pad_nd, embedding, index_select, gather.

Each is a Pointwise over its output that reads its inputs at remapped (or data-dependent,
`indirect_indexing`, bounds-checked) indices; registered in LOWERINGS (lowering_common.py) on import.
"""
from __future__ import annotations

import functools

import torch

from . import ir
from .lowering_common import _indirect, _out, register_lowering

aten = torch.ops.aten


@register_lowering(aten.cat)
def lower_cat(g, node, tensors, dim=0):
    size, out_dtype = _out(node)
    dim = dim % len(size)
    parts, offset = [], 0
    for t in tensors:
        if len(t.size) != len(size):   # legacy 1-D empty inputs take no part
            continue
        parts.append((offset, offset + t.size[dim], t.make_loader()))
        offset += t.size[dim]

    def fn(ops, index):
        # Part k is read only where lo_k <= index < hi_k: the select chain's fallback value is
        # computed before its mask is tested, so every part but the first guards its own lower
        # bound (a plain read at index - lo_k < 0 is out of bounds: MobileBERT's head read
        # 15.6 MB before a weight's storage). In a segmented innermost loop both masks are constants.
        value = None
        for k, (lo, hi, load) in reversed(list(enumerate(parts))):
            shifted = list(index)
            shifted[dim] = index[dim] - lo
            inner = functools.partial(lambda l, s: ops.to_dtype(l(ops, s), out_dtype), load, shifted)
            if k > 0:
                above = ops.ge(ops.index_expr(index[dim], torch.int64), ops.constant(lo, torch.int64))
                inner = functools.partial(ops.masked, above, inner, ops.constant(0, out_dtype))
            if value is None:
                value = inner()
            else:
                mask = ops.lt(ops.index_expr(index[dim], torch.int64), ops.constant(hi, torch.int64))
                value = ops.masked(mask, inner, value)
        return value
    return g.pointwise(node, size, out_dtype, fn, tensors)


@register_lowering(aten.constant_pad_nd)
def lower_pad(g, node, x, pad, value=0):
    """Padding as a read of `x` that picks the pad value outside it. Padded dims other than
    the innermost one in memory (H and W of an NHWC image, H of an NCHW one) are read
    branch-free: the source index wraps into range (ModIndex, computed outside the innermost
    loop, so the load stays in bounds) and `where` picks the pad value, so the loop over the
    innermost dim vectorizes (a masked load is an `if` that g++ refuses to vectorize: an
    EfficientNet-b0 pad+SiLU kernel ran scalar, ~50 ns per element). A padded innermost dim
    keeps a masked read (a wrapped index there would cost a modulo per element): its mask
    compares the innermost loop variable with constants, so codegen cuts that loop into
    mask-free segments (codegen_segments)."""
    size, out_dtype = _out(node)
    load, nd = x.make_loader(), len(size)
    before = {nd - 1 - k // 2: pad[k] for k in range(0, len(pad), 2)}
    padded = {nd - 1 - k // 2 for k in range(len(pad)) if pad[k] != 0}
    inner, wraps = _pad_wraps(g, node, x, before, padded)

    def in_range(ops, src, dims):
        masks = []
        for d in dims:
            masks.append(ops.ge(ops.index_expr(src[d], torch.int64), ops.constant(0, torch.int64)))
            masks.append(ops.lt(ops.index_expr(src[d], torch.int64), ops.constant(x.size[d], torch.int64)))
        return functools.reduce(ops.logical_and, masks) if masks else None

    def fn(ops, index):
        src = [index[d] - before.get(d, 0) for d in range(nd)]
        if wraps is None:
            mask = in_range(ops, src, list(before))
            read = lambda: ops.to_dtype(load(ops, src), out_dtype)   # noqa: E731
            return read() if mask is None else ops.masked(mask, read, ops.constant(value, out_dtype))
        inside = [ir.ModIndex(index[d] + wraps[d], x.size[d]) if d in wraps else src[d] for d in range(nd)]
        outer = in_range(ops, src, [d for d in before if d != inner])

        def read():
            v = ops.to_dtype(load(ops, inside), out_dtype)
            return v if outer is None else ops.where(outer, v, ops.constant(value, out_dtype))
        mask = in_range(ops, src, [inner] if inner in padded else [])
        return read() if mask is None else ops.masked(mask, read, ops.constant(value, out_dtype))
    return g.pointwise(node, size, out_dtype, fn, (x,))


def _pad_wraps(g, node, x, before, padded) -> tuple:
    """(innermost dim, {padded dim other than it: the shift that makes `index + shift` a
    non-negative number congruent to the source index modulo the input's size}); the dict is
    None when the wrapped form does not apply (an empty padded dim, a 0-d result). The innermost
    dim is that of the layout the result is realized in (its loops run in that memory order)."""
    val = node.meta.get("val")
    if not padded or not isinstance(val, torch.Tensor) or any(x.size[d] == 0 for d in padded):
        return None, None
    stride = g._output_stride(node) or ir.contiguous_strides(val.shape)
    dims = [d for d in range(val.dim()) if not ir.same(ir.as_size(val.shape[d]), 1)]
    if not dims:
        return None, None
    innermost = min(dims, key=lambda d: (ir.hint(ir.as_size(stride[d])), -d))
    if g.planned and node.users and all(u.target is aten.clone.default and u.kwargs.get("memory_format") is
                                        torch.channels_last for u in node.users):
        innermost = 1   # read only by layout.py's conversion to channels_last: looped channels innermost
    if not all(ir.is_static(x.size[d]) for d in padded if d != innermost):
        return None, None   # the wrapped index needs the size's value (masked reads instead)
    return innermost, {d: -(-max(before[d], 0) // int(x.size[d])) * int(x.size[d]) - before[d]
                       for d in padded if d != innermost}


@register_lowering(aten.embedding)
def lower_embedding(g, node, weight, indices, *_, **__):
    size, out_dtype = _out(node)
    wl, il, k = weight.make_loader(), indices.make_loader(), len(indices.size)

    def fn(ops, index):
        row = _indirect(ops, il, index[:k], weight.size[0])
        return wl(ops, [row] + list(index[k:]))
    return g.pointwise(node, size, out_dtype, fn, (weight, indices))


def _lower_indexed(g, node, x, dim, index_t, positions):
    """`x` read along `dim` at the index `index_t` holds at `positions(index)` (bounds-checked)."""
    size, out_dtype = _out(node)
    dim = dim % max(len(x.size), 1)
    xl, il = x.make_loader(), index_t.make_loader()

    def fn(ops, index):
        index = list(index)
        if x.size:
            index[dim] = _indirect(ops, il, positions(index, dim), x.size[dim])
        return xl(ops, index)
    return g.pointwise(node, size, out_dtype, fn, (x, index_t))


@register_lowering(aten.index_select)
def lower_index_select(g, node, x, dim, index_t):
    return _lower_indexed(g, node, x, dim, index_t, lambda index, d: [index[d]] if index_t.size else [])


@register_lowering(aten.gather)
def lower_gather(g, node, x, dim, index_t, sparse_grad=False):
    return _lower_indexed(g, node, x, dim, index_t, lambda index, d: list(index))
