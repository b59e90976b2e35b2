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
    shape = tuple(torch.broadcast_shapes(*[tuple(indices[d].size) for d in positions]))
    adjacent = positions == list(range(positions[0], positions[-1] + 1))
    return positions, shape, positions[0] if adjacent else 0


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
