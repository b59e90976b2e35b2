"""tdbg's loop IR.

Values produced by lowering (all `IRNode`s, each with `size` and `dtype`):
- `InputBuffer`, `ComputedBuffer`, `ExternBuffer`: storage with a `FixedLayout`.
- `Pointwise` / `Reduction`: loop bodies. `inner_fn(ops, index)` (reductions:
  `inner_fn(ops, index, rindex)`) computes one element; `index` is a list of sympy expressions,
  `ops` is the op handler passed EXPLICITLY (codegen, dependency analysis and the IR printer
  are three handlers over the same bodies).
- `StorageBox`: an unrealized Pointwise that lowering may inline into its consumers or realize
  into a ComputedBuffer.
- `ReinterpretView` (a strided window on a buffer) and `View` (an index remap over any value):
  views never copy.
- `ExternKernel`: a call to an aten op in the wrapper.

`make_loader()` returns `load(ops, index) -> value` for any node.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable, Optional

import sympy
import sympy.tensor.tensor  # noqa: F401  (see below)
import torch

# sympy's Add.flatten imports sympy.tensor.tensor (0.2-0.4 s: it builds combinatorics tables at
# import) on the first sum of two symbolic terms, i.e. inside the first real graph's compile;
# importing it with the IR makes it part of the compiler's one-off start-up instead.


class FloorDiv(sympy.Function):
    """Integer floor division of non-negative index expressions."""
    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if a == 0:
            return sympy.Integer(0)


class ModIndex(sympy.Function):
    """Integer remainder of non-negative index expressions."""
    nargs = 2

    @classmethod
    def eval(cls, a, b):
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))


# ---- symbolic sizes ---------------------------------------------------------------------------
# A graph with symbolic (backed) shapes compiles once: sizes, strides and loop bounds are sympy
# expressions over the kernel size symbols ks0, ks1, ... (one per ShapeEnv symbol of the graph's
# inputs), which the kernels take as int64_t arguments and the wrapper reads from the inputs at
# call time. Heuristics (parallelism, chunking, memory order) use the example inputs' values
# (`hint`); the generated code never depends on them: a decision that would be wrong for another
# size raises SymbolicUnsupported and compile_aten falls back to per-signature compilation.


# ShapeEnv's integer functions in size expressions (a view's -1 over a symbolic dim gives
# FloorDiv(s0, 12)), by class name: the operands are non-negative sizes, where C++'s / and %
# are Python's // and %
FLOOR_DIVS = ("FloorDiv", "CleanDiv")
REMAINDERS = ("Mod", "PythonMod")


def cexpr(e) -> str:
    """sympy index or size expression -> C++ (int64 arithmetic; indices are non-negative; size symbols
    ks<i> are the kernel's int64_t arguments)."""
    return render_int(e, "/")


def render_int(e, div: str) -> str:
    """An integer expression of non-negative terms as source text with `div` as floor division
    ("/" in C++, "//" in Python: equal on non-negative operands); NotImplementedError for others."""
    e = sympy.sympify(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    args = [render_int(a, div) for a in e.args]
    name = type(e).__name__
    if isinstance(e, FloorDiv) or name in FLOOR_DIVS:
        return f"({args[0]} {div} {args[1]})"
    if isinstance(e, ModIndex) or name in REMAINDERS:
        return f"({args[0]} % {args[1]})"
    if name == "ModularIndexing":   # (a // b) % c
        return f"(({args[0]} {div} {args[1]}) % {args[2]})"
    if e.is_Add or e.is_Mul:
        return "(" + (" + " if e.is_Add else "*").join(args) + ")"
    if e.is_Pow and e.exp.is_Integer and 1 < int(e.exp) <= 4:   # ks0*ks0 after expansion
        return "(" + "*".join([args[0]] * int(e.exp)) + ")"
    raise NotImplementedError(f"index expression {e}")


def csize(x) -> str:
    """A size in C++: an int as itself, a symbolic size through cexpr (never Python's str, whose
    `//` would start a C++ comment)."""
    return cexpr(x) if isinstance(x, sympy.Basic) else str(x)


def _exact_divisions(expr):
    """`expr` with each ShapeEnv floor division whose quotient is a polynomial (s0**2 // s0)
    replaced by that quotient, so equal sizes compare equal."""
    def exact(e):
        q = sympy.cancel(e.args[0] / e.args[1])
        return q if q.is_polynomial() and sympy.denom(q) == 1 else e
    return expr.replace(lambda e: type(e).__name__ in FLOOR_DIVS, exact)


class SymbolicUnsupported(Exception):
    """A lowering or planning step that cannot be done for symbolic sizes (the reason)."""


UNBACKED_HINT = 4096   # what heuristics assume a data-dependent size is (Inductor's fallback is 8192)


class ShapeSymbols:
    """The kernel size symbols of one compilation: ShapeEnv symbol -> ks<i>, their hints, and
    where the wrapper reads each one at call time (`sources`: ks symbol -> (name, kind, dim) with
    kind "size", "stride" or "scalar" of a placeholder, read on entry, or "output": the size of
    an extern call's output, read right after that call: a data-dependent size)."""

    def __init__(self, expr_of=None, replace=None, hint_of=None):
        # torch_compat's accessors of a SymInt's expression and of its ShapeEnv
        self.expr_of, self.replace, self.hint_of = expr_of, replace, hint_of
        self.symbols: dict = {}      # ShapeEnv symbol -> ks symbol
        self.hints: dict = {}        # ks symbol -> int
        self.sources: dict = {}      # ks symbol -> (placeholder or extern output name, kind, dim)
        self.unbacked: set = set()   # ks symbols of data-dependent sizes
        self.asserts: list = []      # (relation over ks symbols, message): checked by the wrapper

    def convert(self, expr):
        """A ShapeEnv expression as an expression over ks symbols (new symbols get one)."""
        if self.replace is not None:
            expr = self.replace(expr)
        for s in sorted(expr.free_symbols, key=str):
            if s not in self.symbols:
                hint = self.hint_of(s) if self.hint_of is not None else None
                # a data-dependent (unbacked) size may be 0 and has no example value: heuristics
                # plan on UNBACKED_HINT; the wrapper reads it from the output that has it
                # (sources kind "output"), or the compilation is refused there
                ks = sympy.Symbol(f"ks{len(self.symbols)}", integer=True,
                                  **({"positive": True} if hint is not None else {"nonnegative": True}))
                if hint is None:
                    self.unbacked.add(ks)
                self.symbols[s], self.hints[ks] = ks, int(hint if hint is not None else UNBACKED_HINT)
        return sympy.expand(_exact_divisions(expr.xreplace(self.symbols)))


    def relation(self, value):
        """A torch.SymBool (a comparison of sizes) as a sympy relation over ks symbols."""
        expr = sympy.sympify(self.expr_of(value))
        if expr in (sympy.true, sympy.false):
            return bool(expr)
        if not isinstance(expr, sympy.core.relational.Relational):
            raise SymbolicUnsupported(f"size condition {expr} is no comparison")
        return type(expr)(self.convert(expr.lhs), self.convert(expr.rhs))

    def add_assert(self, condition, message: str) -> None:
        """A runtime check of sizes; one that holds for every size is dropped, one that fails for
        every size is refused (the graph would always raise)."""
        if condition in (True, sympy.true):
            return None
        if condition in (False, sympy.false):
            raise SymbolicUnsupported(f"size check always fails: {message}")
        self.asserts.append((condition, message))
        return None


_SHAPES: list = []   # the ShapeSymbols of the compilation running (a stack; compiles hold Dynamo's lock)


def current_shapes():
    return _SHAPES[-1] if _SHAPES else None


class shape_scope:
    """`with shape_scope(ShapeSymbols(...)):` sizes converted and hinted in this compilation."""

    def __init__(self, shapes):
        self.shapes = shapes

    def __enter__(self):
        _SHAPES.append(self.shapes)
        return self.shapes

    def __exit__(self, *exc):
        _SHAPES.pop()


def as_size(s):
    """A size/stride/offset as tdbg's IR holds it: an int when static, else a sympy expression
    over ks symbols (a torch.SymInt is converted through the current ShapeSymbols)."""
    if isinstance(s, int):
        return s
    if isinstance(s, torch.SymInt):
        shapes = current_shapes()
        if shapes is None or shapes.expr_of is None:
            raise SymbolicUnsupported(f"symbolic size {s} outside a symbolic compilation")
        expr = sympy.sympify(shapes.expr_of(s))
        if expr.is_number:
            return int(expr)
        s = shapes.convert(expr)
    if isinstance(s, sympy.Basic):
        if s.is_Integer:
            return int(s)
        if s.is_number:
            raise SymbolicUnsupported(f"non-integer size {s}")
        return s
    return int(s)


def is_size_symbol(v) -> bool:
    """A kernel size symbol ks<i> (a loop invariant), not a loop or computed-index variable."""
    return v.is_Symbol and v.name.startswith("ks") and v.name[2:].isdigit()


def is_static(s) -> bool:
    return isinstance(s, int) or (isinstance(s, sympy.Basic) and s.is_Integer)


def hint(s) -> int:
    """The example inputs' value of a size (for heuristics only, never for generated code)."""
    if isinstance(s, int):
        return s
    s = sympy.sympify(s)
    if s.is_Integer:
        return int(s)
    shapes = current_shapes()
    value = sympy.sympify(s.xreplace(shapes.hints) if shapes is not None else s)
    if not value.is_number:
        raise SymbolicUnsupported(f"no hint for {s}")
    return int(value)


def same(a, b) -> bool:
    """a == b for every value of the size symbols (structurally, after expansion)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def index_var(prefix: str, i: int) -> sympy.Symbol:
    return sympy.Symbol(f"{prefix}{i}", integer=True, nonnegative=True)


def coefficient(expr, var):
    """The integer stride of `var` in the linear index `expr`, or None if it is not linear."""
    coef = 0
    for term in sympy.Add.make_args(sympy.expand(expr)):
        if var not in term.free_symbols:
            continue
        c = term / var
        if var in c.free_symbols or not c.is_Integer:
            return None
        coef += int(c)
    return coef


def contiguous_strides(size) -> tuple:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        s = as_size(s)
        acc = acc * (max(s, 1) if isinstance(s, int) else s)   # a symbolic size is >= 2 (Dynamo specializes 0, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class FixedLayout:
    size: tuple
    stride: tuple
    dtype: torch.dtype
    offset: int = 0

    @staticmethod
    def contiguous(size, dtype) -> "FixedLayout":
        size = tuple(as_size(s) for s in size)
        return FixedLayout(size, contiguous_strides(size), dtype, 0)

    def index(self, idx) -> sympy.Expr:
        expr = sympy.Integer(self.offset)
        for st, sz, i in zip(self.stride, self.size, idx):
            if sz != 1 and st != 0:
                expr = expr + st * i
        return expr

    def storage_numel(self) -> int:
        if any(s == 0 for s in self.size):
            return self.offset
        return self.offset + 1 + sum((sz - 1) * st for sz, st in zip(self.size, self.stride))

    def is_contiguous(self) -> bool:
        return all(same(st, c) for sz, st, c in zip(self.size, self.stride, contiguous_strides(self.size)) if sz != 1)

    def is_dense(self) -> bool:
        """Non-overlapping and covering exactly numel elements (a valid allocation layout)."""
        # ordered by the hints; the check itself is exact, so it holds for every size
        pairs = sorted(((st, sz) for sz, st in zip(self.size, self.stride) if sz != 1),
                       key=lambda p: (hint(p[0]), hint(p[1])))
        expected = 1
        for st, sz in pairs:
            if not same(st, expected):
                return False
            expected = expected * sz
        return True

    def __str__(self):
        return f"FixedLayout(size={list(self.size)}, stride={list(self.stride)}, dtype={self.dtype}, offset={self.offset})"


class IRNode:
    size: tuple
    dtype: torch.dtype

    def make_loader(self) -> Callable:
        raise NotImplementedError

    def storage(self):
        """(buffer, layout) when this value is a strided window on a buffer, else None."""
        return None

    def lazy_origins(self) -> list:
        """FX nodes of unrealized computation this value would inline into a consumer."""
        return []


class Buffer(IRNode):
    def __init__(self, name: str, layout: FixedLayout):
        self.name, self.layout = name, layout
        self.size, self.dtype = layout.size, layout.dtype

    def make_loader(self):
        name, layout = self.name, self.layout
        return lambda ops, index: ops.load(name, layout.index(index))

    def storage(self):
        return self, self.layout

    def __repr__(self):
        return f"{type(self).__name__}({self.name}, {self.layout})"


class InputBuffer(Buffer):
    pass


class ComputedBuffer(Buffer):
    def __init__(self, name, layout, data: "Loops"):
        super().__init__(name, layout)
        self.data = data
        self.origins = list(data.origins)
        # dims outermost first when the loops should follow a planned (e.g. NHWC) layout's memory
        # order instead of the logical order; None = logical order (see layout.py)
        self.loop_order = None

    def store_index(self, index) -> sympy.Expr:
        return self.layout.index(index)


class ExternBuffer(Buffer):
    """One tensor produced by an ExternKernel (`expr` is how the wrapper names it)."""

    def __init__(self, name, layout, kernel: "ExternKernel", expr: str):
        super().__init__(name, layout)
        self.kernel, self.expr = kernel, expr


@dataclass
class ExternKernel:
    """An aten call in the wrapper: `name = target(*args, **kwargs)` with IR values as tensors."""
    name: str
    target: object
    args: tuple
    kwargs: dict
    node: object                      # the FX node
    inputs: list = field(default_factory=list)   # Buffers read
    outputs: list = field(default_factory=list)  # ExternBuffers produced
    mutated: list = field(default_factory=list)  # Buffers written in place


@dataclass
class Loops:
    ranges: tuple
    dtype: torch.dtype
    inner_fn: Callable
    origins: list

    @property
    def size(self):
        return self.ranges


@dataclass
class Pointwise(Loops):
    pass


@dataclass
class Reduction(Loops):
    reduction_ranges: tuple = ()
    reduction_type: str = "sum"       # sum prod max min argmax argmin any all
    src_dtype: Optional[torch.dtype] = None


class StorageBox(IRNode):
    """A Pointwise that may stay lazy (inlined into consumers) or be realized into a buffer."""

    def __init__(self, data: Pointwise):
        self.data = data
        self.buffer: Optional[ComputedBuffer] = None
        self.size, self.dtype = tuple(data.ranges), data.dtype

    def make_loader(self):
        if self.buffer is not None:
            return self.buffer.make_loader()
        return self.data.inner_fn

    def storage(self):
        return self.buffer.storage() if self.buffer is not None else None

    def lazy_origins(self):
        return [] if self.buffer is not None else list(self.data.origins)


class ReinterpretView(IRNode):
    def __init__(self, buffer: Buffer, layout: FixedLayout):
        self.buffer, self.layout = buffer, layout
        self.size, self.dtype = layout.size, layout.dtype

    def make_loader(self):
        name, layout = self.buffer.name, self.layout
        return lambda ops, index: ops.load(name, layout.index(index))

    def storage(self):
        return self.buffer, self.layout


class View(IRNode):
    """`base` read through `reindex(out_index) -> base_index`."""

    def __init__(self, base: IRNode, size, reindex: Callable):
        self.base, self.reindex = base, reindex
        self.size, self.dtype = tuple(as_size(s) for s in size), base.dtype

    def make_loader(self):
        inner, reindex = self.base.make_loader(), self.reindex
        return lambda ops, index: inner(ops, reindex(list(index)))

    def lazy_origins(self):
        return self.base.lazy_origins()


# ---- index remaps for views over values that have no storage yet -------------------------

def broadcast_reindex(in_size, out_size) -> Callable:
    """Index into `in_size` from an index over `out_size` (PyTorch broadcasting)."""
    lead = len(out_size) - len(in_size)
    keep = [same(s, out_size[lead + i]) for i, s in enumerate(in_size)]
    if any(not k and not same(s, 1) for k, s in zip(keep, in_size)):
        raise SymbolicUnsupported(f"broadcast of {list(in_size)} to {list(out_size)}")

    def reindex(index):
        return [index[lead + i] if k else sympy.Integer(0) for i, k in enumerate(keep)]
    return reindex


def permute_reindex(dims) -> Callable:
    inverse = [0] * len(dims)
    for out_pos, d in enumerate(dims):
        inverse[d] = out_pos
    return lambda index: [index[inverse[d]] for d in range(len(dims))]


def reshape_reindex(old_size, new_size) -> Callable:
    """Linear index over `new_size`, unflattened over `old_size`, group by group."""
    old_size, new_size = [as_size(s) for s in old_size], [as_size(s) for s in new_size]
    groups, i, j = [], 0, 0
    while i < len(old_size) or j < len(new_size):
        oi, nj = i, j
        po = old_size[i] if i < len(old_size) else 1
        pn = new_size[j] if j < len(new_size) else 1
        i, j = i + (i < len(old_size)), j + (j < len(new_size))
        # groups are found on the hints and must then hold exactly (for every size)
        while hint(po) != hint(pn):
            if hint(po) < hint(pn) and i < len(old_size):
                po *= old_size[i]; i += 1
            elif j < len(new_size):
                pn *= new_size[j]; j += 1
            else:
                po *= old_size[i]; i += 1
        if not same(po, pn):
            raise SymbolicUnsupported(f"reshape of {old_size} to {new_size}: no exact dim grouping")
        groups.append((oi, i, nj, j))

    def reindex(index):
        out = [sympy.Integer(0)] * len(old_size)
        for oi, oe, ni, ne in groups:
            linear = sympy.Integer(0)
            for k in range(ni, ne):
                linear = linear * new_size[k] + index[k]
            stride = 1
            for k in reversed(range(oi, oe)):
                out[k] = ModIndex(FloorDiv(linear, stride), old_size[k]) if oe - oi > 1 else linear
                stride *= old_size[k]
        return out
    return reindex


class TextOps:
    """Op handler that writes a body as numbered statements (for ir_pre/post_fusion.txt)."""

    def __init__(self):
        self.lines, self._n = [], itertools.count()

    def _emit(self, text):
        var = f"t{next(self._n)}"
        self.lines.append(f"{var} = {text}")
        return var

    def load(self, name, index):
        return self._emit(f"load({name}, {index})")

    def constant(self, value, dtype):
        return f"{value!r}:{str(dtype).replace('torch.', '')}"

    def indirect_indexing(self, value, size):
        return sympy.Symbol(self._emit(f"indirect_indexing({value}, {size})"), integer=True)

    def masked(self, mask, body, other):
        return self._emit(f"masked({mask}, {body()}, {other})")

    def origin(self, node):
        import contextlib
        return contextlib.nullcontext()

    def inject_bug(self, kind, value, node):
        return self._emit(f"inject_bug({kind}, {value})")

    def __getattr__(self, name):
        def op(*args):
            return self._emit(f"{name}({', '.join(str(a).replace('torch.', '') for a in args)})")
        return op


def format_body(buffer: "ComputedBuffer", index, rindex=None) -> list:
    """The loop body of `buffer` as text lines over the given index variables."""
    handler = TextOps()
    data = buffer.data
    result = data.inner_fn(handler, index, rindex) if isinstance(data, Reduction) else data.inner_fn(handler, index)
    if isinstance(data, Reduction):
        handler.lines.append(f"acc = {data.reduction_type}-reduce {result} over {list(data.reduction_ranges)}")
        result = "acc"
    handler.lines.append(f"store({buffer.name}, {buffer.layout.index(index)}, {result})")
    return handler.lines
