"""Shrink tensor shapes: cut input tensors down (leading slices, real values kept) while the
failure persists. A size shared by several inputs shrinks in all of them together first (so
broadcasting and same-shape ops stay valid), then in one input at a time; each size tries 1,
then halves. In a graph with symbolic sizes a symbolic dim stops at 2 (a size 1 or 0 would be
specialized, so the graph would no longer be the symbolic one that failed), and an int input that
is a symbol of that size (Dynamo passes a dynamic size as one), or an expression of such symbols
(a backward graph's `s21*s77`), shrinks with the tensors, so the graph stays consistent."""
from dataclasses import replace

from tdbg.minifier.artifacts.graph_io import size_of, symbol_sizes
from tdbg.minifier.reduce.surgery import replace_inputs, shrunk


def _sizes(case) -> list:
    return sorted({d for s in case.inputs if s.is_tensor for d in s.shape if d > 1}, reverse=True)


# the smallest size a symbolic dim shrinks to: ShapeEnv specializes sizes 0 and 1
SMALLEST_SYMBOLIC = 2


def _shrink(state, size: int, target: int, only=None):
    new = {}
    before = symbol_sizes(state.current.inputs)
    after = {sym: max(target, SMALLEST_SYMBOLIC) if value == size else value for sym, value in before.items()}
    for s in state.current.inputs:
        if s.is_tensor and (only is None or s.name == only) and size in s.shape:
            dyn = s.dynamic or (None,) * len(s.shape)
            sizes = tuple((max(target, SMALLEST_SYMBOLIC) if sym else target) if d == size else d
                          for d, sym in zip(s.shape, dyn))
            if sizes != tuple(s.shape):
                new[s.name] = shrunk(state.store, s, sizes)
        elif only is None and not s.is_tensor and s.dynamic and type(s.value) is int:
            # a symbol's int input, or one holding an expression of symbols (`s21*s77`)
            value = after.get(s.dynamic[0]) if s.dynamic[0].isidentifier() else size_of(s.dynamic[0], after)
            if value is not None and value != s.value and size_of(s.dynamic[0], before) == s.value:
                new[s.name] = replace(s, value=value)
    return replace_inputs(state.current, new) if new else None


def _targets(size: int) -> list:
    return [1] + ([size // 2] if size // 2 > 1 else [])


def shrink_shapes(state) -> None:
    with state.strategy("Shrink shapes"):
        for size in _sizes(state.current):
            holders = [s.name for s in state.current.inputs if s.is_tensor and size in s.shape]
            for only in [None] + (holders if len(holders) > 1 else []):
                if any(state.test(_shrink(state, size, t, only)) for t in _targets(size)):
                    break
