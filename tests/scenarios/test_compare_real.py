"""`tdbg compare` on real PyTorch bugs agrees with `tdbg run --check-accuracy`: never OK (exit 0)
where run exits 16, and it names the stage and op.

- #162151 (permute, then in-place writes into slices of the view): AOTAutograd's own aten graph
  is already wrong, so comparing the compiled graph with the aten graph shows nothing; compare
  judges the Dynamo graph against the aten graph (torch:inductor's AOT stage run eagerly, and
  torch:aot_eager, which is that stage) and names the Dynamo node and its line.
- the same bug with nothing returned: only the input written in place shows it, and the script
  fails on its own assert after the compiled call: compare still compares, and says so.
- #185517 (bf16 margin_ranking_loss): one rounding difference within bf16's tolerance flips a
  comparison (the mask the backward uses): the flip is the culprit, not drift.
"""
import os

import pytest

from tdbg.cli.console import exit_code

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
S = "tests/scenarios/scripts"
SLICE, MUTATE, MARGIN = (f"{S}/issue_162151_slice_write.py", f"{S}/issue_162151_mutation_only.py",
                         f"{S}/issue_185517_bf16_margin.py")
SETITEM_LINE = "issue_162151_slice_write.py:9 in foo: x[0] = x[0].t()"
MARGIN_LINE = ('issue_185517_bf16_margin.py:8 in fn: return torch.nn.functional.margin_ranking_loss(x, y, t, '
               'margin=1.7, reduction="mean")')
NEG = {"TDBG_INJECT_BUG": "neg:accuracy"}
CASES = {   # name -> (script, backend, environment, exit code of `run --check-accuracy`, of `compare`)
    "slice_inductor": (SLICE, "torch:inductor", {}, 16, 16),
    "slice_aot_eager": (SLICE, "torch:aot_eager", {}, 16, 16),
    # run's check once passed here: float64 flips like the compiled graph, and it excused the gradient
    "margin_inductor": (MARGIN, "torch:inductor", {}, 16, 16),
    "foo2_neg": ("examples/foo2.py", "inductor", NEG, 16, 16),
}


def _commands():
    for script, backend, env, _, _ in CASES.values():
        yield ("compare", script, "--backend", backend), dict(env, COLUMNS="200")
        yield ("run", script, "--backend", backend, "--check-accuracy"), env
    yield ("compare", MUTATE, "--backend", "torch:inductor"), {"COLUMNS": "200"}


@pytest.fixture(scope="module")
def runs(tdbg_runs):
    tdbg_runs.start(*_commands())
    return tdbg_runs


def _compare(runs, name):
    script, backend, env, _, _ = CASES[name]
    return runs(("compare", script, "--backend", backend), dict(env, COLUMNS="200"))


@pytest.mark.parametrize("name", list(CASES))
def test_compare_never_passes_what_run_fails(runs, name):
    script, backend, env, run_code, compare_code = CASES[name]
    ran = runs(("run", script, "--backend", backend, "--check-accuracy"), env)
    compared = _compare(runs, name)
    assert ran.code == run_code, ran.output
    assert compared.code == compare_code == compared.json["exit_code"], compared.output
    assert compared.code != 0 or ran.code != exit_code("accuracy")


@pytest.mark.parametrize("name", ["slice_inductor", "slice_aot_eager"])
def test_an_aotautograd_bug_is_named_at_its_stage_and_line(runs, name):
    r = _compare(runs, name)
    backend = CASES[name][1]
    assert r.code == exit_code("accuracy"), r.output
    [stage] = r.json["stages"]
    assert (stage["name"], stage["verdict"], stage["diverged"]) == ("g0_dynamo_c1", "aot", True)
    assert (stage["culprit"]["name"], stage["culprit"]["op"], stage["culprit"]["index"]) == ("setitem_1", "setitem", 6)
    assert stage["culprit"]["source"] == os.path.join(ROOT, S, SETITEM_LINE)
    # both the returned view and the input written in place differ, in the aten graph already
    assert [(v["path"], v["aot"]["diverges"], v["aot"]["abs_eager"]) for v in stage["values"]] == [
        ("out[0]", True, 2.0), ("input l_x_", True, 2.0)]
    assert stage["message"].startswith(
        "out[0] (max abs error 2), input l_x_ (max abs error 2) differ(s) between the aten graph (AOTAutograd, run "
        "eagerly) and the Dynamo graph run eagerly; the first Dynamo node whose graph prefix AOTAutograd gets wrong "
        "is setitem_1 (setitem)")
    # Inductor's AOT stage runs its own joint-graph passes before the aten graph exists
    who = "AOTAutograd or Inductor's joint-graph passes" if backend == "torch:inductor" else "AOTAutograd"
    assert f"g0_dynamo_c1 (Dynamo graph vs aten graph vs compiled, backend {backend}): ATEN GRAPH DIFFERS " \
           f"({who})" in r.stdout
    assert f"source: {S}/{SETITEM_LINE}" in r.stdout
    assert "AOTAutograd's aten graph already differs from the Dynamo graph" in r.json["message"]


def test_the_aot_eager_dynamo_graph_is_never_ok(runs):
    """torch:aot_eager has no AOT stage tdbg hooks, so its saved graph is the Dynamo graph itself
    (outputs only; its `x[0] = y` and method calls load back and run node by node): OUTPUTS DIFFER,
    never OK, and the stage check above names the bug."""
    r = _compare(runs, "slice_aot_eager")
    [g] = r.json["graphs"]
    assert (g["name"], g["verdict"], g["mode"]) == ("g0_dynamo_c1", "outputs_differ", "outputs"), g
    assert [(o["path"], o["abs_eager"], o["diverges"]) for o in g["outputs"]] == [
        ("out[0]", 2.0, True), ("input l_x_ (written)", 2.0, True)]     # the input written back differs too


def test_the_inductor_aten_graph_itself_matches_its_compiled_code(runs):
    """The per-node comparison is right that Inductor compiled its aten graph faithfully; the
    stage check is what tells the user that graph is already wrong."""
    r = _compare(runs, "slice_inductor")
    assert [(g["name"], g["verdict"]) for g in r.json["graphs"]] == [("g0_inference_c1", "ok")]
    # ... and says that this OK is no correct result
    assert "): OK AGAINST ITS ATEN GRAPH (which is wrong)" in r.stdout
    assert r.json["graphs"][0]["notes"][-1].endswith(
        "the aten graph itself differs from the Dynamo graph (g0_dynamo_c1 above), so OK here is not a correct result")
    assert r.json["script_run"]["stage"] == "script"   # the script's own assert, after the compiled call
    # the summary never counts it as ok, and the piped tables carry no 1000-column padding
    assert r.json["message"].startswith("1 graph(s): 1 matching only an aten graph that is itself wrong")
    assert [line for line in r.stdout.splitlines() if line != line.rstrip()] == []
    assert "the script failed after its compiled graphs ran at " in r.json["message"]
    assert r.json["message"].endswith("issue_162151_slice_write.py:17 in <module>: torch.testing.assert_close(res, "
                                      "cres): AssertionError: Tensor-likes are not close!")


def test_a_script_failing_after_the_compiled_call_is_still_compared(runs):
    r = runs(("compare", MUTATE, "--backend", "torch:inductor"), {"COLUMNS": "200"})
    assert r.code == exit_code("accuracy"), r.output
    assert "failed before there was anything to compare" not in r.output
    [stage] = r.json["stages"]
    assert (stage["verdict"], stage["culprit"]["name"]) == ("aot", "setitem_1")
    assert stage["culprit"]["source"] == os.path.join(ROOT, S, "issue_162151_mutation_only.py:10 in foo: "
                                                               "x[0] = x[0].t()")
    # nothing is returned: only the input written in place shows the bug
    assert [(v["path"], v["aot"]["diverges"]) for v in stage["values"]] == [("input l_x_", True)]
    assert r.json["script_run"]["message"].startswith("AssertionError: Tensor-likes are not close!")


def test_an_injected_compiler_bug_is_the_compiled_stage_and_its_op(runs):
    r = _compare(runs, "foo2_neg")
    assert [(s["name"], s["verdict"], s["culprit"]) for s in r.json["stages"]] == [("g0_dynamo_c1", "compiled", None)]
    [g] = r.json["graphs"]
    assert (g["verdict"], g["culprit"]["name"], g["culprit"]["source"]) == (
        "culprit", "neg", os.path.join(ROOT, "examples/foo2.py:6 in foo2: a = torch.neg(x1)"))
    assert r.json["message"] == ("1 graph(s): 1 with a diverging op; g0_dynamo_c1: the compiled graph differs from "
                                 "the Dynamo graph")


def test_a_single_bf16_flip_is_a_culprit_with_its_line_not_drift(runs):
    r = _compare(runs, "margin_inductor")
    assert r.code == exit_code("accuracy"), r.output
    forward = r.json["graphs"][0]
    assert (forward["name"], forward["verdict"], forward["drift_ops"]) == ("g0_forward_c1", "culprit", None)
    c = forward["culprit"]
    assert (c["name"], c["op"], c["dtype"], c["flips"], c["local_wrong"], c["origin"]) == (
        "ge", "aten.ge", "bool", True, False, "add")
    assert c["source"] == os.path.join(ROOT, S, MARGIN_LINE)
    assert forward["message"].startswith("first diverging op: ge (aten.ge), max abs error 1 vs eager; its result flips")
    assert "the input difference starts at add (aten.add, node 3," in forward["message"]
    assert "DRIFT" not in r.stdout and f"source: {S}/{MARGIN_LINE}" in r.stdout
