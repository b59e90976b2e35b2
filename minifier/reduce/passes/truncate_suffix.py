"""Truncate suffix: keep only a prefix of the compute nodes (its loose ends become outputs).

Granularity G is the step between cut points, from the largest power of two down to 1; the
shortest prefix that still fails wins. A cut at or below the longest prefix that already passed
is not tried: its nodes are a subset of a prefix without the failure, so it would almost always
pass too, and with the culprit near the end trying them made this pass cost one query per node
(971 aten nodes of a BERT stack: ~970 queries of several seconds each) instead of one or two per
granularity. Delta debugging, which follows, still tries subsets that do not start at the top.
"""
from tdbg.minifier.reduce.surgery import keep_only, names


def truncate_suffix(state) -> None:
    g = 1 << max(len(state.current.compute_nodes()) - 1, 0).bit_length() >> 1
    passed = 0   # nodes in the longest prefix known to pass (prefixes survive adoption unchanged)
    while g >= 1:
        state.granularity(g)
        with state.strategy("Truncate suffix", g):
            order = names(state.current.compute_nodes())
            for cut in range(g, len(order), g):
                if cut <= passed:
                    continue
                if state.test(keep_only(state.current, order[:cut], state.values(), state.store)):
                    break
                passed = cut
        g //= 2
