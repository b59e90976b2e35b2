"""The engine: fixpoint, verdict cache, progress events, and the two-culprit chain."""
import torch

from tdbg.minifier.reduce.engine import minify, size_of
from mincases import chain, make_case, targets  # noqa: F401  (chain is a fixture)


def both_culprits(c):
    return torch.neg in targets(c) and torch.mul in targets(c)


def test_forty_node_chain_reduces_to_the_two_culprits(chain):
    case, store = chain
    assert len(case.compute_nodes()) == 40
    result = minify(case, both_culprits, store)
    assert sorted(map(str, targets(result.minimized))) == sorted(map(str, [torch.neg, torch.mul]))
    # each culprit reads inputs only: its recorded operand and y
    assert all(a.op == "placeholder" for n in result.minimized.compute_nodes() for a in n.all_input_nodes)
    assert result.minimized.num_inputs == 3
    assert all(s.shape == (1, 1) for s in result.minimized.inputs)


def test_pytorch_style_progress_lines(chain):
    case, store = chain
    events = []
    minify(case, both_culprits, store, on_event=events.append)
    texts = [e["text"] for e in events]
    assert texts[0] == "Started off with 43 nodes"
    assert "Trying granularity 32" in texts
    assert "Strategy: Truncate suffix (G: 32) (43 nodes, 2 inputs)" in texts
    assert any(t.startswith("SUCCESS: Went from 43 to ") for t in texts)
    assert events[-1]["event"] == "done"
    for e in events:
        if e["event"] == "success":
            assert e["after"] <= e["before"]


def test_every_adoption_shrinks_and_verdicts_are_cached(chain):
    case, store = chain
    seen = []

    def predicate(c):
        seen.append(c.key)
        return both_culprits(c)
    result = minify(case, predicate, store)
    assert len(seen) == len(set(seen)) == result.stats.queries  # never asked twice
    assert size_of(result.minimized) < size_of(case)
    assert result.stats.rounds >= 2  # the last round proves the fixpoint


def test_fixpoint_minimizing_a_minimal_case_asks_little():
    case, store = make_case(lambda x: torch.neg(x), torch.ones(1))
    result = minify(case, lambda c: torch.neg in targets(c), store)
    assert result.minimized is case
    assert result.stats.rounds == 1
    assert result.stats.queries <= 2


def test_max_queries_bounds_the_work(chain):
    case, store = chain
    result = minify(case, both_culprits, store, max_queries=5)
    assert result.stats.queries == 5
