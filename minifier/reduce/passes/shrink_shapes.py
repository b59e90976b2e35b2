"""Shrink tensor shapes: cut input tensors down (leading slices, real values kept) while the
failure persists. A size shared by several inputs shrinks in all of them together first (so
broadcasting and same-shape ops stay valid), then in one input at a time; each size tries 1,
then halves. In a graph with symbolic sizes a symbolic dim stops at 2 (a size 1 or 0 would be
specialized, so the graph would no longer be the symbolic one that failed), and an int input that
is a symbol of that size (Dynamo passes a dynamic size as one) shrinks with the tensors, so the
graph stays consistent."""
from dataclasses import replace

from tdbg.minifier.reduce.surgery import replace_inputs, shrunk


def _sizes(case) -> list:
    return sorted({d for s in case.inputs if s.is_tensor for d in s.shape if d > 1}, reverse=True)


# the smallest size a symbolic dim shrinks to: ShapeEnv specializes sizes 0 and 1
SMALLEST_SYMBOLIC = 2


def _shrink(state, size: int, target: int, only=None):
    new = {}
    for s in state.current.inputs:
        if s.is_tensor and (only is None or s.name == only) and size in s.shape:
            dyn = s.dynamic or (None,) * len(s.shape)
            sizes = tuple((max(target, SMALLEST_SYMBOLIC) if sym else target) if d == size else d
                          for d, sym in zip(s.shape, dyn))
            if sizes != tuple(s.shape):
                new[s.name] = shrunk(state.store, s, sizes)
        elif only is None and not s.is_tensor and s.dynamic and s.value == size and type(size) is type(s.value):
            if max(target, SMALLEST_SYMBOLIC) != size:
                new[s.name] = replace(s, value=max(target, SMALLEST_SYMBOLIC))
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
