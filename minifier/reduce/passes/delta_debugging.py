"""Delta debugging (classic ddmin, Zeller): keep one chunk of the compute nodes, else drop one
chunk (the complement), else split finer. Values a kept node reads from a dropped node become
inputs holding their recorded values, so culprits far apart in the graph can be kept together
without everything between them.
"""
from tdbg.minifier.reduce.surgery import keep_only, names


def _chunks(items: list, n: int) -> list:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return [c for c in out if c]


def _try(state, keep) -> bool:
    return state.test(keep_only(state.current, keep, state.values(), state.store))


def delta_debugging(state) -> None:
    items = names(state.current.compute_nodes())
    n = 2
    while len(items) >= 2 and not state.exhausted:
        chunks = _chunks(items, n)
        g = len(chunks[0])
        state.granularity(g)
        with state.strategy("Delta debugging", g):
            subset = next((c for c in chunks if _try(state, c)), None)
            complement = None
            if subset is None and len(chunks) > 2:
                complement = next((c for c in chunks
                                   if _try(state, [x for x in items if x not in c])), None)
        if subset is not None:
            items, n = names(state.current.compute_nodes()), 2
        elif complement is not None:
            items, n = names(state.current.compute_nodes()), max(n - 1, 2)
        elif n >= len(items):
            break
        else:
            n = min(len(items), 2 * n)
