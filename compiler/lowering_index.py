"""Advanced-indexing lowerings: `index.Tensor` (x[i0, None, i2] with integer index tensors).

A Pointwise over the result that reads `x` at data-dependent indices (`indirect_indexing`:
negative indices wrap once, out-of-range ones set the kernel's error status, as eager raises).
Boolean/byte masks give data-dependent result shapes and are left to aten. Registered in
LOWERINGS (lowering_common.py) on import.
"""
from __future__ import annotations

import torch

from . import ir
from .lowering_common import _indirect, _out, register_lowering

aten = torch.ops.aten


def _index_plan(ndim, indices):
    """(positions of the index tensors, broadcast shape of them, where their dims go in the
    result). Eager's rule: the broadcast dims replace the indexed dims in place when those are
    adjacent, and lead the result otherwise."""
    positions = [d for d, t in enumerate(indices) if t is not None]
    shape = _broadcast_shape([tuple(indices[d].size) for d in positions])
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    return positions, shape, positions[0] if adjacent else 0


def _broadcast_shape(sizes) -> tuple:
    """PyTorch's broadcast of `sizes`, whose entries may be symbolic: a dim is the one size of
    its column that is not 1 (every other one the same expression or 1). A column whose sizes may
    differ for some values of the symbols (NotImplementedError: the node stays an aten call)."""
    ndim = max(len(s) for s in sizes)
    out = []
    for col in range(ndim):
        dims = [s[len(s) - ndim + col] for s in sizes if len(s) - ndim + col >= 0]
        wide = [d for d in dims if not ir.same(d, 1)]
        if any(not ir.same(d, wide[0]) for d in wide):
            raise NotImplementedError(f"index tensors of sizes {sizes} broadcast only for some sizes")
        out.append(wide[0] if wide else 1)
    return tuple(out)


@register_lowering(aten.index.Tensor)
def lower_index(g, node, x, indices):
    indices = list(indices) + [None] * (len(x.size) - len(indices))
    if any(t is not None and (not isinstance(t, ir.IRNode) or t.dtype in (torch.bool, torch.uint8))
           for t in indices):
        raise NotImplementedError("boolean mask indices (a data-dependent result shape)")
    size, out_dtype = _out(node)
    positions, shape, at = _index_plan(len(x.size), indices)
    nb = len(shape)
    xl = x.make_loader()
    loaders = [(d, indices[d].make_loader(), ir.broadcast_reindex(indices[d].size, shape)) for d in positions]
    plain = [d for d in range(len(x.size)) if d not in positions]

    def fn(ops, index):
        index = list(index)
        bidx = index[at:at + nb]
        rest = index[:at] + index[at + nb:]
        src = [None] * len(x.size)
        for d, r in zip(plain, rest):
            src[d] = r
        for d, load, reindex in loaders:
            src[d] = _indirect(ops, lambda o, i, load=load, reindex=reindex: load(o, reindex(i)), bidx, x.size[d])
        return xl(ops, src)
    return g.pointwise(node, size, out_dtype, fn, [x] + [indices[d] for d in positions])
