"""Remove unused inputs: drop placeholders that no node reads."""
from tdbg.minifier.reduce.surgery import drop_unused_inputs


def remove_unused_inputs(state) -> None:
    with state.strategy("Remove unused inputs"):
        state.test(drop_unused_inputs(state.current))
