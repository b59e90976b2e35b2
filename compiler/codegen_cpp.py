"""C++/OpenMP code generation: one `extern "C"` function per KernelGroup.

A kernel is `int name(const T* in_ptr0, ..., T* out_ptr0, ...)` returning 0, or 1 + the index
of the entry of `status_nodes` that failed (injected runtime error, index out of bounds).
Loop structure: the group's outer loops (OpenMP over the outermost ones when the work is at
least `config.min_chunk_size` elements), then each node's statements in order; a reduction
opens its own inner loops with a private accumulator. `LoopNest` renders loops separately from
bodies so vectorization can later replace the innermost loop with a vector loop plus a tail.

`CppOps` is the op handler the IR bodies call: every op becomes one typed C++ temporary
(common subexpressions reuse it), and the first statement of each FX node's group is preceded
by `// FX: <node line>`.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import sympy
import torch

from . import ops as optable
from .ir import FloorDiv, ModIndex
from .ops import CPP_TYPES, TABLE, HELPER_SPELLINGS
from .trace import get_logger

log = get_logger("schedule")


def cexpr(e) -> str:
    """sympy index expression -> C++ (int64 arithmetic; indices are non-negative)."""
    e = sympy.sympify(e)
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return e.name
    if isinstance(e, FloorDiv):
        return f"({cexpr(e.args[0])} / {cexpr(e.args[1])})"
    if isinstance(e, ModIndex):
        return f"({cexpr(e.args[0])} % {cexpr(e.args[1])})"
    if e.is_Add:
        return "(" + " + ".join(cexpr(a) for a in e.args) + ")"
    if e.is_Mul:
        return "(" + "*".join(cexpr(a) for a in e.args) + ")"
    raise NotImplementedError(f"index expression {e}")


def cpp_type(dtype) -> str:
    return CPP_TYPES[dtype]


def constant(value, dtype) -> str:
    t = cpp_type(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}std::numeric_limits<{t}>::infinity()"
        return f"static_cast<{t}>({value!r})"
    value = int(value)
    if value == -(2 ** 63):
        return "std::numeric_limits<int64_t>::lowest()"
    return f"static_cast<{t}>({value}LL)"


def fx_line(node) -> str:
    def fmt(a):
        if hasattr(a, "name") and hasattr(a, "op"):
            return a.name
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(fmt(x) for x in a) + "]"
        return repr(a)
    args = [fmt(a) for a in node.args] + [f"{k} = {fmt(v)}" for k, v in node.kwargs.items()]
    return f"{node.name} = torch.ops.{node.target}({', '.join(args)})"


@dataclass(frozen=True)
class CppVar:
    name: str
    dtype: torch.dtype

    def __str__(self):
        return self.name


class Block:
    """Lines of one C++ scope with its common-subexpression cache (inherits the parent's)."""

    def __init__(self, parent=None):
        self.parent, self.lines, self.cache, self.last_origin = parent, [], {}, None

    def lookup(self, expr):
        b = self
        while b is not None:
            if expr in b.cache:
                return b.cache[expr]
            b = b.parent
        return None


REDUCTION_INIT = {
    "sum": lambda t, d: "0", "prod": lambda t, d: "1",
    "max": lambda t, d: "false" if d == torch.bool else (f"-std::numeric_limits<{t}>::infinity()" if d.is_floating_point else f"std::numeric_limits<{t}>::lowest()"),
    "min": lambda t, d: "true" if d == torch.bool else (f"std::numeric_limits<{t}>::infinity()" if d.is_floating_point else f"std::numeric_limits<{t}>::max()"),
    "any": lambda t, d: "false", "all": lambda t, d: "true",
}
REDUCTION_COMBINE = {
    "sum": "{acc} = {acc} + static_cast<{t}>({v});",
    "prod": "{acc} = {acc} * static_cast<{t}>({v});",
    "max": "{acc} = tdbg_maximum({acc}, static_cast<{t}>({v}));",
    "min": "{acc} = tdbg_minimum({acc}, static_cast<{t}>({v}));",
    "any": "{acc} = {acc} || static_cast<bool>({v});",
    "all": "{acc} = {acc} && static_cast<bool>({v});",
    "argmax": "if (tdbg_arg_better_max({v}, {acc})) {{ {acc} = {v}; {acc}_idx = {ridx}; }}",
    "argmin": "if (tdbg_arg_better_min({v}, {acc})) {{ {acc} = {v}; {acc}_idx = {ridx}; }}",
}


def accumulator_dtype(rtype, out_dtype, src_dtype):
    if rtype in ("argmax", "argmin"):
        return src_dtype
    if rtype in ("sum", "prod") and out_dtype.is_floating_point:
        return torch.float64
    return out_dtype


class CppKernel:
    """Generates one kernel function for a KernelGroup."""

    def __init__(self, name, group, buffers, config):
        self.name, self.group, self.buffers, self.config = name, group, buffers, config
        self.inputs, self.outputs = {}, {}
        self.block = Block()
        self.stored = {}
        self.status_nodes = []
        self.origin_stack = []
        self.counter = 0

    # -- statements -----------------------------------------------------------------------
    def emit(self, line):
        origin = self.origin_stack[-1] if self.origin_stack else None
        if origin is not None and origin is not self.block.last_origin:
            self.block.lines.append(f"// FX: {fx_line(origin)}")
            self.block.last_origin = origin
        self.block.lines.append(line)

    def cse(self, expr, dtype) -> CppVar:
        key = (expr, dtype)
        hit = self.block.lookup(key)
        if hit is not None:
            return hit
        var = CppVar(f"tmp{self.counter}", dtype)
        self.counter += 1
        self.emit(f"{cpp_type(dtype)} {var} = {expr};")
        self.block.cache[key] = var
        return var

    @contextlib.contextmanager
    def child_block(self):
        outer = self.block
        self.block = Block(outer)
        try:
            yield self.block
        finally:
            self.block = outer

    def status(self, node, message) -> int:
        self.status_nodes.append((node.name, message))
        return len(self.status_nodes)

    def input_arg(self, name):
        if name in self.outputs:
            return self.outputs[name]
        return self.inputs.setdefault(name, f"in_ptr{len(self.inputs)}")

    def output_arg(self, name):
        return self.outputs.setdefault(name, f"out_ptr{len(self.outputs)}")

    # -- nodes ----------------------------------------------------------------------------
    def pointwise(self, node, ops):
        if not node.inner:
            self.store(node, node.body(ops), ops)
            return
        with self.child_block() as inner:
            inner.last_origin = inner.parent.last_origin
            self.store(node, node.body(ops), ops)
        rvars = [v for v in node.index if v.is_Symbol and v.name.startswith("r")]
        loops = LoopNest([Loop(v.name, s) for v, s in zip(rvars, node.rranges)])
        self.block.lines.extend(loops.render(inner.lines))

    def store(self, node, value, ops):
        dtype = node.buffer.dtype
        value = ops.to_dtype(value, dtype)
        if not node.inner:
            # later nodes of this loop nest read the value, not memory (same index by construction)
            self.stored[node.name] = (node.store_index, value)
        if not node.local:
            self.emit(f"{self.output_arg(node.name)}[{cexpr(node.store_index)}] = {value};")

    def reduction(self, node, ops):
        data = node.buffer.data
        out_dtype, rtype = data.dtype, data.reduction_type
        acc_dtype = accumulator_dtype(rtype, out_dtype, data.src_dtype)
        t = cpp_type(acc_dtype)
        acc = f"acc{self.counter}"
        self.counter += 1
        init = REDUCTION_INIT.get(rtype.replace("arg", ""))(t, acc_dtype)
        self.emit(f"{t} {acc} = {init};")
        if rtype.startswith("arg"):
            self.emit(f"int64_t {acc}_idx = 0;")
        strides, ridx = _contiguous(node.rranges), []
        for var, st in zip([v for v in node.rindex if v.is_Symbol], strides):
            ridx.append(f"{var}*{st}")
        with self.child_block() as inner:
            inner.last_origin = inner.parent.last_origin
            value = node.body(ops)
            self.block.lines.append(REDUCTION_COMMENT)
            self.block.lines.append(REDUCTION_COMBINE[rtype].format(
                acc=acc, t=t, v=value, ridx=" + ".join(ridx) or "0"))
        loops = LoopNest([Loop(v.name, s) for v, s in zip([v for v in node.rindex if v.is_Symbol], node.rranges)])
        self.block.lines.extend(loops.render(inner.lines))
        result = CppVar(f"{acc}_idx" if rtype.startswith("arg") else acc, torch.int64 if rtype.startswith("arg") else acc_dtype)
        self.store(node, result, ops)

    # -- whole kernel ---------------------------------------------------------------------
    def generate(self) -> str:
        """The kernel's C++ function (without the prelude include)."""
        ops = CppOps(self)
        for node in self.group.nodes:
            (self.reduction if node.is_reduction else self.pointwise)(node, ops)
        xvars = [f"x{i}" for i in range(len(self.group.ranges))]
        loops = [Loop(v, s) for v, s in zip(xvars, self.group.ranges)]
        self._parallelize(loops)
        body = LoopNest(loops).render(self.block.lines)
        params = [f"const {cpp_type(self.buffers[n].dtype)}* {a}" for n, a in self.inputs.items()]
        params += [f"{cpp_type(self.buffers[n].dtype)}* {a}" for n, a in self.outputs.items()]
        lines = [f'extern "C" int {self.name}({", ".join(params)})', "{", "    int tdbg_status = 0;"]
        lines += ["    " + line for line in body] + ["    return tdbg_status;", "}"]
        return "\n".join(lines) + "\n"

    def _parallelize(self, loops):
        work = math.prod(self.group.ranges) * max([math.prod(n.rranges) for n in self.group.nodes] + [1])
        reason = None
        if not self.config.parallel:
            reason = "config.parallel is off"
        elif not loops:
            reason = "no outer loop (the result is a single element)"
        elif work < self.config.min_chunk_size:
            reason = f"work {work} < min_chunk_size {self.config.min_chunk_size}"
        if reason:
            log.info("%s: loop not parallel: %s", self.name, reason)
            return
        threads = self.config.num_threads or torch.get_num_threads()
        collapse, iters = 0, 1
        for loop in loops:
            collapse += 1
            iters *= loop.size
            if iters >= threads * 4:
                break
        clause = f" collapse({collapse})" if collapse > 1 else ""
        loops[0].pragma = f"#pragma omp parallel for{clause} num_threads({threads})"


class CppOps:
    """The op handler for C++ scalar code: each method returns a CppVar (or a literal)."""

    def __init__(self, kernel: CppKernel):
        self.k = kernel

    @contextlib.contextmanager
    def origin(self, node):
        self.k.origin_stack.append(node)
        try:
            yield
        finally:
            self.k.origin_stack.pop()

    def load(self, name, index):
        index = sympy.expand(index)
        hit = self.k.stored.get(name)
        if hit is not None and hit[0] == index:
            return hit[1]
        return self.k.cse(f"{self.k.input_arg(name)}[{cexpr(index)}]", self.k.buffers[name].dtype)

    def constant(self, value, dtype):
        return CppVar(constant(value, dtype), dtype)

    def index_expr(self, expr, dtype):
        return self.k.cse(f"static_cast<{cpp_type(dtype)}>({cexpr(expr)})", dtype)

    def to_dtype(self, x, dtype):
        if x.dtype == dtype:
            return x
        return self.k.cse(f"static_cast<{cpp_type(dtype)}>({x})", dtype)

    def where(self, cond, a, b):
        return self.k.cse(f"{cond} ? {a} : {b}", a.dtype)

    def masked(self, mask, body, other):
        with self.k.child_block() as inner:
            inner.last_origin = self.k.block.parent.last_origin
            value = body()
        var = CppVar(f"tmp{self.k.counter}", value.dtype)
        self.k.counter += 1
        self.k.emit(f"{cpp_type(value.dtype)} {var} = {self.to_dtype(other, value.dtype)};")
        self.k.block.lines.append(f"if ({mask})")
        self.k.block.lines.extend(["{"] + ["    " + l for l in inner.lines] + [f"    {var} = {value};", "}"])
        return var

    def indirect_indexing(self, x, size):
        var = f"tmp{self.k.counter}"
        self.k.counter += 1
        code = self.k.status(self.k.origin_stack[-1], f"index out of bounds for dimension of size {size}")
        self.k.emit(f"int64_t {var} = {x} < 0 ? {x} + {size} : {x};")
        self.k.emit(f"if ({var} < 0 || {var} >= {size}) {{ tdbg_status = {code}; {var} = 0; }}")
        return sympy.Symbol(var, integer=True)

    def inject_bug(self, kind, value, node):
        name = optable.op_name(node.target)
        if kind == "compile_error":
            return self.k.cse(f"tdbg_injected_compile_error_{name}({value})", value.dtype)
        if kind == "runtime_error":
            self.k.emit(f"tdbg_status = {self.k.status(node, f'injected runtime error in {name}')};")
            return value
        if kind == "crash":
            self.k.emit("*reinterpret_cast<volatile int64_t*>(static_cast<uintptr_t>(64)) = 1;")
            return value
        row = TABLE.get(name)
        spelling = row.accuracy_bug if row is not None and row.accuracy_bug else (
            "!{0}" if value.dtype == torch.bool else "decltype({0})({0} + 1)")
        return self.k.cse(spelling.format(value), value.dtype)

    def __getattr__(self, name):
        row = TABLE.get(name)
        if row is None and name not in HELPER_SPELLINGS:
            raise AttributeError(name)

        def op(*args):
            dtype = args[0].dtype
            fmt = HELPER_SPELLINGS[name] if row is None else row.spelling(dtype)
            out = dtype if row is None else row.result_dtype(dtype)
            return self.k.cse(fmt.format(*args), out)
        return op


REDUCTION_COMMENT = "// accumulate"


@dataclass
class Loop:
    var: str
    size: int
    pragma: str = ""


@dataclass
class LoopNest:
    loops: list = field(default_factory=list)

    def render(self, body: list) -> list:
        lines = list(body)
        for loop in reversed(self.loops):
            head = [loop.pragma] if loop.pragma else []
            lines = head + [f"for (int64_t {loop.var} = 0; {loop.var} < {loop.size}; ++{loop.var})", "{"] + \
                ["    " + line for line in lines] + ["}"]
        return lines


def _contiguous(sizes):
    out, acc = [], 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= s
    return out[::-1]


@dataclass
class KernelInfo:
    name: str
    source: str
    args: list            # buffer names in parameter order
    status_nodes: list    # [(fx node name, message)] for status codes 1..n
    group_index: int
    fx_nodes: list


def generate_kernels(items, buffers, config) -> list:
    """One KernelInfo per KernelGroup in `items` (named cpp_fused_<ops>_<n>)."""
    from .scheduler import KernelGroup, kernel_name
    kernels = []
    for pos, item in enumerate(items):
        if not isinstance(item, KernelGroup):
            continue
        item.name = kernel_name(item, len(kernels))
        k = CppKernel(item.name, item, buffers, config)
        source = k.generate()
        kernels.append(KernelInfo(item.name, source, list(k.inputs) + list(k.outputs), k.status_nodes, pos,
                                  [o.name for o in item.origins()]))
    return kernels
