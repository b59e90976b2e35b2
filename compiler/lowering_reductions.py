"""Reduction lowerings: sum/prod/amax/amin/argmax/argmin/any/all, max/min with indices, mean,
var and var_mean, and the scatters of the training losses (the embedding gradient's accumulating
_unsafe_masked_index_put_accumulate, the NLL backward's one-hot scatter.value), each registered
in LOWERINGS (lowering_common.py) like every other lowering.

Imported at the end of lowering.py so the table is complete whenever lowering is imported.
"""
from __future__ import annotations

import math
import weakref

import sympy
import torch

from . import ir, ops as optable
from .ir import ComputedBuffer, ExternBuffer, ExternKernel, Reduction, StorageBox, View
from .lowering_common import LOWERINGS, VIEW_REINDEX, _inject, _out, operand, opmath, register_lowering, with_origin

aten = torch.ops.aten

def make_reduction(g, node, x, dims, keepdim, rtype, out_dtype, load=None, src_dtype=None):
    """Realize a Reduction of `x` over `dims` (None or [] = all) into a ComputedBuffer."""
    nd = len(x.size)
    dims = sorted({d % nd for d in dims}) if dims and nd else list(range(nd))
    kept = [i for i in range(nd) if i not in dims]
    ranges = tuple(1 if i in dims else x.size[i] for i in range(nd)) if keepdim else tuple(x.size[i] for i in kept)
    load = load or x.make_loader()

    def fn(ops, index, rindex):
        full = [None] * nd
        for k, i in enumerate(kept):
            full[i] = index[i] if keepdim else index[k]
        for k, d in enumerate(dims):
            full[d] = rindex[k]
        return load(ops, full)
    fn = with_origin(node, fn)
    bug = g.config.inject_bug
    if bug is not None and optable.op_matches(bug[0], node.target):
        fn = _inject(fn, bug[1], node)
    red = Reduction(ranges, out_dtype, fn, [node] + x.lazy_origins(), tuple(x.size[d] for d in dims),
                    rtype, src_dtype or x.dtype)
    return g.reduction_buffer(node, red)


def _norm_dims(dim):
    if dim is None:
        return None
    return [dim] if isinstance(dim, int) else list(dim)


def _simple_reduction(rtype):
    def lower(g, node, x, dim=None, keepdim=False, *, dtype=None):
        if isinstance(node.meta["val"], (tuple, list)):
            raise NotImplementedError("multi-output form")
        return make_reduction(g, node, x, _norm_dims(dim), keepdim, rtype, _out(node)[1])
    return lower


for _rtype, _targets in {"sum": (aten.sum,), "prod": (aten.prod,), "max": (aten.amax, aten.max.default),
                         "min": (aten.amin, aten.min.default), "argmax": (aten.argmax,),
                         "argmin": (aten.argmin,), "any": (aten.any,), "all": (aten.all,)}.items():
    register_lowering(*_targets)(_simple_reduction(_rtype))


@register_lowering(aten.max.dim, aten.min.dim)
def lower_max_dim(g, node, x, dim, keepdim=False):
    kind = node.target.overloadpacket.__name__
    values = make_reduction(g, node, x, [dim], keepdim, kind, x.dtype)
    indices = make_reduction(g, node, x, [dim], keepdim, "arg" + kind, torch.int64)
    return (values, indices)


def _count(x, dims):
    nd = len(x.size)
    dims = sorted({d % nd for d in dims}) if dims and nd else list(range(nd))
    return math.prod(x.size[d] for d in dims)


@register_lowering(aten.mean)
def lower_mean(g, node, x, dim=None, keepdim=False, *, dtype=None):
    size, out_dtype = _out(node)
    acc = opmath(out_dtype)     # bf16/fp16: the sum stays float until the mean is stored (as eager)
    total = make_reduction(g, node, x, _norm_dims(dim), keepdim, "sum", acc)
    n = _count(x, _norm_dims(dim))
    load = total.make_loader()
    return g.pointwise(node, size, out_dtype, lambda ops, i: ops.div(load(ops, i), ops.constant(n, acc)))


def _variance(g, node, x, dim, correction, keepdim, out_dtype):
    """Two passes over x - x0 (x0: the row's first element): the shifted mean, then the sum of
    squared deviations (both reductions share loops). The shift keeps rows of huge, close values
    finite, as eager's Welford does: without it 1e38 * 4 overflows the sum and var is inf, not 0.
    bf16/fp16 compute in float (opmath) and round only the stored var and mean, as eager.
    Returns (var, mean with the reduced dims kept, n)."""
    stored, out_dtype = out_dtype, opmath(out_dtype)
    dims = _norm_dims(dim)
    n = _count(x, dims)
    xl = x.make_loader()
    nd = len(x.size)
    red = set(d % nd for d in dims) if dims and nd else set(range(nd))

    def first(index):
        return [sympy.Integer(0) if d in red else i for d, i in enumerate(index)]

    def at(ops, index):
        return ops.to_dtype(xl(ops, index), out_dtype)

    def shifted(ops, index):
        # an empty row has no first element to load
        return ops.sub(at(ops, index), at(ops, first(index))) if n else at(ops, index)

    total = make_reduction(g, node, x, dims, True, "sum", out_dtype, load=with_origin(node, shifted))
    tl = total.make_loader()

    def sq_dev(ops, index):
        dev = ops.sub(shifted(ops, index), ops.div(tl(ops, first(index)), ops.constant(n, out_dtype)))
        return ops.mul(dev, dev)
    ss = make_reduction(g, node, x, dims, keepdim, "sum", out_dtype, load=with_origin(node, sq_dev))
    correction = 1 if correction is None else correction
    size = ss.size
    sl = ss.make_loader()
    var = g.pointwise(node, size, stored, lambda ops, i: ops.div(sl(ops, i), ops.constant(max(n - correction, 0), out_dtype)))

    def mean(ops, i):
        avg = ops.div(tl(ops, i), ops.constant(n, out_dtype))
        return ops.add(at(ops, i), avg) if n else avg
    return var, g.pointwise(node, total.size, stored, mean), n


@register_lowering(aten.var.correction)
def lower_var(g, node, x, dim=None, *, correction=None, keepdim=False):
    return _variance(g, node, x, dim, correction, keepdim, _out(node)[1])[0]


@register_lowering(aten.var_mean.correction)
def lower_var_mean(g, node, x, dim=None, *, correction=None, keepdim=False):
    out_dtype = node.meta["val"][0].dtype
    var, kept, n = _variance(g, node, x, dim, correction, keepdim, out_dtype)
    g.realize(var)
    size = var.size
    ml = kept.make_loader() if keepdim else View(kept, size, ir.reshape_reindex(kept.size, size)).make_loader()
    mean = g.pointwise(node, size, out_dtype, lambda ops, i: ml(ops, i))
    g.realize(mean)
    return (var, mean)


@register_lowering(aten._unsafe_masked_index_put_accumulate)
def lower_masked_index_put_accumulate(g, node, x, mask, indices, values):
    """The embedding gradient's scatter (embedding_dense_backward decomposes to a zero-filled
    [vocab, hidden] buffer and this op). aten's op clones `x` (a whole extra read and write of
    94 MB for BERT) before it accumulates; when `x` is a value this graph computes and only this
    node reads (the zero fill), it is realized into a buffer of its own and accumulated into in
    place: `index_put_(buffer, clamped indices, where(mask, values, 0), accumulate=True)`, an
    aten call that mutates the buffer (what aten's op computes, without the copy). Otherwise
    (an input, a view, a value read elsewhere) the op runs through aten as before."""
    src = node.args[0]
    if (len(src.users) != 1 or src in g.output_nodes or any(i is None for i in indices)
            or not (isinstance(x, StorageBox) or isinstance(x, ComputedBuffer)) or not len(x.size)):
        raise NotImplementedError("accumulates into a value read elsewhere: aten copies it")
    buf = g.realize(x)
    size, dtype = tuple(values.size), x.dtype
    keep = operand(mask, size, torch.bool)
    vl = operand(values, size, dtype)
    def accumulated(ops, i):
        return ops.where(keep(ops, i), vl(ops, i), ops.constant(0, dtype))
    bug = g.config.inject_bug
    if bug is not None and optable.op_matches(bug[0], node.target):
        accumulated = _inject(accumulated, bug[1], node)   # the values it adds are what it computes
    masked = g.realize(g.pointwise(node, size, dtype, accumulated, (mask, values)))
    clamped = []
    for d, ix in enumerate(indices):
        il, n = ix.make_loader(), ir.as_size(x.size[d])
        # aten's op clamps indices into range (masked-off rows may hold any index)
        clamped.append(g.realize(g.pointwise(node, ix.size, torch.int64, lambda ops, i, il=il, n=n: ops.minimum(
            ops.maximum(ops.to_dtype(il(ops, i), torch.int64), ops.constant(-n, torch.int64)),
            ops.constant(n - 1, torch.int64)), (ix,))))
    kernel = ExternKernel(g.new_name(), aten.index_put_.default, (buf, clamped, masked, True), {}, node,
                          [buf, *clamped, masked])
    kernel.mutated = [buf]
    g.operations.append(kernel)
    zero = src.op == "call_function" and src.target is aten.full.default and src.args[1] == 0
    if zero and node not in g.output_nodes:
        _ZERO_SCATTERS.setdefault(g, {})[node] = kernel
    return buf


# per graph being lowered: accumulating scatters into a zero fill (FX node -> their index_put_),
# which a following add may retarget onto the other operand's buffer (lower_add)
_ZERO_SCATTERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_lower_add_row = LOWERINGS[aten.add.Tensor]


@register_lowering(aten.add.Tensor)
def lower_add(g, node, a, b, *, alpha=1):
    """add's pointwise row, except for `add(A, S)` where S scattered into a zero fill (BERT's tied
    word-embedding gradient: the decoder's mm result plus the embedding's scatter, 94 MB each).
    When A's buffer is exclusively this add's (see _owned_storage), the scatter accumulates into
    A's buffer in place and the add is that buffer: no zero fill, no add pass. (Rounding: A + v1
    + v2 instead of A + (v1 + v2), within float32 summation error like any reordering.)"""
    scatters = _ZERO_SCATTERS.get(g, {})
    for s_node, other, value in ((node.args[1], node.args[0], a), (node.args[0], node.args[1], b)):
        kernel = scatters.get(s_node) if isinstance(s_node, torch.fx.Node) else None
        owned = _owned_storage(g, node, other, value) if kernel is not None and alpha == 1 else None
        if owned is None or len(s_node.users) != 1:
            continue
        target, pos = owned
        if pos > g.operations.index(kernel):
            continue   # A is computed after the scatter ran
        zeros = kernel.args[0]
        kernel.args = (target, *kernel.args[1:])
        kernel.inputs = [target if x is zeros else x for x in kernel.inputs]
        kernel.mutated = [target]
        del scatters[s_node]
        return value
    return _lower_add_row(g, node, a, b, alpha=alpha)


def _owned_storage(g, add, other, value):
    """(buffer, its position in g.operations) when `value` (FX node `other`, an operand of `add`)
    is a whole buffer that nothing but `add` reads: `other` reaches its producer through views
    only, every node on the way has that one user and is no graph output, the producer is an
    aten call or a kernel of this graph (not an input), and `value` has the add's size, dtype and
    the buffer's own layout. Else None."""
    out = add.meta.get("val")
    if (not isinstance(other, torch.fx.Node) or g.config.inject_bug is not None or value.storage() is None
            or not isinstance(out, torch.Tensor) or tuple(value.size) != tuple(out.shape) or value.dtype != out.dtype):
        return None
    buffer, layout = value.storage()
    if not isinstance(buffer, (ExternBuffer, ComputedBuffer)) or layout != buffer.layout:
        return None
    n = other
    while True:
        if len(n.users) != 1 or n in g.output_nodes or n.op != "call_function":
            return None
        if getattr(n.target, "overloadpacket", None) not in VIEW_REINDEX:
            break
        n = n.args[0]
    if isinstance(buffer, ExternBuffer):
        producer = buffer.kernel
        if producer.node is not n or producer.outputs != [buffer]:
            return None
    else:
        producer = buffer
        if n not in buffer.origins:
            return None
    return buffer, g.operations.index(producer)


@register_lowering(aten.scatter.value)
def lower_scatter_one_hot(g, node, x, dim, index, value):
    """scatter(x, dim, index, value) with one index per row (index has extent 1 along `dim`
    and x's extent elsewhere: the NLL/cross-entropy backward's one-hot of the targets) as a
    pointwise: out[.., j, ..] = j == index[.., 0, ..] ? value : x[.., j, ..]. It fuses with its
    neighbours instead of a zero fill, aten's copy of it and a scatter. The indices are checked
    first in a small buffer of their own (an index outside [0, size) fails the kernel, as aten's
    scatter raises), so the large loop reads them without a bounds check and vectorizes."""
    size, dtype = _out(node)
    nd = len(size)
    dim = dim % nd if nd else 0
    if (not nd or len(index.size) != nd or not ir.same(index.size[dim], 1) or index.dtype != torch.int64
            or any(not ir.same(index.size[d], size[d]) for d in range(nd) if d != dim)):
        raise NotImplementedError("scatter.value with several indices per row")
    n, il = ir.as_size(size[dim]), index.make_loader()

    def checked(ops, i):
        raw = il(ops, i)
        # a negative index is out of range for scatter (no wrap-around): map it past the end
        raw = ops.where(ops.lt(raw, ops.constant(0, torch.int64)), ops.constant(n, torch.int64), raw)
        return ops.index_expr(ops.indirect_indexing(raw, n), torch.int64)
    target = g.realize(g.pointwise(node, index.size, torch.int64, checked, (index,)))
    tl, xl = target.make_loader(), operand(x, size, dtype)

    def fn(ops, i):
        at = ops.index_expr(i[dim], torch.int64)
        hit = ops.eq(at, tl(ops, [*i[:dim], sympy.Integer(0), *i[dim + 1:]]))
        return ops.where(hit, ops.constant(value, dtype), xl(ops, i))
    return g.pointwise(node, size, dtype, fn, (x, index))
