"""`tdbg explain` on the seed toy_example and a recompiling script; the plain-word tables."""
import pytest

from tdbg.cli.console import exit_code
from tdbg.minifier.diagnose import explain

@pytest.mark.scenario("explain_toy")
def test_toy_example_three_graphs_two_breaks(scenarios):
    r = scenarios["explain_toy"]
    assert r.code == 0, r.output          # 2 breaks within --max-graph-breaks 2
    doc = r.json
    assert (doc["schema"], doc["version"]) == ("tdbg.explain", 2)
    (fn,) = doc["functions"]
    assert (fn["function"], fn["graph_count"], fn["graph_breaks"]) == ("toy_example", 3, 2)
    assert [(b["line"], b["reason"]) for b in fn["breaks"]] == [
        ('examples/toy_example.py:7  print("woo")', explain.plain_break_reason("builtin operator `print`")),
        ("examples/toy_example.py:8  if b.sum() < 0:", explain.plain_break_reason("generic_jump")),
    ]
    assert fn["graphs"][0]["ops"] == {"abs": 1, "add": 1, "truediv": 1}
    assert fn["graphs"][0]["lines"][0]["code"] == "x = a / (torch.abs(a) + 1)"
    assert fn["guards"]["tensors"][:2] == ["a", "b"]
    assert "data-dependent branch on a tensor value" in r.stdout
    assert "call to print()" in r.stdout


@pytest.mark.scenario("explain_recompile")
def test_recompiles_in_user_terms_and_threshold(scenarios):
    r = scenarios["explain_recompile"]
    assert r.code == exit_code("threshold")
    assert r.json["exceeded"] == ["2 recompile(s) > --max-recompiles 1"]
    (fn,) = r.json["functions"]
    assert [rc["changed"] for rc in fn["recompiles"]] == [
        "argument `x` changed size in dim 0: 8 -> 16", "argument `x` changed dtype: Float -> Double"]
    assert fn["recompiles"][0]["suggestion"].startswith("call torch._dynamo.mark_dynamic(x, 0)")
    assert "THRESHOLD EXCEEDED" in r.stdout


BREAKS = {
    "generic_jump TensorVariable()": "data-dependent branch",
    "Data-dependent branching": "data-dependent branch",
    "Unsupported Tensor.item() call with capture_scalar_outputs=False": ".item()",
    "Tensor.tolist() with non-integer tensor": ".tolist()",
    "Call to `torch._dynamo.graph_break()`": "explicit torch._dynamo.graph_break()",
    "Dynamo does not know how to trace builtin operator `len`": "builtin len()",
    "something new\nsecond line": "something new",
    # NumPy .item() on a tensor's quantile: a read into Python, not a data-dependent output shape
    "Data dependent operator\n  Explanation: Operator `aten._local_scalar_dense.default` has a non-Tensor output":
        "reads a tensor value into a Python number",
    "Dynamic shape operator\n  Explanation: Operator `aten.nonzero.default`'s output shape depends on input":
        "output shape depends on tensor values (aten.nonzero.default)",
}


@pytest.mark.parametrize("reason", sorted(BREAKS))
def test_break_reasons_in_plain_words(reason):
    assert BREAKS[reason] in explain.plain_break_reason(reason)


RECOMPILES = {
    "0/0: tensor 'a' size mismatch at index 1. expected 4, actual 5": "argument `a` changed size in dim 1: 4 -> 5",
    "0/1: tensor 'y' dtype mismatch. expected Float, actual Double": "argument `y` changed dtype: Float -> Double",
    "0/0: tensor 'a' requires_grad mismatch. expected requires_grad=0": "argument `a` changed requires_grad",
    "2/0: n == 2      # return y * n  # x.py:7 in f": "Python value `n` changed (the graph was specialised to 2)",
    "1/0: ___stack0 == -0.75     # if a.sum().item() > 0:  # x.py:4 in f": "computed by the previous graph changed",
    "0/0: len(L['xs']) == 3": "the length of xs changed (was 3)",
    "0/1: 2 <= L['x'].size()[0] <= 4096  # return F.linear(x)  # m.py:3 in f":
        "argument `x` left the size range 2..4096 in dim 0 that the compiled graph assumed",
    "0/0: tensor 'L['self']._modules['fc']._parameters['weight']' dtype mismatch. expected Float, actual Double":
        "argument `self.fc.weight` changed dtype: Float -> Double",
    "0/0: GLOBAL_STATE changed: grad_mode ": "grad mode changed",
}


@pytest.mark.parametrize("reason", sorted(RECOMPILES))
def test_recompile_reasons_in_user_terms(reason):
    assert RECOMPILES[reason] in explain.plain_recompile(reason)["changed"]


def test_thresholds():
    report = {"totals": {"graph_breaks": 2, "recompiles": 0}}
    assert explain.exceeded(report, 2, 0) == []
    assert explain.exceeded(report, 1, None) == ["2 graph break(s) > --max-graph-breaks 1"]


def test_item_break_is_not_called_an_output_shape_op():
    reason = explain.plain_break_reason("Data dependent operator\n  Explanation: Operator "
                                        "`aten._local_scalar_dense.default` has a non-Tensor output")
    assert "shape" not in reason


def test_guard_summary_uses_the_users_names():
    verdict = {"graphs": [{"index": 0, "frame": "forward", "ops": ["linear"], "graph_break": False}],
               "guards": [{"frame": "forward", "total": 3, "by_kind": {"TENSOR_MATCH": 3},
                           "tensors": ["L['self']._modules['fc']._parameters['weight']",
                                       "L['self']._modules['fc']._buffers['mask']", "L['x']"]}]}
    (fn,) = explain.build_report(verdict)["functions"]
    assert fn["guards"]["tensors"] == ["self.fc.weight", "self.fc.mask", "x"]


def test_fullgraph_error_is_reported_as_the_break_that_stopped_the_run():
    verdict = {"status": "failed", "stage": "dynamo", "graphs": [], "guards": [], "recompiles": [],
               "error": {"type": "Unsupported", "source": "s.py:6 in f: if y.sum() > 0:",
                         "message": "Unsupported: Data-dependent branching\n  Explanation: ..."}}
    report = explain.build_report(verdict)
    assert report["stopped_by"]["line"] == "s.py:6  if y.sum() > 0:"
    assert report["stopped_by"]["reason"].startswith("data-dependent branch on a tensor value")
    (fn,) = report["functions"]
    assert (fn["function"], fn["graph_breaks"], fn["breaks"][0]["stopped_compilation"]) == ("f", 1, True)
    assert report["totals"]["graph_breaks"] == 1


def test_other_dynamo_errors_are_not_breaks():
    verdict = {"status": "failed", "stage": "dynamo", "graphs": [],
               "error": {"type": "InternalTorchDynamoError", "source": "s.py:6 in f: y = g(x)", "message": "boom"}}
    assert explain.build_report(verdict)["stopped_by"] is None
