"""The minifier's engine: passes propose smaller graphs, one engine decides.

A pass is a function `pass_fn(state)` that builds candidate Cases and offers each through
`state.test(candidate)`. The engine answers with a verdict (cached by the candidate's hash) and,
when the candidate still fails the same way and is smaller, adopts it as `state.current` at
once — so a pass always works on the latest graph (Hypothesis-style shrinking: no restart from
the first strategy after each success, no re-check of a cached verdict). Rounds over the PASSES
table repeat until one round changes nothing: a fixpoint.

"Smaller" is the order (compute nodes, inputs, input elements): every adoption strictly
decreases it, which guarantees termination.

The engine does not print: it reports events (dicts with "event" and a "text" line in the
format PyTorch's minifier users know) to `on_event`.
"""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from tdbg.minifier.artifacts.graph_io import Case, TensorStore
from tdbg.minifier.reduce.surgery import record_values

Event = dict


def size_of(case: Case) -> tuple:
    elements = sum(math.prod(s.shape) for s in case.inputs if s.is_tensor)
    return (len(case.compute_nodes()), case.num_inputs, elements)


@dataclass
class Stats:
    queries: int = 0          # verdicts asked of the test function
    cache_hits: int = 0
    adopted: int = 0
    rounds: int = 0
    seconds: float = 0.0
    per_pass: dict = field(default_factory=dict)  # name -> [tried, adopted]


class State:
    """What a pass sees: the current case, recorded values, and `test`."""

    def __init__(self, case: Case, test: Callable[[Case], bool], store: TensorStore,
                 on_event: Optional[Callable[[Event], None]] = None, max_queries: Optional[int] = None):
        self.current = case
        self.store = store
        self._test = test
        self._on_event = on_event or (lambda e: None)
        self._verdicts: dict = {case.key: True}
        self._values: dict = {}
        self._pass = ""
        self.max_queries = max_queries
        self.stats = Stats()

    # ------------------------------------------------------------------ for passes
    def test(self, candidate: Optional[Case]) -> bool:
        """True (and the candidate becomes current) if it is smaller and fails the same way."""
        if candidate is None or size_of(candidate) >= size_of(self.current):
            return False
        verdict = self._verdicts.get(candidate.key)
        if verdict is None:
            if self.exhausted:
                return False
            self.stats.queries += 1
            self._count(0)
            verdict = bool(self._test(candidate))
            self._verdicts[candidate.key] = verdict
        else:
            self.stats.cache_hits += 1
        if verdict:
            self.current = candidate
            self.stats.adopted += 1
            self._count(1)
        return verdict

    def values(self) -> dict:
        """Recorded value of every node of the current case ({} if it cannot run eagerly here)."""
        key = self.current.key
        if key not in self._values:
            try:
                self._values[key] = record_values(self.current, self.store)
            except Exception:
                self._values[key] = {}
        return self._values[key]

    @property
    def exhausted(self) -> bool:
        return self.max_queries is not None and self.stats.queries >= self.max_queries

    def granularity(self, g: int) -> None:
        self.emit("granularity", f"Trying granularity {g}", granularity=g)

    @contextlib.contextmanager
    def strategy(self, name: str, g: int = 1):
        """Bracket one attempt of a strategy: Strategy line, then SUCCESS or FAIL."""
        before = self.current
        self._pass = name
        self.emit("strategy", f"Strategy: {name} (G: {g}) ({before.num_nodes} nodes, "
                  f"{before.num_inputs} inputs)", strategy=name, granularity=g,
                  nodes=before.num_nodes, inputs=before.num_inputs)
        yield
        if self.current is before:
            self.emit("fail", f"FAIL: {name}", strategy=name)
        else:
            a, b = size_of(before), size_of(self.current)
            detail = ""
            if before.num_nodes == self.current.num_nodes:
                detail = (f" ({a[0]} -> {b[0]} ops)" if a[0] != b[0] else
                          f" ({a[1]} -> {b[1]} inputs)" if a[1] != b[1] else
                          f" (input elements {a[2]} -> {b[2]})")
            self.emit("success", f"SUCCESS: Went from {before.num_nodes} to "
                      f"{self.current.num_nodes} nodes{detail}", strategy=name,
                      before=before.num_nodes, after=self.current.num_nodes,
                      inputs=self.current.num_inputs)

    # ------------------------------------------------------------------ internals
    def emit(self, event: str, text: str, **data) -> None:
        self._on_event({"event": event, "text": text, **data})

    def _count(self, index: int) -> None:
        row = self.stats.per_pass.setdefault(self._pass or "?", [0, 0])
        row[index] += 1


@dataclass
class Result:
    original: Case
    minimized: Case
    stats: Stats


def minify(case: Case, test: Callable[[Case], bool], store: TensorStore, *,
           passes=None, on_event: Optional[Callable[[Event], None]] = None,
           max_queries: Optional[int] = None) -> Result:
    """Shrink `case` while `test(candidate)` says it fails the same way. `case` must fail."""
    from tdbg.minifier.reduce.passes import PASSES
    rows = PASSES if passes is None else passes
    state = State(case, test, store, on_event, max_queries)
    start = time.perf_counter()
    state.emit("started", f"Started off with {case.num_nodes} nodes", nodes=case.num_nodes,
               inputs=case.num_inputs)
    while not state.exhausted:
        state.stats.rounds += 1
        before = size_of(state.current)
        for _name, fn, _description in rows:
            fn(state)
        if size_of(state.current) == before:
            break
    state.stats.seconds = time.perf_counter() - start
    state.emit("done", f"Made {state.stats.queries} queries; minimized to "
               f"{state.current.num_nodes} nodes, {state.current.num_inputs} inputs",
               nodes=state.current.num_nodes, inputs=state.current.num_inputs,
               queries=state.stats.queries, seconds=state.stats.seconds)
    return Result(case, state.current, state.stats)
