"""Loop merging: a pointwise kernel's short innermost loop joins the loop outside it.

An NCHW training graph's kernels over [N, C, 14, 14] or [N, C, 7, 7] activations loop 14 or 7
times innermost: a 16-lane vector loop never runs and every element takes the scalar remainder
(EfficientNet-b0's batch-norm backward kernels). When every access of every node of a group
walks the last two loops as one (coefficient of the outer = its trip count x coefficient of the
inner, for every load and store; broadcasts have 0 for both), the two become one loop over their
product: [2, 672, 14, 14] runs as [2, 672, 196].

Contract of `merge_loops(group)`: changes nothing unless the group is pointwise (no reduction,
no inner loop, no chunked lane, no column part) and no node uses a loop index as a value
(`index_expr`: iota, masks of pads, random offsets); otherwise, while the innermost loop is
shorter than MERGE_BELOW and the pair merges, it rewrites the group's ranges, each node's
ranges, store index and recorded reads, and appends the substitution to the node's `remaps`
(SchedulerNode.body applies them to every index its loads compute).
"""
from __future__ import annotations

import sympy

from . import ir
from .logs import get_logger

log = get_logger("schedule")
# an innermost loop of at least 4 x 16 lanes gains little from growing
MERGE_BELOW = 64


def merge_loops(group) -> None:
    if not _eligible(group):
        return
    while len(group.ranges) >= 2 and group.ranges[-1] < MERGE_BELOW:
        i = len(group.ranges) - 2
        outer, inner = ir.index_var("x", i), ir.index_var("x", i + 1)
        if not all(_walks_as_one(e, outer, inner, group.ranges[-1]) for n in group.nodes for e in _accesses(n)):
            return
        ranges = (*group.ranges[:i], group.ranges[i] * group.ranges[i + 1])
        subs = {outer: sympy.Integer(0), inner: outer}
        log.info("%s: loops %s merged into %d", [n.name for n in group.nodes], list(group.ranges[i:]), ranges[-1])
        for n in group.nodes:
            n.remaps.append(subs)
            n.store_index = sympy.expand(n.store_index.subs(subs, simultaneous=True))
            n.reads = {name: [sympy.expand(e.subs(subs, simultaneous=True)) for e in idxs]
                       for name, idxs in n.reads.items()}
            n.ranges = ranges
        group.ranges = ranges


def _eligible(group) -> bool:
    if group.lane is not None or group.columns is not None:
        return False
    if any(n.inner or n.is_reduction or n.index_exprs for n in group.nodes):
        return False
    return all(isinstance(r, int) for r in group.ranges) and all(n.ranges == group.ranges for n in group.nodes)


def _accesses(node):
    yield node.store_index
    for idxs in node.reads.values():
        yield from idxs


def _walks_as_one(expr, outer, inner, inner_size) -> bool:
    a, b = ir.coefficient(expr, outer), ir.coefficient(expr, inner)
    return a is not None and b is not None and a == inner_size * b


class Remapped:
    """An op handler that substitutes merged loop variables into every index (`load`,
    `index_expr`) and forwards everything else to `ops`."""

    def __init__(self, ops, remaps):
        self._ops, self._remaps = ops, remaps

    def _apply(self, index):
        for subs in self._remaps:
            index = sympy.sympify(index).subs(subs, simultaneous=True)
        return sympy.expand(index)

    def load(self, name, index):
        return self._ops.load(name, self._apply(index))

    def index_expr(self, expr, dtype):
        return self._ops.index_expr(self._apply(expr), dtype)

    def __getattr__(self, name):
        return getattr(self._ops, name)
