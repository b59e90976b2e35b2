"""Remove outputs: drop chunks of outputs (halves first, then single ones) and whatever only
computed them."""
from tdbg.minifier.reduce.surgery import drop_outputs, output_nodes


def remove_outputs(state) -> None:
    g = len(output_nodes(state.current)) // 2
    while g >= 1:
        state.granularity(g)
        with state.strategy("Remove outputs", g):
            start = 0
            while start < len(output_nodes(state.current)) and len(output_nodes(state.current)) > 1:
                if not state.test(drop_outputs(state.current, set(range(start, start + g)))):
                    start += g
        g //= 2
