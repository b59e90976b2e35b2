"""Eliminate dead code: drop nodes whose results nothing uses (side-effecting ops stay)."""
from tdbg.minifier.reduce.surgery import eliminate_dead_code as dce


def eliminate_dead_code(state) -> None:
    with state.strategy("Eliminate dead code"):
        state.test(dce(state.current))
