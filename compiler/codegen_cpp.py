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
import dataclasses
import itertools
import math
import re
from dataclasses import dataclass, field

import sympy
import torch

from . import ops as optable
from .ir import csize, hint, is_size_symbol
from .ops import CPP_TYPES, LOWP_CONVERT, TABLE, HELPER_SPELLINGS, storage_type
from .codegen_loops import Block, CppVar, Loop, LoopFacts, LoopNest, cexpr, cpp_type
from .codegen_reduction import ReductionCodegen
from .codegen_segments import MaskSegments
from .logs import get_logger
from .scheduler import KernelGroup, kernel_name, kernel_threads, row_offset

BLEND_TYPES = (torch.float32, torch.float64, *LOWP_CONVERT)   # tdbg_detail::sel overloads in cpp_prelude.h
                                                            # (bf16/fp16 values are float)

log = get_logger("schedule")


def constant(value, dtype) -> str:
    t = cpp_type(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        value = float(value)
        if math.isnan(value):
            return f"tdbg_limits<{t}>::quiet_NaN()"
        if math.isinf(value):
            return f"{'-' if value < 0 else ''}tdbg_limits<{t}>::infinity()"
        return f"static_cast<{t}>({value!r})"
    value = int(value)
    if value == -(2 ** 63):
        return "tdbg_limits<int64_t>::lowest()"
    return f"static_cast<{t}>({value}LL)"


_SIZE_SYMBOL = re.compile(r"\bks(\d+)\b")


def size_symbols(lines) -> list:
    """The size symbols (ks<i>, ir.ShapeSymbols) a kernel body uses, in order: its int64_t arguments."""
    found = {int(m) for line in lines for m in _SIZE_SYMBOL.findall(line)}
    return [f"ks{i}" for i in sorted(found)]


def fx_line(node) -> str:
    def fmt(a):
        if hasattr(a, "name") and hasattr(a, "op"):
            return a.name
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(fmt(x) for x in a) + "]"
        return repr(a)
    args = [fmt(a) for a in node.args] + [f"{k} = {fmt(v)}" for k, v in node.kwargs.items()]
    return f"{node.name} = torch.ops.{node.target}({', '.join(args)})"


class CppKernel(ReductionCodegen):
    """Generates one kernel function for a KernelGroup.

    Vectorization (`#pragma omp simd` on innermost loops, `config.vectorize` and `simdlen`):
    `omp simd` asserts that the loop has no loop-carried dependence, so it is never put on a loop
    that stores through a computed (indirect) index, scatters or accumulates into memory, writes
    `tdbg_status` (bounds checks of indirect loads, injected runtime errors) or reads a buffer this
    kernel writes at an index other than the one it stores (an output aliasing an input at a
    different index). Fusion only admits reads at the stored index and every store is at the
    buffer's own layout index, so the checks below hold by construction and are verified
    per loop; each refusal is logged on the `schedule` channel ("loop not vectorized: ...").
    Reductions vectorize with an OpenMP reduction clause (argmax/argmin stay scalar).

    Outer reductions (the reduced dim is not the contiguous one, e.g. x.sum(0); the scheduler's
    `group.lane`) run chunked: the last kept dim is cut into chunks, each chunk keeps one
    accumulator per element, the reduction loops run outside and the contiguous chunk loop
    ("lane loop") inside. Row+column groups (`group.columns`) get the loop nest of
    `ReductionCodegen.row_column_body` (compiler/codegen_reduction.py).
    """

    def __init__(self, name, group, buffers, config):
        self.name, self.group, self.buffers, self.config = name, group, buffers, config
        self.inputs, self.outputs = {}, {}
        self.block = Block()
        self.stored = {}
        self.scratch = {}       # inner local node's name -> (node, its scratch array)
        self.lowp_exact = set()  # bf16/fp16 values known to be representable (loads): no re-rounding
        self.lowp_bits = {}      # rounded bf16/fp16 value -> the variable holding its 16 bits (stores reuse it)
        self.status_nodes = []
        self.origin_stack = []
        self.line_origins = {}  # emitted statement -> FX node name, for provenance.py
        self.counter = 0
        self.facts = [LoopFacts()]
        self.lane = None        # chunked outer reduction: scheduler.Lane
        self.columns = []       # fused row+column reduction: codegen_reduction.ColumnAcc per column node
        self.producer = None    # an inner pointwise loop left open for the next reduction (Producer)
        self.group_reads = {name for n in group.nodes for name in n.read_names()}
        self.segs = MaskSegments()   # innermost-loop segments of masked reads (codegen_segments)

    # -- statements -----------------------------------------------------------------------
    def emit(self, line):
        origin = self.origin_stack[-1] if self.origin_stack else None
        if origin is not None and origin is not self.block.last_origin:
            self.block.lines.append(f"// FX: {fx_line(origin)}")
            self.block.last_origin = origin
        if origin is not None:
            self.line_origins.setdefault(line, origin.name)
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

    def fresh(self, prefix):
        self.counter += 1
        return f"{prefix}{self.counter - 1}"

    @contextlib.contextmanager
    def child_block(self):
        outer = self.block
        self.block = Block(outer)
        self.block.last_origin = outer.last_origin
        try:
            yield self.block
        finally:
            self.block = outer

    @contextlib.contextmanager
    def loop_body(self):
        """A child block whose LoopFacts are collected (and passed on to the enclosing loop)."""
        facts = LoopFacts()
        self.facts.append(facts)
        try:
            with self.child_block() as block:
                block.loop = True
                yield block, facts
        finally:
            self.facts.pop()
            self.facts[-1].reasons.extend(facts.reasons + facts.conflicts())
            self.facts[-1].itemsizes.update(facts.itemsizes)
            self.facts[-1].stores.update(facts.stores)
            self.facts[-1].foreign_reads.update(facts.foreign_reads)

    def invariant_block(self, var):
        """The block outside the innermost loop that defines `var` (a temporary computed before
        that loop starts, e.g. a row's sum read by the loop over its elements), else None."""
        b = self.block
        while b is not None and not (b.defines(var) or b.loop):
            b = b.parent
        if b is None or b.defines(var):
            return None
        b = b.parent
        while b is not None and not b.defines(var):
            b = b.parent
        return b

    def unsafe(self, reason):
        self.facts[-1].reasons.append(reason)

    def touch(self, dtype):
        self.facts[-1].itemsizes.add(dtype.itemsize)

    def simd(self, what, facts, clause=""):
        """The `#pragma omp simd` line for a loop over `what`, or "" (and the log says why)."""
        reasons = list(dict.fromkeys(facts.reasons + facts.conflicts()))
        if not self.config.vectorize:
            reasons = ["config.vectorize is off"]
        elif self.config.simdlen <= 0:
            reasons = ["config.simdlen is 0"]
        if reasons:
            log.info("%s: loop not vectorized: %s: %s", self.name, what, "; ".join(reasons))
            return ""
        return f"#pragma omp simd simdlen({self.simdlen(facts)}){clause}"

    def simdlen(self, facts):
        """config.simdlen counts float32 lanes: the same vector width in the loop's narrowest type."""
        return max(1, self.config.simdlen * 4 // min(facts.itemsizes or {4}))

    def status(self, node, message) -> int:
        self.unsafe("writes tdbg_status")
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
        if self.lane is not None:
            self.lane_pointwise(node, ops)
            return
        if not node.inner:
            self.store(node, node.body(ops), ops)
            return
        rvars = [v for v in node.index if v.is_Symbol and v.name.startswith("r")]
        if node.local:
            arr = self.fresh("scratch")
            self.block.lines.append(f"{cpp_type(node.buffer.dtype)} {arr}[{math.prod(node.rranges)}];")
            self.scratch[node.name] = (node, arr)
        with self.loop_body() as (inner, facts):
            value = self.store(node, node.body(ops), ops)
        if self.defer_to_consumer(node, inner, facts, value):
            return
        loops = [Loop(v.name, s) for v, s in zip(rvars, node.rranges)]
        if loops:
            loops[-1].pragma = self.simd(f"{node.name} {rvars[-1]}", facts)
        self.block.lines.extend(LoopNest(loops).render(inner.lines))

    def store(self, node, value, ops):
        """Store `node`'s value (in this kernel's loops); returns the value cast to its dtype."""
        dtype = node.buffer.dtype
        value = ops.to_dtype(value, dtype)
        self.touch(dtype)
        # size symbols (ks<i>) are loop invariants: only an index symbol that is no loop variable is computed
        if not ({v for v in node.store_index.free_symbols if not is_size_symbol(v)} <= self.loop_symbols(node)):
            self.unsafe(f"{node.name} is stored through a computed index")
        if node.name in self.scratch:
            self.emit(f"{self.scratch_element(node.name, node.store_index)} = {value};")
            return value
        if not node.inner:
            # later nodes of this loop nest read the value, not memory (same index by construction)
            self.stored[node.name] = (node.store_index, self.lane_value(node, value))
        if not node.local:
            self.facts[-1].stores.add(node.name)
            bits = value
            if dtype in LOWP_CONVERT:
                bits = self.lowp_bits.get(str(value)) or f"{LOWP_CONVERT[dtype][1]}({value})"
            self.emit(f"{self.output_arg(node.name)}[{cexpr(node.store_index)}] = {bits};")
        return value

    def scratch_element(self, name, index) -> str:
        node, arr = self.scratch[name]
        offset = row_offset(node, index)
        if offset is None:
            raise AssertionError(f"{name} is a kernel-local scratch array but is read at {index}, outside its row")
        return f"{arr}[{cexpr(offset)}]"

    def group_store_index(self, name):
        return next((n.store_index for n in self.group.nodes if n.name == name), None)

    @staticmethod
    def loop_symbols(node):
        return {v for v in [*node.index, *node.rindex] if v.is_Symbol}

    # -- whole kernel ---------------------------------------------------------------------
    def generate(self) -> str:
        """The kernel's C++ function (without the prelude include)."""
        ops = CppOps(self)
        body = self.row_column_body(ops) if self.group.columns else self.loop_nest(ops)
        params = [f"const {storage_type(self.buffers[n].dtype)}* {a}" for n, a in self.inputs.items()]
        params += [f"{storage_type(self.buffers[n].dtype)}* {a}" for n, a in self.outputs.items()]
        self.size_args = size_symbols(body)
        params += [f"int64_t {s}" for s in self.size_args]
        lines = [f'extern "C" int {self.name}({", ".join(params)})', "{", "    int tdbg_status = 0;"]
        lines += ["    " + line for line in body] + ["    return tdbg_status;", "}"]
        return "\n".join(lines) + "\n"

    def loop_nest(self, ops):
        """The group's outer loops around each node's statements (chunked when `group.lane`; a
        pointwise innermost loop with masked reads cut into segments, codegen_segments)."""
        self.lane = dataclasses.replace(self.group.lane, arrays={}) if self.group.lane else None
        xvars = [f"x{i}" for i in range(len(self.group.ranges))]
        pointwise = not any(n.inner or n.is_reduction for n in self.group.nodes)
        if self.lane is None and pointwise and len(xvars) >= 2 and self.config.vectorize:
            self.segs.watch(xvars[-1])
        lines, facts = self._group_body(ops)
        loops = [Loop(v, s) for v, s in zip(xvars, self.group.ranges)]
        if self.lane is not None:
            loops[-1] = Loop(self.lane.base, self.lane.size, step=self.lane.chunk)
        elif loops and pointwise:
            segments = None if facts.reasons else self.segs.segments(self.group.ranges[-1])
            if segments:
                return self._segmented(ops, loops, segments)
            loops[-1].pragma = self.simd(f"{self.group.nodes[0].name} {loops[-1].var}", facts)
            if self.group.tile:
                loops = self._tiled(loops, self.group.tile)
        self.block.lines.extend(lines)
        self._parallelize(loops)
        return LoopNest(loops).render(self.block.lines)

    def _tiled(self, loops, tile):
        """The last two loops as tile loops (outer, rectangular: the parallel candidates) around
        the two element loops, each bounded by its tile's end (scheduler.plan_tile)."""
        a, b = loops[-2:]
        tiles = [Loop(f"{l.var}t", l.size, step=t) for l, t in zip((a, b), tile)]
        ends = [f"{l.var}t + {t}" if l.size % t == 0 else f"({l.var}t + {t} < {l.size} ? {l.var}t + {t} : {l.size})"
                for l, t in zip((a, b), tile)]
        log.info("%s: tiled %dx%d (a transposed read)", self.name, *tile)
        return loops[:-2] + tiles + [Loop(a.var, ends[0], start=f"{a.var}t"),
                                     Loop(b.var, ends[1], b.pragma, start=f"{b.var}t")]

    def _group_body(self, ops):
        """(statements, LoopFacts) of every node of the group, in a fresh loop body."""
        with self.loop_body() as (body, facts):
            for node in self.group.nodes:
                (self.reduction if node.is_reduction else self.pointwise)(node, ops)
        return body.lines, facts

    def _segmented(self, ops, loops, segments):
        """The outer loops around one innermost loop per segment, each with the body generated
        for that segment (masks known there are constants, see codegen_segments)."""
        inner, rendered = loops[-1], []
        for lo, hi in segments:
            self.stored, self.segs.segment = {}, (lo, hi)
            lines, facts = self._group_body(ops)
            loop = Loop(inner.var, hi, start=str(lo))
            loop.pragma = self.simd(f"{self.group.nodes[0].name} {inner.var} in [{lo}, {hi})", facts)
            rendered += LoopNest([loop]).render(lines)
        self.segs.segment = None
        outer = loops[:-1]
        self._parallelize(outer)
        return LoopNest(outer).render(self.block.lines + rendered)

    def _parallelize(self, loops):
        # symbolic sizes: the example inputs' values decide (any decision here is correct code)
        work = math.prod(map(hint, self.group.ranges)) * max(
            [math.prod(map(hint, n.rranges)) for n in self.group.nodes] + [1])
        reason = None
        # symbolic sizes: the work is known at run time only; OpenMP's if clause decides there
        sizes = [*self.group.ranges, *(r for n in self.group.nodes for r in n.rranges)]
        runtime = ""
        if not all(isinstance(r, int) for r in sizes):
            inner = max([n.rranges for n in self.group.nodes], key=lambda r: math.prod(map(hint, r)), default=())
            total = sympy.expand(math.prod(self.group.ranges) * math.prod(inner))
            runtime = f" if({cexpr(total)} >= {self.config.min_chunk_size})"
        if not self.config.parallel:
            reason = "config.parallel is off"
        elif not loops:
            reason = "no outer loop (the result is a single element)"
        elif runtime:
            pass
        elif work < self.config.min_chunk_size:
            reason = f"work {work} < min_chunk_size {self.config.min_chunk_size}"
        elif loops[0].trips < 2 and len(loops) == 1:
            reason = "a single chunk"
        if reason:
            log.info("%s: loop not parallel: %s", self.name, reason)
            return
        threads = kernel_threads(self.config)
        # a vectorized innermost loop stays out of the collapsed space (its own simd loop)
        candidates = loops[:-1] if len(loops) > 1 and loops[-1].pragma else loops
        # collapse only rectangular loops (a tile's element loops start at the tile)
        candidates = list(itertools.takewhile(lambda loop: loop.start == "0", candidates))
        collapse, iters = 0, 1
        for loop in candidates:
            collapse += 1
            iters *= loop.trips
            if iters >= threads * 4:
                break
        clause = f" collapse({collapse})" if collapse > 1 else ""
        if loops[0].pragma:   # a single vectorized loop: one combined construct
            simd = loops[0].pragma.replace("#pragma omp simd", "")
            loops[0].pragma = f"#pragma omp parallel for simd{simd} num_threads({threads}){runtime}"
            return
        loops[0].pragma = f"#pragma omp parallel for{clause} num_threads({threads}){runtime}"


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
        dtype = self.k.buffers[name].dtype
        self.k.touch(dtype)
        if name in self.k.scratch:
            return self.k.cse(self.k.scratch_element(name, index), dtype)
        store_index = self.k.group_store_index(name)
        if store_index is not None and store_index != index:
            self.k.facts[-1].foreign_reads.add(name)
        element = f"{self.k.input_arg(name)}[{cexpr(index)}]"
        if dtype not in LOWP_CONVERT:
            return self.k.cse(element, dtype)
        var = self.k.cse(f"{LOWP_CONVERT[dtype][0]}({element})", dtype)
        self.k.lowp_exact.add(var.name)
        return var

    def constant(self, value, dtype):
        if isinstance(value, sympy.Expr) and not value.is_number:   # a symbolic size (mean's count)
            return self.index_expr(value, dtype)
        var = CppVar(constant(value, dtype), dtype)
        self.k.segs.note_constant(var.name, value, dtype)
        return var

    def index_expr(self, expr, dtype):
        var = self.k.cse(f"static_cast<{cpp_type(dtype)}>({cexpr(expr)})", dtype)
        self.k.segs.note_index(var.name, expr)
        return var

    # comparisons of the innermost index with constants: known inside a loop segment
    def _compare(self, op, a, b):
        known = self.k.segs.compare(op, a, b)
        return self.__getattr__(op)(a, b) if known is None else self.constant(known, torch.bool)

    def lt(self, a, b):
        return self._compare("lt", a, b)

    def le(self, a, b):
        return self._compare("le", a, b)

    def gt(self, a, b):
        return self._compare("gt", a, b)

    def ge(self, a, b):
        return self._compare("ge", a, b)

    def logical_and(self, a, b):
        for x, y in ((a, b), (b, a)):
            if str(x) == "false":
                return x
            if str(x) == "true" and getattr(y, "dtype", None) == torch.bool:
                return y
        return self.__getattr__("logical_and")(a, b)

    def to_dtype(self, x, dtype):
        """`x` converted as eager converts; a bf16/fp16 value is float here, so a cast from one
        first rounds it to its dtype (eager's op stored it rounded) unless it is known exact
        (a load, a rounded value), and a cast to one rounds to nearest even."""
        if x.dtype == dtype:
            return x
        if x.dtype in LOWP_CONVERT and str(x) not in self.k.lowp_exact:
            x = self._lowp_round(x, x.dtype)
        if dtype in LOWP_CONVERT:
            return self._lowp_round(x, dtype)
        return self.k.cse(f"static_cast<{cpp_type(dtype)}>({x})", dtype)

    def _lowp_round(self, x, dtype):
        """float(x) rounded to bf16/fp16: its 16 bits (int16_t, the same bits: a store of the
        value writes them, CppKernel.store) and the float they hold (the value)."""
        load, store = LOWP_CONVERT[dtype]
        bits = self.k.cse(f"{store}(static_cast<float>({x}))", torch.int16)
        var = self.k.cse(f"{load}({bits})", dtype)
        self.k.lowp_exact.add(var.name)
        self.k.lowp_bits[var.name] = bits.name
        return var

    def div(self, a, b):
        """a / b; a float divisor computed outside the innermost loop becomes one reciprocal
        computed before the loop and a multiply per element, as eager's softmax does."""
        outside = self.k.invariant_block(b) if isinstance(b, CppVar) else None
        if outside is None or a.dtype != b.dtype or not a.dtype.is_floating_point:
            return self.__getattr__("div")(a, b)
        key, t = (f"1 / {b}", b.dtype), cpp_type(b.dtype)
        if key not in outside.cache:
            outside.cache[key] = CppVar(self.k.fresh("tmp"), b.dtype)
            outside.lines.append(f"{t} {outside.cache[key]} = static_cast<{t}>(1) / {b};")
        return self.k.cse(f"{a} * {outside.cache[key]}", a.dtype)

    def rand(self, seed, stream, offset, dtype):
        """Uniform [0, 1) in `dtype` for element `offset` of `stream` (cpp_prelude.h tdbg_philox)."""
        return self.k.cse(f"tdbg_rand<{cpp_type(dtype)}>({seed}, {stream}, {offset})", dtype)

    def randn(self, seed, stream, offset, dtype):
        """Standard normal in `dtype` (Box-Muller over one Philox draw)."""
        return self.k.cse(f"tdbg_randn<{cpp_type(dtype)}>({seed}, {stream}, {offset})", dtype)

    def where(self, cond, a, b):
        if str(cond) in ("true", "false") and a.dtype == b.dtype:
            return a if str(cond) == "true" else b
        # A float select as a bit blend: g++ keeps `c ? a : b` a branch in these loops and then
        # will not vectorize them (padded loads of EfficientNet's SiLU kernels ran scalar).
        if a.dtype in BLEND_TYPES:
            t = CPP_TYPES[a.dtype]
            return self.k.cse(f"tdbg_detail::sel(static_cast<bool>({cond}), static_cast<{t}>({a}), "
                              f"static_cast<{t}>({b}))", a.dtype)
        return self.k.cse(f"{cond} ? {a} : {b}", a.dtype)

    def masked(self, mask, body, other):
        if str(mask) == "true":      # a loop segment where the mask holds: no branch
            return body()
        if str(mask) == "false":     # ... or never holds: the body only gives the result's dtype
            with self.k.child_block():
                dtype = body().dtype
            return self.to_dtype(other, dtype)
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
        size = csize(size)
        self.k.emit(f"int64_t {var} = {x} < 0 ? {x} + {size} : {x};")
        self.k.emit(f"if ({var} < 0 || {var} >= {size}) {{ tdbg_status = {code}; {var} = 0; }}")
        return sympy.Symbol(var, integer=True)

    def inject_bug(self, kind, value, node):
        with self.origin(node):     # the injected statement is the culprit node's own line (provenance)
            return self._inject_bug(kind, value, node)

    def _inject_bug(self, kind, value, node):
        name = optable.op_name(node.target)
        if kind == "compile_error":
            return self.k.cse(f"tdbg_injected_compile_error_{name}({value})", value.dtype)
        if kind == "runtime_error":
            self.k.emit(f"tdbg_status = {self.k.status(node, f'injected runtime error in {name}')};")
            return value
        if kind == "crash":
            self.k.unsafe("injected crash")
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


@dataclass
class KernelInfo:
    name: str
    source: str
    args: list            # buffer names in parameter order
    size_args: list       # then these size symbols (ks<i>), int64_t
    status_nodes: list    # [(fx node name, message)] for status codes 1..n
    group_index: int
    fx_nodes: list
    line_origins: dict = field(default_factory=dict)   # statement text -> FX node (provenance)


def generate_kernels(items, buffers, config) -> list:
    """One KernelInfo per KernelGroup in `items` (named cpp_fused_<ops>_<n>)."""
    kernels = []
    for pos, item in enumerate(items):
        if not isinstance(item, KernelGroup):
            continue
        item.name = kernel_name(item, len(kernels))
        k = CppKernel(item.name, item, buffers, config)
        source = k.generate()
        kernels.append(KernelInfo(item.name, source, list(k.inputs) + list(k.outputs), k.size_args, k.status_nodes, pos,
                                  [o.name for o in item.origins()], k.line_origins))
    return kernels
