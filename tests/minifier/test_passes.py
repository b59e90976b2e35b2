"""Each strategy alone, against a pure predicate (no compiler, no workers)."""
import pytest
import torch

from tdbg.minifier.reduce.engine import State
from tdbg.minifier.reduce.passes import PASSES, BY_NAME
from mincases import OPS, chain, make_case, targets  # noqa: F401  (chain is a fixture)


def run_pass(name, case, store, predicate):
    state = State(case, predicate, store)
    BY_NAME[name](state)
    return state


def has(*ops):
    return lambda c: all(op in targets(c) for op in ops)


def test_table_rows_are_named_documented_functions():
    assert [row[0] for row in PASSES] == list(BY_NAME)
    assert len(PASSES) == 9
    for name, fn, description in PASSES:
        assert callable(fn) and description
        assert fn.__module__.startswith("tdbg.minifier.reduce.passes.")


@pytest.mark.parametrize("name", [row[0] for row in PASSES])
def test_every_pass_leaves_a_minimal_case_alone(name):
    # a single op with one 1-element input: nothing any pass may remove
    case, store = make_case(lambda x: torch.neg(x), torch.ones(1))
    state = run_pass(name, case, store, has(torch.neg))
    assert state.current is case


@pytest.mark.parametrize("name", [row[0] for row in PASSES])
def test_every_pass_only_adopts_failing_candidates(name, chain):
    case, store = chain
    offered = []

    def predicate(c):
        offered.append(c)
        return False
    state = run_pass(name, case, store, predicate)
    assert state.current is case
    assert all(c.key != case.key for c in offered)


def test_truncate_suffix_keeps_the_shortest_failing_prefix(chain):
    case, store = chain
    state = run_pass("truncate_suffix", case, store, has(torch.neg))
    assert targets(state.current)[-1] is torch.neg
    assert len(targets(state.current)) == 8  # the 7 ops before neg, and neg


def test_delta_debugging_keeps_two_far_apart_culprits(chain):
    case, store = chain
    state = run_pass("delta_debugging", case, store, has(torch.neg, torch.mul))
    assert sorted(map(str, targets(state.current))) == sorted(map(str, [torch.neg, torch.mul]))


def test_delta_debugging_uses_complements():
    # failure needs any 3 of the 4 ops: no half fails, only complements (drop one quarter) do
    def fn(x):
        return torch.sin(x), torch.cos(x), torch.tanh(x), torch.relu(x)
    case, store = make_case(fn, torch.ones(2))
    state = run_pass("delta_debugging", case, store, lambda c: len(targets(c)) >= 3)
    assert len(targets(state.current)) == 3


def test_eliminate_dead_code():
    def fn(x):
        torch.sin(x)
        return (torch.cos(x),)
    case, store = make_case(fn, torch.ones(2))
    # symbolic_trace keeps the unused sin; the pass removes it
    assert torch.sin in targets(case)
    state = run_pass("eliminate_dead_code", case, store, has(torch.cos))
    assert targets(state.current) == [torch.cos]


def test_remove_unused_inputs():
    case, store = make_case(lambda x, y: torch.neg(x), torch.ones(2), torch.ones(3))
    state = run_pass("remove_unused_inputs", case, store, has(torch.neg))
    assert [s.name for s in state.current.inputs] == ["x"]


def test_consolidate_inputs_merges_identical_contents():
    case, store = make_case(lambda x, y, z: torch.add(x, y) * z, torch.ones(2), torch.ones(2), torch.zeros(2))
    state = run_pass("consolidate_inputs", case, store, has(torch.add))
    assert [s.name for s in state.current.inputs] == ["x", "z"]
    add = next(n for n in state.current.compute_nodes() if n.target is torch.add)
    assert [a.name for a in add.args] == ["x", "x"]


def test_remove_outputs():
    case, store = make_case(lambda x: (torch.sin(x), torch.neg(x), torch.cos(x)), torch.ones(2))
    state = run_pass("remove_outputs", case, store, has(torch.neg))
    assert targets(state.current) == [torch.neg]


def test_bypass_forwards_a_same_shaped_operand():
    case, store = make_case(lambda x: torch.neg(torch.relu(torch.sin(x))), torch.ones(2))
    state = run_pass("bypass_node", case, store, has(torch.neg))
    assert targets(state.current) == [torch.neg]
    assert state.current.compute_nodes()[0].args[0].op == "placeholder"


def test_bypass_refuses_operands_of_another_shape():
    case, store = make_case(lambda x: torch.neg(torch.sum(x, 0)), torch.ones(3, 2))
    state = run_pass("bypass_node", case, store, has(torch.neg))
    assert targets(state.current) == [torch.sum, torch.neg]


def test_inputize_replaces_a_prefix_by_its_recorded_value():
    x = torch.arange(4.0)
    case, store = make_case(lambda x: torch.neg(torch.cos(torch.sin(x))), x)
    state = run_pass("inputize", case, store, has(torch.neg))
    assert targets(state.current) == [torch.neg]
    (spec,) = state.current.inputs
    assert torch.equal(store.value(spec), torch.cos(torch.sin(x)))


def test_shrink_shapes_keeps_real_values_and_broadcasting():
    x1, x2 = torch.arange(8.0).reshape(1, 8), torch.arange(80.0).reshape(10, 8)
    case, store = make_case(lambda a, b: torch.maximum(b, torch.neg(a)), x1, x2)
    state = run_pass("shrink_shapes", case, store, has(torch.neg))
    shapes = [s.shape for s in state.current.inputs]
    assert shapes == [(1, 1), (1, 1)]
    assert [s.stride for s in state.current.inputs] == [(1, 1), (1, 1)]
    assert torch.equal(store.value(state.current.inputs[1]), torch.zeros(1, 1))


def test_shrink_shapes_keeps_integer_values():
    idx = torch.tensor([[5, 6], [7, 8]])
    case, store = make_case(lambda i: torch.neg(i), idx)
    state = run_pass("shrink_shapes", case, store, has(torch.neg))
    assert state.current.inputs[0].shape == (1, 1)
    assert store.value(state.current.inputs[0]).tolist() == [[5]]


def test_truncate_suffix_skips_cuts_below_a_prefix_that_passed():
    # the culprit is the last of 40 ops: each granularity tries only cuts past the longest
    # prefix that already passed (32, 36, 38, 39), not all 39 cut points
    def fn(x):
        for i in range(39):
            x = OPS[i % 5](x)
        return torch.neg(x)
    case, store = make_case(fn, torch.randn(2))
    state = run_pass("truncate_suffix", case, store, has(torch.neg))
    assert state.current is case
    assert (state.stats.queries, state.stats.cache_hits) == (4, 0)
