"""Truncate suffix: keep only a prefix of the compute nodes (its loose ends become outputs).

Granularity G is the step between cut points, from the largest power of two down to 1; the
shortest prefix that still fails wins.
"""
from tdbg.minifier.reduce.surgery import keep_only, names


def truncate_suffix(state) -> None:
    g = 1 << max(len(state.current.compute_nodes()) - 1, 0).bit_length() >> 1
    while g >= 1:
        state.granularity(g)
        with state.strategy("Truncate suffix", g):
            order = names(state.current.compute_nodes())
            for cut in range(g, len(order), g):
                if state.test(keep_only(state.current, order[:cut], state.values(), state.store)):
                    break
        g //= 2
