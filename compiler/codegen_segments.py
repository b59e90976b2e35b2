"""Innermost-loop segments: a masked read (constant_pad_nd, cat) split into mask-free loops.

A pad of the innermost dim (an NCHW image padded in W) or a cat along it reads its input under
a mask that compares the innermost loop variable with constants. The kernel body is then an
`if (mask) { load; ... }` per element, which g++ will not vectorize ("control flow in loop"):
EfficientNet-b0's training pad+SiLU kernels ran scalar (~8 ns per element, 20 ms for one
[2, 96, 113, 113] pad). Cut at the constants of those comparisons, the innermost loop becomes a
few loops over [lo, hi) ranges in each of which every such comparison has one known value: the
masked reads run unconditionally (or not at all), a mask on an outer variable only stays (an
invariant `if` that g++ unswitches), and each loop vectorizes.

`MaskSegments` watches the ops of one kernel: `index_expr` and integer `constant` results are
remembered by their C++ name; a comparison of `v + c` (v the watched innermost variable, c an
integer) with a remembered constant records a cut, and, while a segment is set, is answered
statically (`true` / `false`). The kernel generates its body once to collect the cuts, then
once per segment (codegen_cpp.CppKernel.loop_nest).
"""
from __future__ import annotations

import sympy
import torch

from .ir import ModIndex, FloorDiv

MAX_SEGMENTS = 6   # body copies per kernel: a cat of up to six parts, a pad on both sides


class MaskSegments:
    def __init__(self):
        self.var = None          # the watched innermost loop variable's name, or None
        self.segment = None      # (lo, hi) while a segment's body is generated
        self.syms, self.consts, self.static = {}, {}, {}
        self.cuts = set()

    def watch(self, var: str):
        self.var = var

    def note_index(self, name: str, expr):
        if self.var is not None:
            self.syms[name] = sympy.sympify(expr)

    def note_constant(self, name: str, value, dtype):
        if self.var is not None and not dtype.is_floating_point and dtype != torch.bool:
            self.consts[name] = int(value)

    def compare(self, op: str, a, b):
        """True / False when `a op b` is known over the current segment, else None (a cut is
        recorded when `a` is `v + c` and `b` a constant)."""
        threshold = self._threshold(op, a, b)
        if threshold is None:
            return None
        below, t = threshold           # the predicate is v < t (below) or v >= t
        self.cuts.add(t)
        if self.segment is None:
            return None
        lo, hi = self.segment
        if hi <= t or lo >= t:
            return (hi <= t) == below
        return None

    def _threshold(self, op, a, b):
        expr, k = self.syms.get(getattr(a, "name", None)), self.consts.get(getattr(b, "name", None))
        if expr is None or k is None or op not in ("lt", "le", "gt", "ge"):
            return None
        if expr.has(ModIndex, FloorDiv) or {s.name for s in expr.free_symbols} != {self.var}:
            return None
        v = next(iter(expr.free_symbols))
        c = expr - v
        if not c.is_Integer:
            return None
        t = k - int(c) + (1 if op in ("le", "gt") else 0)
        return op in ("lt", "le"), t

    def segments(self, size) -> list | None:
        """[(lo, hi)] covering [0, size), cut at the recorded thresholds; None when there is
        nothing to cut or too much."""
        if not isinstance(size, int):
            return None
        cuts = sorted(t for t in self.cuts if 0 < t < size)
        if not cuts or len(cuts) + 1 > MAX_SEGMENTS:
            return None
        bounds = [0, *cuts, size]
        return list(zip(bounds, bounds[1:]))
