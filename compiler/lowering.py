"""FX aten graph -> tdbg loop IR.

`GraphLowering` is an fx.Interpreter: each call_function node is looked up in LOWERINGS (filled
by `@register_lowering(...)` and by one row per pointwise op of ops.TABLE); nodes without a
lowering, with unsupported dtypes, named in `config.fallback_ops`, or beyond
`config.max_lowered_ops` become `ExternKernel`s (aten calls in the wrapper), so no graph fails
for a missing op.

Pointwise results stay lazy (a StorageBox) when their only user is itself lowered, so they are
inlined into that user's loop body (a counted "fusion"); otherwise they are realized into a
ComputedBuffer. `max_lowered_ops` and `max_fusions` are counted per process in compilation
order (see `COUNTERS`, reset with `reset_counters()`).
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx

from . import ops as optable, torch_compat
from .torch_compat import ELEMENTWISE_TYPE_PROMOTION_KIND as PROMO, pytree
from .errors import LoweringError
from .logs import get_logger
from .ir import (ComputedBuffer, ExternBuffer, ExternKernel, FixedLayout, InputBuffer, IRNode,
                 Pointwise, Reduction, ReinterpretView, StorageBox, SymbolicUnsupported, View, as_size,
                 current_shapes, hint, same)
from .lowering_common import (LOWERINGS, VIEW_REINDEX, _compute_dtype, _inject, _out, _overloads, operand,
                              register_lowering, with_origin)

aten = torch.ops.aten
prims = torch.ops.prims

log = get_logger("schedule")

# Per-process counters of counted applications (bisect reads them through report lines).
COUNTERS = {"lowered": 0, "fusions": 0}


def reset_counters() -> None:
    COUNTERS.update(lowered=0, fusions=0)


def take_fusion(config) -> int | None:
    """Index of the next accepted fusion, or None when fusion is off or the budget is spent."""
    if not config.fusion:
        return None
    if config.max_fusions is not None and COUNTERS["fusions"] >= config.max_fusions:
        return None
    COUNTERS["fusions"] += 1
    return COUNTERS["fusions"] - 1


class GraphLowering(torch.fx.Interpreter):
    """Lowers one aten graph; results: `operations` (ComputedBuffers and ExternKernels in
    program order), `graph_inputs`, `graph_outputs`, `lowered`, `fallbacks`, `fusions`."""

    def __init__(self, gm, example_inputs, config):
        super().__init__(gm)
        self.config, self.example_inputs = config, example_inputs
        self.operations, self.graph_inputs, self.graph_outputs = [], [], []
        self.buffers: dict = {}
        self.lowered, self.fallbacks, self.fusions = [], [], []
        self.lazy: list = []
        self.placeholders: list = []     # every placeholder's name, tensors or not, in order
        self._names = 0
        self._inputs = iter(example_inputs)
        self.output_nodes = set()
        self.current_node = None
        # layout.py planned some strides (pads read only by its channels_last conversion loop NHWC)
        self.planned = any(n.meta.get("tdbg_layout") for n in gm.graph.nodes)

    # -- naming and buffers ---------------------------------------------------------------
    def new_name(self) -> str:
        self._names += 1
        return f"buf{self._names - 1}"

    def register(self, buf):
        self.buffers[buf.name] = buf
        return buf

    def realize(self, x: IRNode, stride=None):
        """A Buffer (or strided window on one) holding `x`'s values."""
        if isinstance(x, StorageBox):
            if x.buffer is None:
                x.buffer = self._materialize(x.data, x.size, stride)
            return x.buffer
        if x.storage() is not None:
            return x
        data = Pointwise(tuple(x.size), x.dtype, x.make_loader(), x.lazy_origins() or [self.current_node])
        return self._materialize(data, x.size, stride)

    def _materialize(self, data, size, stride=None):
        layout = FixedLayout.contiguous(size, data.dtype)
        if stride is not None and len(stride) == len(size):   # a node's stride, not one of its partial reductions'
            cand = FixedLayout(tuple(as_size(s) for s in size), tuple(as_size(s) for s in stride), data.dtype)
            layout = cand if cand.is_dense() else layout
        buf = self.register(ComputedBuffer(self.new_name(), layout, data))
        # loops run in the buffer's memory order: a planned layout, and also strides a training
        # graph fixed (ConvNeXt's channels_last residual stream, a saved activation) — looped
        # in logical order, every store and every same-layout read was strided
        order = memory_order(layout)
        moved = [d for d in order if not same(layout.size[d], 1)]
        buf.loop_order = order if moved != sorted(moved) else None
        self.operations.append(buf)
        return buf

    def reduction_buffer(self, node, red: Reduction):
        return self._materialize(red, red.ranges, self._output_stride(node))

    def _output_stride(self, node):
        """The strides a realized `node` gets: eager's for graph outputs, the planned ones for
        nodes layout.py planned (meta tdbg_layout), else None (contiguous)."""
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return None
        if node in self.output_nodes:
            return node.meta.get("tdbg_eager_stride", val.stride())
        return val.stride() if node.meta.get("tdbg_layout") else None

    # -- interpreter ----------------------------------------------------------------------
    def run(self, *args, **kwargs):
        out = self.graph.output_node() if hasattr(self.graph, "output_node") else list(self.graph.nodes)[-1]
        self.output_nodes = {n for n in out.all_input_nodes}
        return super().run(*args, **kwargs)

    def placeholder(self, target, args, kwargs):
        example = next(self._inputs)
        name = self.current_node.name
        self.placeholders.append(name)
        shapes = current_shapes()
        if not isinstance(example, torch.Tensor):
            if isinstance(example, torch.SymInt):
                return self._sized(as_size(example), name, "scalar", 0)
            if isinstance(example, (torch.SymFloat, torch.SymBool)) or shapes is not None:
                raise SymbolicUnsupported(f"input {name} is a Python {type(example).__name__} (value {example})")
            return example
        layout = FixedLayout(tuple(self._sized(as_size(s), name, "size", d) for d, s in enumerate(example.shape)),
                             tuple(self._sized(as_size(s), name, "stride", d) for d, s in enumerate(example.stride())),
                             example.dtype)
        buf = self.register(InputBuffer(self.current_node.name, layout))
        self.graph_inputs.append(buf)
        return buf

    @staticmethod
    def _sized(value, name, kind, dim):
        """`value` (a size, stride or scalar of input `name`); a new symbol is read there at run time."""
        shapes = current_shapes()
        if shapes is not None and isinstance(value, sympy.Symbol):
            shapes.sources.setdefault(value, (name, kind, dim))
        return value

    def get_attr(self, target, args, kwargs):
        value = super().get_attr(target, args, kwargs)
        if not isinstance(value, torch.Tensor):
            return value
        layout = FixedLayout(tuple(value.shape), tuple(value.stride()), value.dtype)
        buf = self.register(InputBuffer(self.current_node.name, layout))
        buf.constant = value
        self.graph_inputs.append(buf)
        return buf

    def run_node(self, n):
        self.current_node = n
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        node = self.current_node
        val = node.meta.get("val")
        if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool) and current_shapes() is not None:
            return as_size(val)   # size arithmetic (sym_size, mul, ...): an expression over the size symbols
        if target in RUNTIME_ASSERTS and current_shapes() is not None:
            return current_shapes().add_assert(args[0], args[1] if len(args) > 1 else "")
        if isinstance(val, torch.SymBool) and _only_asserted(node) and current_shapes() is not None:
            return current_shapes().relation(val)
        if isinstance(val, (torch.SymFloat, torch.SymBool)):
            raise SymbolicUnsupported(f"{node.name} computes a symbolic {type(val).__name__}")
        if target is operator.getitem:
            return args[0][args[1]]
        if self.should_lower(node):
            index = COUNTERS["lowered"]
            COUNTERS["lowered"] += 1
            try:
                result = LOWERINGS[target](self, node, *args, **kwargs)
            except NotImplementedError:
                COUNTERS["lowered"] -= 1
                return self.fallback(node, args, kwargs)
            except SymbolicUnsupported:
                raise
            except Exception as e:
                raise lowering_error(node, f"lowering {target} failed: {type(e).__name__}: {e}") from e
            self.lowered.append({"index": index, "fx_node": node.name, "target": str(target)})
            result = self._after_lowering(node, result)
            return result
        return self.fallback(node, args, kwargs)

    def output(self, target, args, kwargs):
        flat, spec = pytree.tree_flatten(args[0])
        nodes = pytree.tree_flatten(self.current_node.args[0])[0]
        for value, fx in zip(flat, nodes):
            if isinstance(value, (StorageBox, View)) or (isinstance(value, IRNode) and value.storage() is None):
                value = self.realize(value, self._output_stride(fx) if isinstance(fx, torch.fx.Node) else None)
            elif isinstance(fx, torch.fx.Node) and "tdbg_eager_stride" in fx.meta and isinstance(value, IRNode):
                # an aten call produced it in the planned layout: the output gets eager's strides
                if tuple(value.storage()[1].stride) != tuple(fx.meta["tdbg_eager_stride"]):
                    data = Pointwise(tuple(value.size), value.dtype, value.make_loader(), [fx])
                    value = self._materialize(data, value.size, fx.meta["tdbg_eager_stride"])
            self.graph_outputs.append(value)
        self.output_spec = spec
        return None

    # -- lowering decisions -----------------------------------------------------------------
    def should_lower(self, node) -> bool:
        target = node.target
        if target not in LOWERINGS:
            return False
        if any(optable.op_matches(spec, target) for spec in self.config.fallback_ops):
            return False
        if self.config.max_lowered_ops is not None and COUNTERS["lowered"] >= self.config.max_lowered_ops:
            return False
        return all(t.dtype in optable.SUPPORTED_DTYPES and t.device.type == "cpu" and t.layout == torch.strided
                   for t in _tensors_of(node))

    def _user_inlines(self, user) -> bool:
        """Will `user` be lowered (and so read a lazy input through its loader)?"""
        return user.op == "call_function" and user.target is not operator.getitem and self.should_lower(user)

    def _users_through_views(self, node) -> list:
        """The nodes that read `node`'s values, looking through the lowered view ops in between:
        a view of a lazy value is an index remap over it (no storage), so each reader of the view
        would recompute the value (and an aten reader would copy it out) unless the value itself
        is realized once. A view that is a graph output counts as a reader of its own; a node
        reached through two paths counts twice (it would read the value at two indices)."""
        users = []
        for user in node.users:
            if (user.op == "call_function" and getattr(user.target, "overloadpacket", None) in VIEW_REINDEX
                    and user not in self.output_nodes and self.should_lower(user)):
                users += self._users_through_views(user)
            else:
                users.append(user)
        return users

    def _converging_sink(self, node, users, depth=4):
        """The one lowered node all of `node`'s readers flow into, when each reader reaches it
        through a chain (at most `depth` long) of lowered same-shape nodes with a single reader
        each, e.g. SiLU's x * sigmoid(x) or GELU's x * 0.5 * (1 + erf(x / sqrt(2))); else None.
        The chain may reshape (as many elements: a linear's [B*S, N] output viewed [B, S, N]).
        Only when the sink has another shape than `node`, or goes on, lazily, into a reader of
        another shape (a pad of the SiLU): then `node` stays lazy, the sink's loop evaluates it
        at one index on every path (the kernel's common-subexpression cache computes it once),
        and no buffer is written for it; realized, it took a round trip through memory, since the
        scheduler cannot fuse loops of different ranges (Swin's bias add, then GELU on its 3-d
        view). When the sink keeps `node`'s shape the scheduler fuses the realized value into the
        sink's loop anyway."""
        shape = getattr(node.meta.get("val"), "shape", None)
        numel = lambda n: getattr(n.meta.get("val"), "numel", lambda: None)()   # noqa: E731

        def path(u):
            nodes = [u]
            while len(nodes) <= depth and len(u.users) == 1 and u not in self.output_nodes \
                    and self._user_inlines(u) and numel(u) == numel(node):
                u = next(iter(u.users))
                nodes.append(u)
            return nodes
        if shape is None or len(set(users)) != len(users):
            return None
        paths = [path(u) for u in users]
        sink = next((c for c in paths[0] if all(c in p for p in paths) and self._user_inlines(c)), None)
        if sink is None or len(sink.users) != 1 or sink in self.output_nodes:
            return None
        after = next(iter(sink.users))
        reshaped = getattr(sink.meta.get("val"), "shape", None) != shape or \
            self._user_inlines(after) and getattr(after.meta.get("val"), "shape", None) != shape
        return sink if reshaped else None

    def _after_lowering(self, node, result):
        if not isinstance(result, StorageBox):
            return result
        result.data.origins = _unique([node] + [o for o in result.data.origins if o is not node])
        bug = self.config.inject_bug
        if bug is not None and optable.op_matches(bug[0], node.target):
            result.data.inner_fn = _inject(result.data.inner_fn, bug[1], node)
        users = self._users_through_views(node)
        sink = self._converging_sink(node, users) if len(users) > 1 else None
        users = [sink] if sink is not None else users
        keep_lazy = (len(users) == 1 and self._user_inlines(users[0]) and node not in self.output_nodes
                     and len(result.data.origins) < self.config.max_fusion_size)
        fusion = take_fusion(self.config) if keep_lazy else None
        if fusion is None:
            buf = self.realize(result, self._output_stride(node))
            log.debug("realize %s as %s: %s", node.name, buf.name, "not inlined" if keep_lazy else
                      f"{len(users)} user(s), output={node in self.output_nodes}")
        else:
            log.info("inline %s into %s (pointwise with a single lowered user)", node.name, users[0].name)
            self.fusions.append({"index": fusion, "nodes": [o.name for o in result.data.origins] + [users[0].name],
                                 "node": users[0].name})
            self.lazy.append(result)
        return result

    # -- building blocks used by lowerings ----------------------------------------------------
    def pointwise(self, node, size, dtype, fn, inputs=()) -> StorageBox:
        origins = [node] + [o for x in inputs if isinstance(x, IRNode) for o in x.lazy_origins()]
        return StorageBox(Pointwise(tuple(as_size(s) for s in size), dtype, with_origin(node, fn), _unique(origins)))

    def fallback(self, node, args, kwargs):
        """Run `node` through aten in the wrapper."""
        mutating = getattr(getattr(node.target, "_schema", None), "is_mutable", False)
        if mutating:
            for box in self.lazy:
                self.realize(box)

        def ref(x):
            if isinstance(x, IRNode):
                return self.realize(x)
            return x
        args = pytree.tree_map(ref, args)
        kwargs = pytree.tree_map(ref, kwargs)
        inputs = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, IRNode)]
        kernel = ExternKernel(self.new_name(), node.target, args, kwargs, node, inputs)
        if mutating:
            kernel.mutated = [_storage_buffer(a) for a, arg in zip(args, node.target._schema.arguments)
                              if isinstance(a, IRNode) and arg.alias_info is not None and arg.alias_info.is_write]
        self.operations.append(kernel)
        self.fallbacks.append({"fx_node": node.name, "target": str(node.target)})
        return self._extern_outputs(kernel, node.meta.get("val"), kernel.name)

    def _extern_outputs(self, kernel, val, expr):
        if isinstance(val, torch.Tensor):
            layout = FixedLayout(tuple(map(as_size, val.shape)), tuple(map(as_size, val.stride())), val.dtype)
            name = kernel.name if expr == kernel.name else f"{kernel.name}_{len(kernel.outputs)}"
            shapes = current_shapes()
            for d, size in enumerate(layout.size):   # a data-dependent size is known once this runs
                if shapes is not None and size in shapes.unbacked:
                    shapes.sources.setdefault(size, (name, "output", d))
            buf = self.register(ExternBuffer(name, layout, kernel, expr))
            kernel.outputs.append(buf)
            return buf
        if isinstance(val, (list, tuple)):
            return type(val)(self._extern_outputs(kernel, v, f"{expr}[{i}]") for i, v in enumerate(val))
        return val


# Dynamo's runtime checks on sizes (its range asserts on data-dependent sizes, u0 >= 0, and the
# user's torch._check on sizes): the wrapper checks each once its sizes are read (ShapeSymbols.asserts)
RUNTIME_ASSERTS = {torch.ops.aten._assert_scalar.default}


def _only_asserted(node) -> bool:
    """A SymBool node whose every user is a runtime assert."""
    return bool(node.users) and all(u.target in RUNTIME_ASSERTS for u in node.users)


def memory_order(layout) -> tuple:
    """Dims of `layout` from the largest stride to the smallest (ties keep logical order)."""
    return tuple(sorted(range(len(layout.size)), key=lambda d: -hint(layout.stride[d])))


def _storage_buffer(x):
    st = x.storage()
    return st[0] if st else x


def _unique(seq):
    return list(dict.fromkeys(seq))


def _tensors_of(node):
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return [t for t in pytree.tree_leaves(vals) if isinstance(t, torch.Tensor)]


def lowering_error(node, message):
    """The error for a node that could not be lowered and could not fall back."""
    shapes = [f"{tuple(a.meta['val'].shape)}:{a.meta['val'].dtype}" for a in node.all_input_nodes
              if isinstance(a.meta.get("val"), torch.Tensor)]
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    source = "\n".join(trace[-2:]) if trace else ""
    return LoweringError(message, node=node.name, target=str(node.target), inputs=shapes, source=source)


# ---- elementwise lowerings beyond the pointwise table's rows (lowering_common.lower_row) -----

@register_lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def lower_where(g, node, cond, a, b):
    size, out_dtype = _out(node)
    loaders = [operand(cond, size, torch.bool), operand(a, size, out_dtype), operand(b, size, out_dtype)]
    return g.pointwise(node, size, out_dtype, lambda ops, i: ops.where(*[l(ops, i) for l in loaders]), (cond, a, b))


@register_lowering(aten.clamp, aten.clamp_min, aten.clamp_max)
def lower_clamp(g, node, x, lo=None, hi=None):
    size, out_dtype = _out(node)
    if node.target in _overloads(aten.clamp_max):
        lo, hi = None, lo
    bounds = [(op, operand(v, size, out_dtype)) for op, v in (("maximum", lo), ("minimum", hi)) if v is not None]
    load = operand(x, size, out_dtype)

    def fn(ops, index):
        v = load(ops, index)
        for op, bound in bounds:
            v = getattr(ops, op)(v, bound(ops, index))
        return v
    return g.pointwise(node, size, out_dtype, fn, (x, lo, hi))


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def lower_div_mode(g, node, a, b, *, rounding_mode=None):
    size, out_dtype = _out(node)
    op = {None: "div", "trunc": "truncdiv", "floor": "floordiv"}[rounding_mode]
    compute = _compute_dtype((a, b), PROMO.DEFAULT if rounding_mode else PROMO.INT_TO_FLOAT)
    la, lb = operand(a, size, compute), operand(b, size, compute)
    return g.pointwise(node, size, out_dtype,
                       lambda ops, i: ops.to_dtype(getattr(ops, op)(la(ops, i), lb(ops, i)), out_dtype), (a, b))


@register_lowering(prims.convert_element_type, aten._to_copy, aten.clone, aten.copy, aten.lift_fresh_copy)
def lower_copy(g, node, x, *rest, dtype=None, layout=None, device=None, pin_memory=None,
               memory_format=None, non_blocking=False):
    if device is not None and torch.device(device).type != "cpu" or layout not in (None, torch.strided):
        raise NotImplementedError("copy across devices or layouts")
    size, out_dtype = _out(node)
    src = rest[0] if node.target in _overloads(aten.copy) else x
    load = operand(src, size, out_dtype)
    return g.pointwise(node, size, out_dtype, load, (src,))


@register_lowering(aten.full, aten.scalar_tensor, aten.full_like)
def lower_full(g, node, *args, **kwargs):
    size, out_dtype = _out(node)
    value = args[-1]
    return g.pointwise(node, size, out_dtype, lambda ops, i: ops.constant(value, out_dtype))


@register_lowering(aten.arange, prims.iota)
def lower_arange(g, node, *args, **kwargs):
    size, out_dtype = _out(node)
    if node.target in _overloads(prims.iota):
        start, step = kwargs.get("start", args[1] if len(args) > 1 else 0), kwargs.get("step", args[2] if len(args) > 2 else 1)
    else:
        nums = [a for a in args if isinstance(a, (int, float))]
        start, step = (nums[0] if len(nums) > 1 else 0), (nums[2] if len(nums) > 2 else kwargs.get("step", 1))
    compute = torch.float64 if out_dtype.is_floating_point else torch.int64

    def fn(ops, index):
        i = ops.index_expr(index[0], compute)
        v = ops.add(ops.mul(i, ops.constant(step, compute)), ops.constant(start, compute))
        return ops.to_dtype(v, out_dtype)
    return g.pointwise(node, size, out_dtype, fn)


# ---- views: strided windows on buffers when possible, index remaps (VIEW_REINDEX) otherwise ---

def _strided_meta(layout):
    base = torch.empty(max(layout.storage_numel(), 1), dtype=layout.dtype, device="meta")
    return base.as_strided(layout.size, layout.stride, layout.offset)


def _static_layout(layout) -> bool:
    return all(isinstance(s, int) for s in (*layout.size, *layout.stride, layout.offset))


def _symbolic_window(node, layout):
    """The FixedLayout of view `node` over a buffer of symbolic `layout`: the fake tensors'
    own view (sizes, strides, offset), when the input's fake layout is exactly `layout`."""
    src, out = node.args[0].meta.get("val"), node.meta.get("val")
    if not (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor)):
        return None
    mine = (tuple(map(as_size, src.shape)), tuple(map(as_size, src.stride())))
    if len(mine[0]) != len(layout.size) or not all(
            same(a, b) for a, b in zip((*mine[0], *mine[1]), (*layout.size, *layout.stride))):
        return None
    try:
        alias = torch_compat.is_alias_of(out, src)
    except Exception:
        alias = False
    if not alias:
        return None
    offset = as_size(out.storage_offset()) - as_size(src.storage_offset()) + layout.offset
    return FixedLayout(tuple(map(as_size, out.shape)), tuple(map(as_size, out.stride())), layout.dtype,
                       as_size(offset))


def lower_view(g, node, x, *args, **kwargs):
    """A ReinterpretView when `x` lives in a buffer and aten's own view gives a window on it;
    otherwise a View whose reindex maps output indices to `x`'s indices."""
    size, _ = _out(node)
    reindex = VIEW_REINDEX[node.target.overloadpacket]
    if reindex is None:
        # as_strided addresses the storage: only ours (offset 0) is known at compile time
        x = g.realize(x)
        if not isinstance(x.storage()[0], ComputedBuffer):
            raise NotImplementedError("as_strided of a tensor whose storage offset is known only at run time")
    st = x.storage()
    if st is not None and not _static_layout(st[1]):
        window = _symbolic_window(node, st[1])
        if window is not None:
            return ReinterpretView(st[0], window)
    elif st is not None:
        buf, layout = st
        m = _strided_meta(layout)
        try:
            out = node.target(m, *args, **kwargs)
        except RuntimeError:
            out = None
        if out is not None and torch_compat.is_alias_of(out, m):
            return ReinterpretView(buf, FixedLayout(tuple(out.shape), tuple(out.stride()), layout.dtype,
                                                    out.storage_offset()))
        # a static buffer viewed with symbolic sizes (expand of a [1, 1] input to [ks0, ks1]): the
        # meta tensor above cannot take them; the fake tensors' own view can. Copied instead, an
        # output that aliases an input was no alias, and AOTAutograd's replay of it failed.
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not all(isinstance(d, int) for d in (*val.shape, *val.stride())):
            window = _symbolic_window(node, layout)
            if window is not None:
                return ReinterpretView(buf, window)
    if reindex is None:
        raise NotImplementedError("as_strided on a non-strided value")
    return View(x, size, reindex(x, size, *args, **kwargs))


for _packet in VIEW_REINDEX:
    register_lowering(_packet)(lower_view)


# The other lowering modules register their lowerings in LOWERINGS when imported: imported here so
# that importing this module gives the whole table, and last so that their rows follow this
# module's in the table's order (as they always have).
from . import lowering_reductions  # noqa: E402,F401
from . import lowering_data  # noqa: E402,F401  (cat, pad, embedding, gather, index_select)
from . import lowering_random  # noqa: E402,F401  (random ops generated in kernels)
from . import lowering_index  # noqa: E402,F401  (index.Tensor)
from . import lowering_shape  # noqa: E402,F401  (empty factories, rev, diagonal)
from . import lowering_scan  # noqa: E402,F401  (cumsum, cumprod)
from . import lowering_math  # noqa: E402,F401  (round.decimals)
from . import lowering_pool  # noqa: E402,F401  (avg_pool2d)
