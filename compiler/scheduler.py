"""Scheduling: dependencies, fusion, dead-buffer elimination and memory planning.

Input: the lowering's `operations` (ComputedBuffers and ExternKernels in program order).
Output: a list of `KernelGroup`s (one C++ kernel each) and `ExternNode`s in execution order,
plus a `MemoryPlan`.

Fusion rules (each accepted decision is a counted fusion, see lowering.take_fusion):
- a node may join an earlier kernel group only if its iteration space (the non-1 outer sizes)
  is the same and every buffer it reads from that group is read at exactly the index the
  producer stores it at (vertical: producer -> consumer, incl. reductions feeding pointwise
  epilogues and reductions sharing outer loops); otherwise it joins as a sibling over the same
  space (horizontal) when it does not read the group's buffers at all;
- a reduction over the last dims of a pointwise group it reads joins it, the group's nodes
  becoming inner nodes of the reduction's outer loops (`_into_reduction`: attention's scaled
  scores feeding softmax's max);
- a 2-d column reduction (x.sum(0)) joins a group holding a contiguous row reduction of the
  same iteration space (x.sum(1)) that reads some of its inputs at the same element, and its
  pointwise epilogues follow it (`ColumnPart`, "row+column" in the log): one pass reads the
  input once, up to COLUMN_CAP kept columns;
- it may never move before a group producing (or mutating) anything it reads;
- a group holds at most `config.max_fusion_size` nodes.
Buffers produced and read only inside one group (and not graph outputs) become C++ locals
(an inner pointwise node: a scratch array holding one outer iteration, up to SCRATCH_BYTES).
A reduction directly after an inner pointwise node it reads at that node's index, over the same
reduction ranges, accumulates inside that node's loop (`accumulates_in_producer`, decided per
kernel by the codegen and logged: softmax's sum of the exp).
"""
from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass, field

import sympy
import torch

from . import ir
from .ir import ComputedBuffer, ExternKernel, Reduction, coefficient
from .lowering import take_fusion
from .merge_loops import Remapped, merge_loops
from .ops import op_name
from .logs import get_logger

log = get_logger("schedule")


class _ReadsOps:
    """Op handler that records loads (buffer name -> index expressions) and nothing else."""

    def __init__(self):
        self.reads: dict = {}
        self.index_exprs: list = []
        self._ind = itertools.count()

    def load(self, name, index):
        self.reads.setdefault(name, []).append(sympy.expand(index))
        return None

    def index_expr(self, expr, dtype):
        self.index_exprs.append(expr)
        return None

    def indirect_indexing(self, value, size):
        return sympy.Symbol(f"indirect{next(self._ind)}", integer=True)

    def masked(self, mask, body, other):
        return body()

    def origin(self, node):
        return contextlib.nullcontext()

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def _canonical_index(sizes, prefix, order=None):
    """Index list over `sizes` with variables only for dims of size != 1; the loop sizes.
    `order` (dims outermost first, e.g. a channels_last buffer's N, H, W, C) numbers the loop
    variables in that order, so the loop nest walks the buffer in memory order."""
    index, loop, k = [sympy.Integer(0)] * len(sizes), [], 0
    for d in (order if order is not None else range(len(sizes))):
        if not ir.same(sizes[d], 1):
            index[d] = ir.index_var(prefix, k)
            loop.append(ir.as_size(sizes[d]))
            k += 1
    return index, tuple(loop)


def _split_index(sizes, outer_dims):
    index, outer, inner = [], [], []
    for s in sizes:
        if ir.same(s, 1):
            index.append(sympy.Integer(0))
        elif len(outer) < outer_dims:
            index.append(ir.index_var("x", len(outer)))
            outer.append(ir.as_size(s))
        else:
            index.append(ir.index_var("r", len(inner)))
            inner.append(ir.as_size(s))
    return index, tuple(outer), tuple(inner)


class SchedulerNode:
    """One ComputedBuffer with its canonical loop variables, reads and store index."""

    def __init__(self, buffer: ComputedBuffer, outer_dims=None):
        self.buffer, self.name = buffer, buffer.name
        data = buffer.data
        self.is_reduction = isinstance(data, Reduction)
        self.index, self.ranges = _canonical_index(data.ranges, "x", getattr(buffer, "loop_order", None))
        self.rindex, self.rranges = [], ()
        if self.is_reduction:
            self.index, self.ranges = _canonical_index(data.ranges, "x")
            self.rindex, self.rranges = _canonical_index(data.reduction_ranges, "r")
        elif outer_dims is not None:
            # an inner pointwise: its last dims run in an inner loop inside the group's outer loops
            self.index, self.ranges, self.rranges = _split_index(data.ranges, outer_dims)
        self.inner = bool(self.rranges) and not self.is_reduction
        self.store_index = sympy.expand(buffer.store_index(self.index))
        handler = _ReadsOps()
        self.remaps = []          # loop merges (merge_loops.py), applied to every index body() computes
        self.body(handler)
        self.reads = handler.reads
        self.index_exprs = handler.index_exprs
        self.origins = buffer.origins
        self.local = False
        self.column_part = None   # scheduling: the ColumnPart this node joins (see _fusable)

    def body(self, ops):
        if self.remaps:
            ops = Remapped(ops, self.remaps)
        if self.is_reduction:
            return self.buffer.data.inner_fn(ops, self.index, self.rindex)
        return self.buffer.data.inner_fn(ops, self.index)

    def read_names(self):
        return set(self.reads)

    def __repr__(self):
        return f"SchedulerNode({self.name})"


class ExternNode:
    def __init__(self, kernel: ExternKernel):
        self.kernel, self.name = kernel, kernel.name
        self.reads = {b.name: [] for x in kernel.inputs for b in [_buffer_of(x)]}
        self.writes = [b.name for b in kernel.outputs] + [b.name for b in kernel.mutated]
        self.origins = [kernel.node]

    def read_names(self):
        return set(self.reads)


def _buffer_of(x):
    st = x.storage()
    return st[0] if st else x


@dataclass
class KernelGroup:
    nodes: list
    ranges: tuple
    name: str = ""
    fusions: list = field(default_factory=list)   # indices of counted fusions inside
    lane: "Lane | None" = None                     # loop order of an outer reduction (plan_lanes)
    tile: "tuple | None" = None                    # (outer, inner) tile of the last two loops (plan_tile)
    columns: "ColumnPart | None" = None            # fused column reductions (_column_fusable)

    @property
    def writes(self):
        return [n.name for n in self.nodes]

    def origins(self):
        return list(dict.fromkeys(o for n in self.nodes for o in n.origins))


def _fusable(group: KernelGroup, node: SchedulerNode, config, readers=None):
    """(reason, node as placed in the group) when `node` may join `group`, else (None, node).
    `readers`: buffer name -> the scheduled nodes that read it (every node of the graph)."""
    if len(group.nodes) >= config.max_fusion_size:
        return None, node
    node.column_part = None
    columns = group.columns
    if columns is not None and (node.read_names() & set(columns.names) or node.ranges == columns.ranges):
        node.column_part = _column_member(group, node, config)
        return ("column reduction" if node.is_reduction else "column epilogue") if node.column_part else None, node
    if columns is None and node.is_reduction:
        node.column_part = _column_part(group, node, config)
        if node.column_part is not None:
            return "row+column", node
    if node.is_reduction and group.ranges != node.ranges:
        return _into_reduction(group, node, readers or {})
    if group.ranges != node.ranges:
        n = len(group.ranges)
        if node.is_reduction or not n or len(node.ranges) <= n or node.ranges[:n] != group.ranges:
            return None, node
        if getattr(node.buffer, "loop_order", None) is not None:
            return None, node   # its ranges are in memory order; an inner split is in logical order
        node = SchedulerNode(node.buffer, outer_dims=n)
    inside = {n.name: n for n in group.nodes}
    shared = [name for name in node.reads if name in inside]
    for name in shared:
        # an inner node's row is complete before the next node's loop: any element of it may be read
        if any(idx != inside[name].store_index and not (inside[name].inner and row_offset(inside[name], idx) is not None)
               for idx in node.reads[name]):
            return None, node
    if not shared and _breaks_loops(group, node):
        log.info("not fusing %s into %s: unrelated (no shared reads) and it would change the "
                 "group's loops (an inner loop beside a reduction)", node.name, group.writes)
        return None, node
    return ("vertical" if shared else "horizontal"), node


def row_offset(node: SchedulerNode, index):
    """Where `index` is in inner pointwise `node`'s row, as an offset into its scratch row (laid out
    contiguously over node.rranges), or None. Its own store index is the element its loop is at;
    another index is allowed when it is a fixed element of the row the current outer iteration
    computed (a variance's shift reads the row's first value), read after the row's loop ends."""
    rvars = [v for v in node.index if v.is_Symbol and v.name.startswith("r")]
    strides = [math.prod(node.rranges[i + 1:]) for i in range(len(node.rranges))]
    local = sympy.expand(sum((st * v for v, st in zip(rvars, strides)), sympy.Integer(0)))
    index = sympy.expand(index)
    if index == node.store_index:
        return local
    base = sympy.expand(node.store_index - local)
    offset = sympy.expand(index - base)
    if base.free_symbols & set(rvars) or not offset.is_Integer or offset < 0:
        return None
    # a symbolic row may be shorter than any fixed offset but the first (a row of 0 is never read)
    if offset > 0 and not all(isinstance(s, (int, sympy.Integer)) for s in node.rranges):
        return None
    return offset if offset < math.prod(node.rranges) else None


MIN_INNER_ROW = 16   # a shorter row would run the group's pointwise loops unvectorized


def _row_reader(reader, reduction: SchedulerNode, rebased: dict) -> bool:
    """Whether `reader` could share `reduction`'s outer loops: a reduction over the same rows, a
    pointwise over the rows and the reduced dims, or a pointwise over the rows reading the rebased
    group nodes only at fixed elements of their rows (var_mean's mean: shift + sum / n)."""
    if not isinstance(reader, SchedulerNode):
        return False
    if reader.is_reduction:
        return reader.ranges == reduction.ranges and reader.rranges == reduction.rranges
    if reader.ranges == reduction.ranges:
        return all(row_offset(rebased[name], idx) is not None
                   for name, idxs in reader.reads.items() if name in rebased for idx in idxs)
    return reader.ranges == reduction.ranges + reduction.rranges


def _into_reduction(group: KernelGroup, node: SchedulerNode, readers: dict):
    """A reduction over the last dims of a pointwise group it reads (scores / c, then softmax's
    max over the last dim): the group's nodes become inner nodes of the reduction's outer loops, so
    the reduction reads them from a scratch row instead of a buffer written by a kernel of its
    own. Only when every reader of the group could join those loops too (a reduction over the
    same rows, a pointwise over the group's space): a buffer some other kernel reads must be
    written anyway, and that kernel's own fusions (a layer norm backward's column sums) come
    first. The rebased nodes wait on `node.rebase` until the fusion is taken (schedule)."""
    outer = len(node.ranges)
    if math.prod(map(ir.hint, node.rranges)) < MIN_INNER_ROW or group.ranges != node.ranges + node.rranges \
            or group.columns is not None \
            or any(n.inner or n.is_reduction or getattr(n.buffer, "loop_order", None) is not None
                   for n in group.nodes):
        return None, node
    rebased = [SchedulerNode(n.buffer, outer_dims=outer) for n in group.nodes]
    inside = {n.name: n for n in rebased}
    if any(n.ranges != node.ranges or n.rranges != node.rranges for n in rebased) \
            or not all(_row_reader(r, node, inside) for n in group.nodes for r in readers.get(n.name, [None])):
        # (a group node nobody reads is a graph output: it keeps its own loops)
        return None, node
    shared = [name for name in node.reads if name in inside]
    if not shared or any(row_offset(inside[name], idx) is None for name in shared for idx in node.reads[name]):
        return None, node
    node.rebase = rebased
    return "pointwise into reduction", node


def _breaks_loops(group, node) -> bool:
    """A horizontal (nothing shared) fusion of `node` would mix an inner-split pointwise with a
    reduction: the group then loses its reduction's loop order (plan_lanes runs no chunked outer
    reduction beside an inner loop: x.sum(0) would read its input column by column) and gains
    nothing, since the two share no reads. E.g. a [30522, 768] zero-fill beside the column sum
    of a [128, 30522] buffer."""
    if node.inner:
        return any(n.is_reduction for n in group.nodes)
    return node.is_reduction and any(n.inner for n in group.nodes)


def schedule(operations, graph_outputs, config):
    """Return (items, fusions): items are KernelGroups and ExternNodes in execution order."""
    operations = eliminate_dead(operations, graph_outputs)
    nodes = [ExternNode(op) if isinstance(op, ExternKernel) else SchedulerNode(op) for op in operations]
    readers: dict = {}
    for n in nodes:
        for name in n.read_names():
            readers.setdefault(name, []).append(n)
    items, produced_by, fusions = [], {}, []
    for node in nodes:
        if isinstance(node, ExternNode):
            for name in node.writes:
                produced_by[name] = len(items)
            items.append(node)
            continue
        first = max((produced_by.get(name, -1) for name in node.read_names()), default=-1)
        placed = False
        for pos in range(max(first, 0), len(items)):
            group = items[pos]
            if not isinstance(group, KernelGroup):
                continue
            reason, placed_node = _fusable(group, node, config, readers)
            if reason is None:
                continue
            index = take_fusion(config)
            if index is None:
                log.info("not fusing %s into %s: fusion budget spent or fusion disabled", node.name, group.writes)
                break
            log.info("fuse %s into %s (%s, ranges %s)", node.name, group.writes, reason, list(node.ranges))
            if placed_node.column_part is not None:
                _join_columns(group, placed_node, config)
            if getattr(placed_node, "rebase", None):
                group.nodes[:], group.ranges = placed_node.rebase, placed_node.ranges
            fusions.append({"index": index, "nodes": [*group.writes, node.name], "group": pos})
            group.nodes.append(placed_node)
            produced_by[node.name] = pos
            placed = True
            break
        if not placed:
            produced_by[node.name] = len(items)
            items.append(KernelGroup([node], node.ranges))
    _mark_locals(items, graph_outputs)
    for item in items:
        if isinstance(item, KernelGroup):
            item.lane = plan_lanes(item, config)
            merge_loops(item)
            item.tile = plan_tile(item)
    return items, fusions


# a transposing pointwise kernel runs its last two loops in tiles: TILE[0] rows of the outer dim
# by TILE[1] of the inner one (16 floats: one cache line of the transposed read per inner step;
# 64 inner steps: 64 lines, 4 KB, stay in L1 while the tile's rows reuse them)
TILE = (16, 64)


def plan_tile(group: KernelGroup):
    """TILE when `group` is pointwise over >= 2 dims and reads something transposed: contiguous
    along the second-to-last loop and strided along the last (MobileBERT's head concatenates a
    [30522, 128] weight's transpose: row by row, every read of a 62 MB output's first 128 rows
    touched a new cache line, 250 MB of traffic), else None."""
    ranges = group.ranges
    if (len(ranges) < 2 or group.lane is not None or group.columns is not None
            or any(n.inner or n.is_reduction for n in group.nodes)
            or not all(isinstance(r, int) for r in ranges[-2:]) or ranges[-2] < TILE[0] or ranges[-1] < TILE[1]):
        return None
    outer, inner = (ir.index_var("x", len(ranges) - k) for k in (2, 1))
    for idx in (i for n in group.nodes for idxs in n.reads.values() for i in idxs):
        if coefficient(idx, outer) == 1 and coefficient(idx, inner) not in (0, 1, None):
            return TILE
    return None


# fused row+column reductions: most kept columns (per-thread accumulator arrays stay in cache)
COLUMN_CAP = 16384
# most accumulators of all threads together: the kernel keeps them on the caller's stack
COLUMN_TOTAL = 65536


@dataclass
class ColumnPart:
    """Column reductions fused into a group of row reductions over the same 2-d iteration space:
    the group's rows are the column nodes' reduction dim and vice versa. `anchor` is the row
    reduction whose innermost loop (over the columns) also updates the column accumulators;
    `names` the column reductions and their pointwise epilogues (ranges `ranges`)."""
    ranges: tuple
    anchor: str
    names: list

    def remapped(self, node):
        """`node`'s (index, rindex) with its loop variables swapped onto the anchor's: x0 -> r0, r0 -> x0."""
        x0, r0 = ir.index_var("x", 0), ir.index_var("r", 0)
        swap = {x0: r0, r0: x0}
        return ([sympy.sympify(e).subs(swap, simultaneous=True) for e in node.index],
                [sympy.sympify(e).subs(swap, simultaneous=True) for e in node.rindex])


COLUMN_REDUCTIONS = ("sum", "max", "min")


def _column_part(group, node, config):
    """The ColumnPart under which reduction `node` (e.g. x.sum(0)) runs as a column reduction
    inside a row reduction of `group` (x.sum(1)), or None. 2-d; the first column reduction of
    a group picks as anchor a contiguous row reduction reading some (buffer, index) it reads at
    the same element (read once for both); every other read walks the anchor's loop
    contiguously (or not at all); at most COLUMN_CAP kept columns and COLUMN_TOTAL over all threads."""
    data = node.buffer.data
    if len(node.ranges) != 1 or len(group.ranges) != 1 or group.ranges != node.rranges:
        return None
    if not (ir.is_static(node.ranges[0]) and ir.is_static(group.ranges[0])):   # stack accumulator arrays
        return None
    if data.reduction_type not in COLUMN_REDUCTIONS or data.src_dtype == torch.bool or node.read_names() & set(group.writes):
        return None
    parts = [group.columns] if group.columns is not None else [
        ColumnPart(node.ranges, n.name, []) for n in group.nodes
        if n.is_reduction and n.rranges == node.ranges and _contiguous_rows(n)]
    part = next((p for p in parts if _column_reads_fit(group, node, p)), None)
    cap = min(COLUMN_CAP, COLUMN_TOTAL // kernel_threads(config))
    if part is not None and node.ranges[0] > cap:
        log.info("not fusing %s into %s as a column reduction: %d kept columns > cap %d",
                 node.name, group.writes, node.ranges[0], cap)
        return None
    return part


def _column_reads_fit(group, node, part) -> bool:
    handler = _ReadsOps()
    node.buffer.data.inner_fn(handler, *part.remapped(node))
    reads = {(name, i) for name, idxs in handler.reads.items() for i in idxs}
    anchor = next(n for n in group.nodes if n.name == part.anchor)
    shared = reads & {(name, i) for name, idxs in anchor.reads.items() for i in idxs}
    column = ir.index_var("r", 0)
    return bool(shared or part.names) and all(coefficient(i, column) in (0, 1) for _, i in reads - shared)


def _contiguous_rows(node) -> bool:
    """A 1-d reduction whose reads walk its reduction var contiguously (a row reduction)."""
    rvars = [v for v in node.rindex if v.is_Symbol]
    return len(rvars) == 1 and len(node.rranges) == 1 and any(
        coefficient(i, rvars[0]) == 1 for idxs in node.reads.values() for i in idxs)


def _column_member(group, node, config):
    """The ColumnPart `node` joins (another column reduction, or a pointwise epilogue over the
    columns reading column results at their store index, never a row result), or None."""
    part = group.columns
    if node.is_reduction:
        return _column_part(group, node, config)
    if node.ranges != part.ranges or node.inner:
        return None
    inside = {n.name: n for n in group.nodes}
    for name in node.read_names() & set(inside):
        if name not in part.names or any(idx != inside[name].store_index for idx in node.reads[name]):
            return None
    return part


def _join_columns(group, node, config):
    if group.columns is None:
        group.columns = node.column_part
        log.info("%s: row+column reduction: %s keeps %d column accumulators per thread (%d threads) "
                 "updated in %s's row loop; the input is read once", group.writes, node.name,
                 node.ranges[0], kernel_threads(config), group.columns.anchor)
    group.columns.names.append(node.name)


# chunked outer reductions: least contiguous run per reduction step, largest chunk (stack arrays)
MIN_CHUNK, MAX_CHUNK = 512, 4096
LANE_QUANTUM = 16   # a chunk of a kept dim shorter than MIN_CHUNK: a multiple of 16 lanes (a 64-byte line)


# reductions whose accumulation vectorizes (an OpenMP reduction clause); a scalar one (argmax,
# bool max/min) would take the producer's loop down with it
_MERGEABLE = {"sum", "prod", "max", "min", "any", "all"}


def accumulates_in_producer(group, node, config):
    """(consumer, reason): the reduction directly after inner pointwise `node` in `group` and why
    it may not accumulate inside `node`'s loop (reason None: it may). It may when it has the same
    reduction ranges and loop variables, reads `node` only at `node`'s own index (the element
    the producer has just written), vectorizes, and neither reads through a computed index nor
    could write tdbg_status (a bounds check or an injected bug). consumer is None when the next
    node is no reduction reading `node`."""
    pos = next(i for i, n in enumerate(group.nodes) if n is node)
    nxt = group.nodes[pos + 1] if pos + 1 < len(group.nodes) else None
    if nxt is None or not nxt.is_reduction or node.name not in nxt.reads:
        return None, None
    data = nxt.buffer.data
    producer_vars = [v for v in node.index if v.is_Symbol and v.name.startswith("r")]
    indices = [i for n in (node, nxt) for idxs in n.reads.values() for i in idxs]
    if group.lane is not None or group.columns is not None:
        reason = "the group runs chunked or row+column"
    elif nxt.rranges != node.rranges or [v for v in nxt.rindex if v.is_Symbol] != producer_vars:
        reason = f"reduction ranges {nxt.rranges} differ from {node.rranges}"
    elif any(i != node.store_index for i in nxt.reads[node.name]):
        reason = f"it reads {node.name} at another index"
    elif data.reduction_type not in _MERGEABLE or (data.reduction_type in ("max", "min") and data.src_dtype == torch.bool):
        reason = f"a {data.reduction_type} reduction would make the loop scalar"
    elif any(s.name.startswith("indirect") for i in indices for s in i.free_symbols) or config.inject_bug is not None:
        reason = "a computed index or an injected bug may write tdbg_status"
    else:
        reason = None
    return nxt, reason


def kernel_threads(config) -> int:
    if config.num_threads:
        return config.num_threads
    import torch
    return torch.get_num_threads()


@dataclass
class Lane:
    """Loop order of a chunked outer reduction: the last kept dim `var` runs in chunks of `chunk`
    (the parallel loop over `base`); inside a chunk, the reduction loops run outside and the
    contiguous loop over `var` ("lane loop", from `base` to `end`) inside."""
    var: str
    size: int
    chunk: int
    arrays: dict = field(default_factory=dict)   # codegen: node name -> its per-lane array element

    @property
    def base(self):
        return f"{self.var}c"

    @property
    def offset(self):
        return f"({self.var} - {self.base})"

    @property
    def end(self):
        if isinstance(self.size, int) and self.size % self.chunk == 0:
            return f"{self.base} + {self.chunk}"
        size = ir.csize(self.size)
        return f"({self.base} + {self.chunk} < {size} ? {self.base} + {self.chunk} : {size})"


def plan_lanes(group: KernelGroup, config):
    """A Lane when `group` reduces over a non-contiguous dim while its last kept dim is the
    contiguous one in what the reductions read (x.sum(0), mean over a middle dim), else None.
    Reads disagree when inputs come in two layouts (ConvNeXt's layer-scale gradient multiplies an
    NCHW by an NHWC tensor and sums over N, H, W): the order that reads more of them contiguously
    wins, rows on a tie. A chunk keeps the strided reads' cache lines in use across the
    reduction steps; the row order streams every strided input once per kept element."""
    ranges, nodes = group.ranges, group.nodes
    # symbolic sizes: decided on the hints; the chunked loops bound every chunk by the size
    if not ranges or ir.hint(ranges[-1]) < 8 or any(n.inner for n in nodes) or not any(n.is_reduction for n in nodes):
        return None
    x = ir.index_var("x", len(ranges) - 1)
    along_rows = along_lanes = 0
    for n in (n for n in nodes if n.is_reduction):
        rvars = [v for v in n.rindex if v.is_Symbol]
        for idx in (i for idxs in n.reads.values() for i in idxs):
            if not rvars or rvars[-1] not in idx.free_symbols:
                continue
            if coefficient(idx, rvars[-1]) == 1:
                along_rows += 1
            elif coefficient(idx, x) == 1:
                along_lanes += 1
    if along_lanes <= along_rows:
        return None
    size, threads = ir.hint(ranges[-1]), kernel_threads(config)
    chunk = min(size, MAX_CHUNK)
    if size >= 2 * LANE_QUANTUM and math.prod(map(ir.hint, ranges[:-1])) < threads:
        # split the kept dim between the threads, in runs of at least MIN_CHUNK elements where it
        # has that many (else one chunk of 96 channels would run the whole kernel on one thread)
        least = MIN_CHUNK if size > MIN_CHUNK else LANE_QUANTUM
        per_thread = -(-size // threads)
        chunk = min(MAX_CHUNK, max(least, -(-per_thread // LANE_QUANTUM) * LANE_QUANTUM), size)
    log.info("%s: outer reduction: chunks of %d along x%d, reduction loops outside", group.writes, chunk, len(ranges) - 1)
    return Lane(f"x{len(ranges) - 1}", ranges[-1], chunk)


def eliminate_dead(operations, graph_outputs):
    """Drop computed buffers and side-effect-free extern calls nothing needs."""
    needed = {_buffer_of(o).name for o in graph_outputs if isinstance(o, ir.IRNode)}
    kept = []
    for op in reversed(operations):
        if isinstance(op, ExternKernel):
            live = op.mutated or any(b.name in needed for b in op.outputs)
            if live:
                needed.update(_buffer_of(x).name for x in op.inputs)
        else:
            live = op.name in needed
            if live:
                handler = _ReadsOps()
                _collect(op, handler)
                needed.update(handler.reads)
        if live:
            kept.append(op)
        else:
            log.info("dead buffer eliminated: %s", op.name)
    return kept[::-1]


def _collect(buffer, handler):
    data = buffer.data
    index = [ir.index_var("x", i) for i in range(len(data.ranges))]
    if isinstance(data, Reduction):
        data.inner_fn(handler, index, [ir.index_var("r", i) for i in range(len(data.reduction_ranges))])
    else:
        data.inner_fn(handler, index)


# an inner pointwise node read only inside its kernel becomes a per-row scratch array on the
# stack of the thread running the outer loop; beyond this size it stays a heap buffer
SCRATCH_BYTES = 1 << 16


def _mark_locals(items, graph_outputs):
    """A node is local (never allocated) when it is no graph output and only its own group reads
    it: a C++ temporary, or for an inner pointwise a scratch array of one outer iteration."""
    outputs = {_buffer_of(o).name for o in graph_outputs if isinstance(o, ir.IRNode)}
    readers: dict = {}
    for pos, item in enumerate(items):
        nodes = item.nodes if isinstance(item, KernelGroup) else [item]
        for n in nodes:
            for name in n.read_names():
                readers.setdefault(name, set()).add(pos)
    for pos, item in enumerate(items):
        if isinstance(item, KernelGroup):
            for n in item.nodes:
                only_here = n.name not in outputs and readers.get(n.name, set()) <= {pos}
                n.local = only_here and (not n.inner or _scratch_bytes(n) <= SCRATCH_BYTES)


def _scratch_bytes(node) -> int:
    if not all(ir.is_static(r) for r in node.rranges):   # a stack array needs a size known here
        return SCRATCH_BYTES + 1
    return math.prod(node.rranges) * node.buffer.dtype.itemsize


@dataclass
class MemoryPlan:
    """Per item: buffers to allocate before it (name, reused name or None) and to free after."""
    allocs: list
    frees: list
    reused: set = field(default_factory=set)


def plan_memory(items, graph_inputs, graph_outputs) -> MemoryPlan:
    """Free each buffer after its last use; a new buffer takes the storage of a dead one with
    the same size, stride and dtype (never an input, an output, an extern's result or input)."""
    outputs = {_buffer_of(o).name for o in graph_outputs if isinstance(o, ir.IRNode)}
    inputs = {b.name for b in graph_inputs}
    last_use: dict = {}
    for pos, item in enumerate(items):
        nodes = item.nodes if isinstance(item, KernelGroup) else [item]
        for n in nodes:
            for name in n.read_names():
                last_use[name] = pos
    allocs, frees, pool, reused = [], [], {}, set()
    locals_ = {n.name for it in items if isinstance(it, KernelGroup) for n in it.nodes if n.local}
    extern_read = {name for it in items if isinstance(it, ExternNode) for name in it.read_names()}
    for pos, item in enumerate(items):
        here = []
        if isinstance(item, KernelGroup):
            for n in item.nodes:
                if n.local:
                    continue
                layout = n.buffer.layout
                key = (layout.size, layout.stride, layout.dtype)
                reuse = pool.get(key, [None]).pop() if pool.get(key) else None
                here.append((n.name, reuse))
                if reuse is not None:
                    reused.add(reuse)
                last_use.setdefault(n.name, pos)
        allocs.append(here)
        dead = [name for name, last in last_use.items() if last == pos and name not in outputs and name not in inputs]
        written = item.writes if isinstance(item, KernelGroup) else item.writes
        dead += [w for w in written if w not in last_use and w not in outputs]
        dead = [name for name in dead if name not in locals_]
        frees.append(sorted(set(dead)))
        for name in dead:
            node = _find(items, name)
            # an extern's result may alias what it read (in-place ops, views): never recycle that
            if node is not None and not node.local and name not in extern_read:
                layout = node.buffer.layout
                pool.setdefault((layout.size, layout.stride, layout.dtype), []).append(name)
    return MemoryPlan(allocs, frees, reused)


def _find(items, name):
    for item in items:
        if isinstance(item, KernelGroup):
            for n in item.nodes:
                if n.name == name:
                    return n
    return None


def kernel_name(group: KernelGroup, n: int) -> str:
    names = sorted({op_name(o.target) for o in group.origins() if getattr(o, "op", "") == "call_function"})
    return "cpp_fused_" + "_".join(names[:8] + ([] if names else ["kernel"])) + f"_{n}"
