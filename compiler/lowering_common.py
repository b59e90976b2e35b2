"""What every lowering module shares: the LOWERINGS table and `register_lowering`, operand
loaders, the view ops' index remaps (VIEW_REINDEX) and data-dependent indices.

lowering.py (GraphLowering and the elementwise/view lowerings) and the lowering_*.py modules
(reductions, data movement, random ops) import these from here, and lowering.py imports the
lowering_*.py modules to fill the table: the pipeline's order reads from the imports.

The table is born with one row per pointwise op of ops.TABLE (`lower_row`): a lowering module
may build on a pointwise row (lowering_reductions' `add.Tensor` accumulation takes the add row)
whatever order the modules are imported in.
"""
from __future__ import annotations

import functools
from typing import Callable

import sympy
import torch

from . import ir, ops as optable, torch_compat
from .ir import IRNode
from .torch_compat import elementwise_dtypes

aten = torch.ops.aten


LOWERINGS: dict = {}


def register_lowering(*targets):
    def deco(fn):
        for t in targets:
            for key in _overloads(t):
                LOWERINGS[key] = fn
        return fn
    return deco


def _overloads(t):
    if isinstance(t, torch_compat.OpOverloadPacket):
        return [getattr(t, o) for o in t.overloads()]
    return [t]


def _meta(x):
    """What PyTorch's promotion helpers need: a meta tensor for IR values, scalars as-is."""
    if isinstance(x, IRNode):   # promotion depends on dims only, not on their sizes
        return torch.empty([s if isinstance(s, int) else 2 for s in x.size], dtype=x.dtype, device="meta")
    if isinstance(x, sympy.Expr):
        return 2
    return x


def with_origin(node, fn):
    """Body that tells the op handler which FX node its statements come from."""
    def body(ops, *index):
        with ops.origin(node):
            return fn(ops, *index)
    return body


def _inject(fn, kind, node):
    def body(ops, *index):
        return ops.inject_bug(kind, fn(ops, *index), node)
    return body


# ---- operands ------------------------------------------------------------------------------

def operand(x, size, dtype) -> Callable:
    """Loader of `x` (IR value or Python scalar) broadcast to `size`, converted to `dtype`."""
    if isinstance(x, IRNode):
        load, reindex = x.make_loader(), ir.broadcast_reindex(x.size, size)
        return lambda ops, index: ops.to_dtype(load(ops, reindex(index)), dtype)
    if isinstance(x, sympy.Expr) and not x.is_number:   # a symbolic scalar (a size): a kernel argument
        return lambda ops, index: ops.index_expr(x, dtype)
    return lambda ops, index: ops.constant(x, dtype)


def _out(node):
    val = node.meta["val"]
    return tuple(ir.as_size(s) for s in val.shape), val.dtype


def opmath(dtype):
    """The dtype eager's CPU kernels compute `dtype` values in: float for bf16/fp16."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _compute_dtype(args, kind):
    return elementwise_dtypes(*[_meta(a) for a in args], type_promotion_kind=kind)[0]


def lower_row(row, g, node, *args, alpha=1, **kwargs):
    """One pointwise table row: promote, broadcast, apply ops.<row.name>, convert to the result."""
    if kwargs:
        raise NotImplementedError(f"{row.name} with {sorted(kwargs)}")
    size, out_dtype = _out(node)
    compute = _compute_dtype(args, row.promotion_kind)
    loaders = [operand(a, size, compute) for a in args]
    if alpha != 1:
        base = loaders[-1]
        loaders[-1] = lambda ops, index: ops.mul(base(ops, index), ops.constant(alpha, compute))
    op = row.name

    def fn(ops, index):
        return ops.to_dtype(getattr(ops, op)(*[load(ops, index) for load in loaders]), out_dtype)
    return g.pointwise(node, size, out_dtype, fn, args)


for _row in optable.POINTWISE:
    register_lowering(*_row.aten)(functools.partial(lower_row, _row))


# ---- views: the index remap of each view op (lowering.lower_view uses it where no strided window does) --

def _reshape(x, size, *_):
    return ir.reshape_reindex(x.size, size)


def _transpose(x, size, d0=0, d1=1):
    dims = list(range(len(x.size)))
    d0, d1 = d0 % max(len(dims), 1), d1 % max(len(dims), 1)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return ir.permute_reindex(dims)


def _slice(x, size, dim=0, start=None, end=None, step=1):
    dim = dim % len(x.size)
    start = 0 if start is None else start
    start = min(max(start + x.size[dim] if start < 0 else start, 0), x.size[dim])

    def reindex(index):
        index = list(index)
        index[dim] = start + step * index[dim]
        return index
    return reindex


def _select(x, size, dim, i):
    dim = dim % len(x.size)
    i = i + x.size[dim] if i < 0 else i

    def reindex(index):
        index = list(index)
        index.insert(dim, sympy.Integer(i))
        return index
    return reindex


VIEW_REINDEX = {
    aten.view: _reshape, aten.reshape: _reshape, aten._unsafe_view: _reshape,
    aten.squeeze: _reshape, aten.unsqueeze: _reshape,
    aten.permute: lambda x, size, dims: ir.permute_reindex([d % len(x.size) for d in dims]),
    aten.transpose: _transpose,
    aten.t: lambda x, size: _transpose(x, size, 0, 1) if len(x.size) == 2 else (lambda i: i),
    aten.expand: lambda x, size, *_, **__: ir.broadcast_reindex(x.size, size),
    aten.slice: _slice, aten.select: _select,
    aten.alias: lambda x, size: (lambda i: i), aten.detach: lambda x, size: (lambda i: i),
    aten.as_strided: None,
}


def _indirect(ops, index_loader, idx, bound):
    """A data-dependent index: the int64 value `index_loader` gives at `idx`, checked against `bound`."""
    return ops.indirect_indexing(ops.to_dtype(index_loader(ops, idx), torch.int64), bound)
