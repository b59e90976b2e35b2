"""Reduction code generation for `CppKernel` (compiler/codegen_cpp.py): the accumulator tables,
inner (row) reductions with OpenMP reduction clauses, chunked outer reductions and fused
row+column reductions.

Contract: `ReductionCodegen` is a mixin of `CppKernel`; its methods emit into the kernel's current
`Block` through the kernel's helpers (`fresh`, `emit`, `loop_body`, `child_block`, `simd`, `store`,
`stored`, `lane`) and never touch the function signature. `CppKernel.pointwise` / `reduction`
dispatch here; `row_column_body` replaces the whole loop nest of a group the scheduler fused as
row+column (`group.columns`, see scheduler.ColumnPart).
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

import sympy
import torch

from .codegen_loops import CppVar, Loop, LoopFacts, LoopNest, _contiguous, cexpr, cpp_type, may_exceed
from .ir import csize
from .scheduler import accumulates_in_producer, kernel_threads
from .logs import get_logger

log = get_logger("schedule")

REDUCTION_COMMENT = "// accumulate"

REDUCTION_INIT = {
    "sum": lambda t, d: "0", "prod": lambda t, d: "1",
    "max": lambda t, d: "false" if d == torch.bool else (f"-tdbg_limits<{t}>::infinity()" if d.is_floating_point else f"tdbg_limits<{t}>::lowest()"),
    "min": lambda t, d: "true" if d == torch.bool else (f"tdbg_limits<{t}>::infinity()" if d.is_floating_point else f"tdbg_limits<{t}>::max()"),
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
# Vectorized reduction over the innermost loop: (OpenMP reduction clause, combine). A float
# max/min takes the plain max (a vector max instruction) and counts NaNs on the side; the
# result becomes NaN after the loop when one was seen (torch.amax semantics).
SIMD_REDUCTION = {
    "sum": (" reduction(+:{acc})", REDUCTION_COMBINE["sum"]),
    "prod": (" reduction(*:{acc})", REDUCTION_COMBINE["prod"]),
    "max": (" reduction(max:{acc})", "{acc} = static_cast<{t}>({v}) > {acc} ? static_cast<{t}>({v}) : {acc};"),
    "min": (" reduction(min:{acc})", "{acc} = static_cast<{t}>({v}) < {acc} ? static_cast<{t}>({v}) : {acc};"),
    "any": (" reduction(||:{acc})", REDUCTION_COMBINE["any"]),
    "all": (" reduction(&&:{acc})", REDUCTION_COMBINE["all"]),
}
NAN_COUNT = " reduction(|:{acc}_nan)", "{acc}_nan |= static_cast<int>({v} != {v});"
# One accumulator per lane of a chunked outer reduction: no reduction clause, each lane is
# independent; NaN-propagating max/min as a select (no branch).
LANE_COMBINE = dict(REDUCTION_COMBINE, **{
    "max": "{acc} = (static_cast<{t}>({v}) > {acc} || {v} != {v}) ? static_cast<{t}>({v}) : {acc};",
    "min": "{acc} = (static_cast<{t}>({v}) < {acc} || {v} != {v}) ? static_cast<{t}>({v}) : {acc};",
})
# elements one lane adds in float before the partial sum goes into the double accumulator
PARTIAL_STEPS = 4
PARTIAL_CHAINS = 4


def float_partials(node, rtype, acc_dtype) -> bool:
    """A float32 sum adds float partial sums of PARTIAL_STEPS elements per lane into its double
    accumulator: float lanes keep up with the memory, a double per element does not, and the
    short partials keep the error below eager's (pairwise) summation."""
    return rtype == "sum" and acc_dtype == torch.float64 and node.buffer.dtype == torch.float32


def _blocked(loop, block):
    """`loop` restricted to one block of `block` iterations starting at `<var>b`."""
    if not may_exceed(loop.size, block):
        return [loop]
    var, size = loop.var, loop.size
    size = cexpr(size) if isinstance(size, sympy.Basic) else size
    end = f"{var}b + {block}" if isinstance(size, int) and size % block == 0 else f"({var}b + {block} < {size} ? {var}b + {block} : {size})"
    return [Loop(var, end, loop.pragma, start=f"{var}b")]


def accumulator_dtype(rtype, out_dtype, src_dtype):
    if rtype in ("argmax", "argmin"):
        return src_dtype
    if rtype in ("sum", "prod") and out_dtype in (torch.bfloat16, torch.float16):
        return torch.float32    # eager's CPU reductions accumulate low precision in float
    if rtype in ("sum", "prod") and out_dtype.is_floating_point:
        return torch.float64
    return out_dtype



class ReductionCodegen:
    """CppKernel's reduction methods (see the module docstring for the contract)."""

    def reduction(self, node, ops):
        data = node.buffer.data
        out_dtype, rtype = data.dtype, data.reduction_type
        rvars = [v for v in node.rindex if v.is_Symbol]
        ridx = " + ".join(f"{v}*{csize(st)}" for v, st in zip(rvars, _contiguous(node.rranges))) or "0"
        if self.lane is not None:
            self.lane_reduction(node, ops, rvars, ridx)
            return
        acc = self.fresh("acc")
        with self.reduction_body(node) as (inner, facts):
            value = node.body(ops)
            if self.columns and node.name == self.group.columns.anchor:
                self.column_updates(ops, rvars[-1].name)
        if rtype not in SIMD_REDUCTION:
            facts.reasons.append(f"{rtype} keeps the first index (scalar)")
        if rtype in ("max", "min") and data.src_dtype == torch.bool:
            facts.reasons.append("bool max/min")
        pragma = self.simd(f"{node.name} {rvars[-1] if rvars else ''}".strip(), facts, "{clause}")
        acc_dtype = accumulator_dtype(rtype, out_dtype, data.src_dtype)
        t = cpp_type(acc_dtype)
        self.block.lines.append(f"{t} {acc} = {REDUCTION_INIT[rtype.replace('arg', '')](t, acc_dtype)};")
        if rtype.startswith("arg"):
            self.block.lines.append(f"int64_t {acc}_idx = 0;")
        combine, clause = REDUCTION_COMBINE[rtype], ""
        if pragma:
            clause, combine = SIMD_REDUCTION[rtype]
            if rtype in ("max", "min") and acc_dtype.is_floating_point:
                self.block.lines.append(f"int {acc}_nan = 0;")
                clause, combine = clause + NAN_COUNT[0], combine + " " + NAN_COUNT[1]
        loops = [Loop(v.name, s) for v, s in zip(rvars, node.rranges)]
        # partial sums run PARTIAL_CHAINS vectors wide: independent add chains hide the add latency
        lanes = PARTIAL_CHAINS * self.config.simdlen
        block = PARTIAL_STEPS * lanes if pragma and loops and float_partials(node, rtype, acc_dtype) else 0
        target = f"{acc}p" if block else acc
        inner.lines.append(REDUCTION_COMMENT)
        inner.lines.append(combine.format(acc=target, t="float" if block else t, v=value, ridx=ridx))
        if loops:
            loops[-1].pragma = pragma.format(clause=clause.format(acc=target))
            if block:
                loops[-1].pragma = re.sub(r"simdlen\(\d+\)", f"simdlen({lanes})", loops[-1].pragma)
        if not block:
            self.block.lines.extend(LoopNest(loops).render(inner.lines))
        else:
            # float partial sums of `block` elements (PARTIAL_STEPS per lane) go into the double
            body = [f"float {target} = 0;"] + LoopNest(_blocked(loops[-1], block)).render(inner.lines) + \
                [f"{acc} = {acc} + {target};"]
            if may_exceed(loops[-1].size, block):
                body = LoopNest([Loop(f"{loops[-1].var}b", loops[-1].size, step=block)]).render(body)
            self.block.lines.extend(LoopNest(loops[:-1]).render(body))
        if pragma and rtype in ("max", "min") and acc_dtype.is_floating_point:
            self.block.lines.append(f"if ({acc}_nan) {acc} = tdbg_limits<{t}>::quiet_NaN();")
        result = CppVar(f"{acc}_idx" if rtype.startswith("arg") else acc, torch.int64 if rtype.startswith("arg") else acc_dtype)
        self.block.cache[("accumulator", result.name)] = result   # defined here (see invariant_block)
        self.store(node, result, ops)

    # -- accumulating inside the producer's loop ---------------------------------------------
    def defer_to_consumer(self, node, inner, facts, value) -> bool:
        """Leave inner pointwise `node`'s loop body open (not rendered) when the next reduction
        accumulates inside it (scheduler.accumulates_in_producer); the log says which and why."""
        consumer, reason = accumulates_in_producer(self.group, node, self.config)
        if consumer is None:
            return False
        if reason is None and "writes tdbg_status" in facts.reasons:
            reason = f"{node.name} writes tdbg_status"
        if reason:
            log.info("%s: %s keeps its own loop: %s", self.name, consumer.name, reason)
            return False
        log.info("%s: %s accumulates inside %s's loop (same reduction ranges, reads it at its index)",
                 self.name, consumer.name, node.name)
        self.producer = Producer(consumer.name, node, inner, facts, value)
        return True

    @contextlib.contextmanager
    def reduction_body(self, node):
        """The block of `node`'s accumulation loop: a fresh loop body, or the open body of the
        producer loop deferred for it, where loads of the producer are its just-computed value."""
        producer, self.producer = self.producer, None
        if producer is not None and producer.consumer != node.name:
            raise AssertionError(f"{producer.node.name}'s loop was left open for {producer.consumer}, not {node.name}")
        if producer is None:
            with self.loop_body() as body:
                yield body
            return
        p = producer.node
        outer, self.block = self.block, producer.block
        self.facts.append(producer.facts)
        self.stored[p.name] = (p.store_index, producer.value)
        try:
            yield producer.block, producer.facts
        finally:
            self.stored.pop(p.name, None)
            self.facts.pop()
            self.block = outer

    # -- chunked outer reductions -----------------------------------------------------------
    def lane_loop(self, what, fill):
        """Render `fill()`'s statements inside a (vectorized) loop over the current chunk."""
        with self.loop_body() as (inner, facts):
            fill()
        lane = self.lane
        loop = Loop(lane.var, lane.end, start=lane.base)
        loop.pragma = self.simd(f"{what} {lane.var}", facts)
        self.block.lines.extend(LoopNest([loop]).render(inner.lines))

    def lane_value(self, node, value):
        """Where later loops of this kernel find `node`'s value (a per-lane array when chunked)."""
        arr = self.lane.arrays.get(node.name) if self.lane is not None else None
        if arr is None:
            return value
        self.emit(f"{arr} = {value};")
        return CppVar(arr, value.dtype)

    def lane_pointwise(self, node, ops):
        if node.name in self.group_reads:
            name = self.fresh("lane")
            self.block.lines.append(f"{cpp_type(node.buffer.dtype)} {name}[{self.lane.chunk}];")
            self.lane.arrays[node.name] = f"{name}[{self.lane.offset}]"
        self.lane_loop(node.name, lambda: self.store(node, node.body(ops), ops))

    def lane_reduction(self, node, ops, rvars, ridx):
        data = node.buffer.data
        rtype = data.reduction_type
        acc_dtype = accumulator_dtype(rtype, data.dtype, data.src_dtype)
        t, lane = cpp_type(acc_dtype), self.lane
        name = self.fresh("acc")
        acc = f"{name}[{lane.offset}]"
        self.block.lines.append(f"{t} {name}[{lane.chunk}];")
        init = [f"{acc} = {REDUCTION_INIT[rtype.replace('arg', '')](t, acc_dtype)};"]
        if rtype.startswith("arg"):
            self.block.lines.append(f"int64_t {name}_idx[{lane.chunk}];")
            init.append(f"{name}_idx[{lane.offset}] = 0;")
        self.lane_loop(f"{node.name} init", lambda: self.block.lines.extend(init))
        combine = LANE_COMBINE[rtype] if acc_dtype.is_floating_point else REDUCTION_COMBINE[rtype]
        combine = combine.replace("{acc}_idx", f"{name}_idx[{lane.offset}]")
        block = 2 * PARTIAL_STEPS if float_partials(node, rtype, acc_dtype) and len(rvars) == 1 else 0
        part = f"{name}p[{lane.offset}]"

        def accumulate():
            value = node.body(ops)
            self.block.lines.append(REDUCTION_COMMENT)
            self.block.lines.append(combine.format(acc=part if block else acc, t="float" if block else t, v=value, ridx=ridx))
        with self.child_block() as outer:
            self.lane_loop(node.name, accumulate)
        loops = [Loop(v.name, s) for v, s in zip(rvars, node.rranges)]
        if not block:
            self.block.lines.extend(LoopNest(loops).render(outer.lines))
        else:
            self.block.lines.append(f"float {name}p[{lane.chunk}];")
            with self.child_block() as blocked:
                self.lane_loop(f"{node.name} partial", lambda: self.block.lines.append(f"{part} = 0;"))
                self.block.lines.extend(LoopNest(_blocked(loops[0], block)).render(outer.lines))
                self.lane_loop(f"{node.name} partial", lambda: self.block.lines.append(f"{acc} = {acc} + {part};"))
            self.block.lines.extend(LoopNest([Loop(f"{loops[0].var}b", loops[0].size, step=block)] if may_exceed(loops[0].size, block) else []).render(blocked.lines))
        result = CppVar(f"{name}_idx[{lane.offset}]", torch.int64) if rtype.startswith("arg") else CppVar(acc, acc_dtype)
        if node.local and result.dtype == data.dtype:
            self.stored[node.name] = (node.store_index, result)
            return
        self.lane_pointwise_store(node, result, ops)

    def lane_pointwise_store(self, node, result, ops):
        if not node.local:
            self.lane.arrays.pop(node.name, None)
            self.lane_loop(f"{node.name} store", lambda: self.store(node, result, ops))
        # later lane loops read the accumulator (every lane loop sees it), cast like the store
        self.stored[node.name] = (node.store_index, CppVar(f"static_cast<{cpp_type(node.buffer.dtype)}>({result})", node.buffer.dtype))

    # -- fused row+column reductions ---------------------------------------------------------
    def column_updates(self, ops, rvar):
        """Inside the anchor row reduction's innermost loop (over column `rvar`): each column
        reduction adds this element into the thread's column accumulators."""
        for c in self.columns:
            value = c.node.buffer.data.inner_fn(ops, c.index, c.rindex)
            self.emit(REDUCTION_COMMENT)
            self.emit(c.combine.format(acc=f"{c.target}[{rvar}]", t=c.elem, v=value, ridx="0"))

    def row_column_body(self, ops):
        """The loop nest of a fused row+column group: a parallel region whose threads split the
        rows (blocks of COLUMN_BLOCK rows; per row the row nodes, the anchor's innermost loop
        also updating the thread's column accumulators), then a parallel pass over the columns
        combining the threads' accumulators in thread order and running the column nodes."""
        part, group = self.group.columns, self.group
        rows_n, cols_n = group.ranges[0], part.ranges[0]
        threads = self.row_column_threads(rows_n * cols_n)
        self.columns = [ColumnAcc.make(self, n, part, threads) for n in group.nodes
                        if n.name in part.names and n.is_reduction]
        pre, region = [], []
        for c in self.columns:
            pre += [f"{c.t} {c.name}[{threads * cols_n}];"]
            pre += LoopNest([Loop("i", threads * cols_n, pragma=self.simd(f"{c.node.name} init i", LoopFacts()))]).render(
                [f"{c.name}[i] = {c.init};"])
            region.append(f"{c.t}* {c.name}t = {c.name} + omp_get_thread_num() * {cols_n};")
            if c.partial:
                region.append(f"float {c.name}p[{cols_n}];")
        with self.loop_body() as (rows, _):
            for n in group.nodes:
                if n.name not in part.names:
                    (self.reduction if n.is_reduction else self.pointwise)(n, ops)
        partial = [c for c in self.columns if c.partial]
        block = [*self.column_loop(partial, "{p}[c] = 0;"), *LoopNest(_blocked(Loop("x0", rows_n), COLUMN_BLOCK)).render(rows.lines),
                 *self.column_loop(partial, "{t}[c] = {t}[c] + {p}[c];")]
        # one thread (config.parallel off, or little work): a plain block, no OpenMP at all
        omp_for = "#pragma omp for schedule(static)" if threads > 1 else ""
        outer = Loop("x0b", rows_n, pragma=omp_for, step=COLUMN_BLOCK) if rows_n > COLUMN_BLOCK \
            else Loop("x0b", 1, pragma=omp_for)
        region += LoopNest([outer]).render(block)
        self.stored = {}
        with self.loop_body() as (cols, _):
            for n in group.nodes:
                if n.name in part.names:
                    self.column_result(n, ops, threads) if n.is_reduction else self.pointwise(n, ops)
        region += LoopNest([Loop("x0", cols_n, pragma=omp_for)]).render(cols.lines)
        parallel = [f"#pragma omp parallel num_threads({threads})"] if threads > 1 else []
        return pre + parallel + ["{"] + ["    " + l for l in region] + ["}"]

    def row_column_threads(self, work):
        if not self.config.parallel or work < self.config.min_chunk_size:
            log.info("%s: row+column reduction runs on one thread (work %d)", self.name, work)
            return 1
        return kernel_threads(self.config)

    def column_loop(self, accs, fmt):
        """A vectorized loop over the columns applying `fmt` to each accumulator in `accs`."""
        if not accs:
            return []
        body = [fmt.format(t=f"{c.name}t", p=f"{c.name}p") for c in accs]
        pragma = self.simd(f"{accs[0].node.name} partials c", LoopFacts())
        return LoopNest([Loop("c", self.group.columns.ranges[0], pragma=pragma)]).render(body)

    def column_result(self, node, ops, threads):
        """Combine the threads' accumulators of column `x0` (in thread order), store the result."""
        c = next(c for c in self.columns if c.node is node)
        v, n = f"{c.name}v", self.group.columns.ranges[0]
        self.block.lines.append(f"{c.t} {v} = {c.name}[x0];")
        for t in range(1, threads):
            self.block.lines.append(REDUCTION_COMBINE[c.rtype].format(acc=v, t=c.t, v=f"{c.name}[{t * n} + x0]", ridx="0"))
        self.store(node, CppVar(v, c.acc_dtype), ops)


@dataclass
class Producer:
    """An inner pointwise node's loop body left open for reduction `consumer`: its block, loop
    facts and the value it stores (what the reduction's loads of it become)."""
    consumer: str
    node: object
    block: object
    facts: object
    value: object


# rows per block of a fused row+column reduction: float column partials cover this many rows
COLUMN_BLOCK = 8


class ColumnAcc:
    """One column reduction of a fused row+column group: its per-thread accumulator array
    `name` (threads x columns, accumulator type `t`) and, for float32 sums, the float partial
    array `name`p of one row block; `index`/`rindex` evaluate its body at the anchor's element."""

    @classmethod
    def make(cls, kernel, node, part, threads):
        self = cls()
        data = node.buffer.data
        self.node, self.rtype = node, data.reduction_type
        self.acc_dtype = accumulator_dtype(self.rtype, data.dtype, data.src_dtype)
        self.t = cpp_type(self.acc_dtype)
        self.name = kernel.fresh("acc")
        self.init = REDUCTION_INIT[self.rtype](self.t, self.acc_dtype)
        self.partial = float_partials(node, self.rtype, self.acc_dtype)
        self.index, self.rindex = part.remapped(node)
        self.target = f"{self.name}p" if self.partial else f"{self.name}t"
        self.elem = "float" if self.partial else self.t
        self.combine = (LANE_COMBINE if self.acc_dtype.is_floating_point else REDUCTION_COMBINE)[self.rtype]
        return self

