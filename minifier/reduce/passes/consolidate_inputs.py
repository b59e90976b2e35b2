"""Consolidate inputs: inputs with identical contents (same bytes, shape, stride, dtype) are
read through one input. All duplicate groups at once first, then one group at a time."""
from tdbg.minifier.reduce.surgery import merge_inputs


def _groups(case) -> list:
    by_content = {}
    for s in case.inputs:
        if s.is_tensor:
            by_content.setdefault((s.sha, s.shape, s.stride, s.dtype, s.requires_grad), []).append(s.name)
    return [g for g in by_content.values() if len(g) > 1]


def consolidate_inputs(state) -> None:
    with state.strategy("Consolidate inputs"):
        groups = _groups(state.current)
        if not groups or state.test(merge_inputs(state.current, groups)):
            return
        for group in groups:
            state.test(merge_inputs(state.current, [group]))
