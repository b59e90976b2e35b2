"""The loop types C++ code generation is made of, shared by codegen_cpp.py (`CppKernel`) and its
reduction mixin codegen_reduction.py (both import them from here; this module imports only the
op table): `CppVar` (a typed C++ temporary), `Block` (one C++ scope with its common-subexpression
cache), `Loop` / `LoopNest` (loops rendered apart from their bodies, so vectorization can split
the innermost one), `LoopFacts` (what decides whether a loop may be vectorized).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy
import torch

from .ir import cexpr, hint  # noqa: F401 (codegen_cpp and codegen_reduction import cexpr here)
from .ops import CPP_TYPES


def cpp_type(dtype) -> str:
    return CPP_TYPES[dtype]


def may_exceed(size, n) -> bool:
    """size > n, where a symbolic size counts as possibly larger (code for it must handle both)."""
    return size > n if isinstance(size, int) else True


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
        self.loop = False       # the body of a loop (loop_body), not just a nested scope

    def defines(self, var) -> bool:
        return var in self.cache.values()

    def lookup(self, expr):
        b = self
        while b is not None:
            if expr in b.cache:
                return b.cache[expr]
            b = b.parent
        return None


@dataclass
class Loop:
    var: str
    size: object          # the bound: an int, a sympy size expression, or a C++ expression
    pragma: str = ""
    start: str = "0"
    step: int = 1

    @property
    def trips(self) -> int:
        if isinstance(self.size, sympy.Basic):   # a symbolic bound: its hint (a heuristic's input)
            return -(-hint(self.size) // self.step)
        return -(-self.size // self.step) if isinstance(self.size, int) else 1

    def head(self) -> str:
        step = f"++{self.var}" if self.step == 1 else f"{self.var} += {self.step}"
        bound = cexpr(self.size) if isinstance(self.size, sympy.Basic) else self.size
        return f"for (int64_t {self.var} = {self.start}; {self.var} < {bound}; {step})"


@dataclass
class LoopNest:
    loops: list = field(default_factory=list)

    def render(self, body: list) -> list:
        lines = list(body)
        for loop in reversed(self.loops):
            head = [loop.pragma] if loop.pragma else []
            lines = head + [loop.head(), "{"] + ["    " + line for line in lines] + ["}"]
        return lines


def _contiguous(sizes):
    out, acc = [], 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= s
    return out[::-1]


@dataclass
class LoopFacts:
    """What a loop body contains that decides whether it may be vectorized."""
    reasons: list = field(default_factory=list)
    itemsizes: set = field(default_factory=set)
    stores: set = field(default_factory=set)          # buffers this loop writes
    foreign_reads: set = field(default_factory=set)   # buffers of this kernel it reads at another index

    def conflicts(self) -> list:
        """Reads of a buffer this same loop writes, at another index: lanes would read an element
        before the lane that writes it stores it. A buffer written by an earlier loop of the
        kernel is complete when this loop reads it, at any index."""
        return [f"reads {name}, which this loop writes, at another index"
                for name in sorted(self.foreign_reads & self.stores)]
