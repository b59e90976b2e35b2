"""`tdbg run --check-accuracy` on real failures: a bug only in the backward graph, a bug first
reached on the third call, a backend that edits Dynamo's graph in place, a failing backward
kernel, and a hang after the compiled calls returned. Each asserts the exact verdict."""
import os

import pytest

from tdbg.cli.console import exit_code

S = "tests/scenarios/scripts"
BACKENDS = f"{S}/user_backends.py"
RUNS = {
    "backward_only": (("run", f"{S}/train_mlp.py", "--backend", "inductor", "--check-accuracy"), {"TDBG_INJECT_BUG": "le:accuracy"}),
    "third_call": (("run", f"{S}/third_call.py", "--backend", f"{BACKENDS}:wrong_below_minus_one",
                    "--check-accuracy"), {}),
    "edits_in_place": (("run", f"{S}/third_call.py", "--backend", f"{BACKENDS}:edits_in_place", "--check-accuracy"),
                       {}),
    "aot_autograd_backward": (("run", f"{S}/train_mlp.py", "--backend", f"{BACKENDS}:wrong_backward",
                               "--check-accuracy"), {}),
    "backward_kernel": (("run", f"{S}/train_mlp.py", "--backend", "inductor"), {"TDBG_INJECT_BUG": "le:runtime_error"}),
    "random_graph": (("run", f"{S}/noisy_relu.py", "--backend", f"{BACKENDS}:wrong_below_minus_one",
                      "--check-accuracy"), {}),
    "dropout_tdbg": (("run", f"{S}/dropout_mlp.py", "--backend", "inductor", "--check-accuracy"), {}),
    "optimizer": (("run", f"{S}/compiled_optimizer_step.py", "--backend", "inductor"), {}),
    "optimizer_sqrt": (("run", f"{S}/compiled_optimizer_step.py", "--backend", "inductor"),
                       {"TDBG_INJECT_BUG": "sqrt:accuracy"}),
}
THIRD_CALL_LINE = f"{S}/third_call.py:6 in f: return torch.relu(x) * 2 + 1"
MLP_CALL_LINE = f"{S}/train_mlp.py:12 in <module>: loss = torch.nn.functional.cross_entropy(step(x), target)"


@pytest.fixture(scope="module")
def runs(tdbg_runs):
    tdbg_runs.start(*RUNS.values())
    return lambda name: tdbg_runs(*RUNS[name])


def test_backward_only_bug_is_an_accuracy_failure_of_the_backward(runs):
    r = runs("backward_only")
    assert r.code == exit_code("accuracy"), r.output
    assert ("FAILED tests/scenarios/scripts/train_mlp.py: a compiled graph's backward gives gradients that differ "
            "from eager autograd (stage accuracy, exit code 16)") in r.stdout
    err = r.json["verdict"]["error"]
    assert (err["graph"], err["call"], err["part"], err["during"]) == (0, 1, "backward", "backward")
    assert [m["output"] for m in err["evidence"]["mismatches"]] == ["grad of fn.0.weight", "grad of fn.0.bias"]
    assert err["source"] == MLP_CALL_LINE
    assert "graph: 0 (frame inner) backward, while running (call 1)" in r.stdout


def test_bug_first_reached_on_the_third_call_names_that_call_and_the_ops_line(runs):
    r = runs("third_call")
    assert r.code == exit_code("accuracy"), r.output
    err = r.json["verdict"]["error"]
    assert (err["graph"], err["call"], err["part"], err["fx_node"]) == (0, 3, "forward", "add")
    assert err["source"] == THIRD_CALL_LINE           # the op's own line, not the call site (line 11)
    assert err["evidence"]["mismatches"][0]["max_abs_error"] == 6.0
    # after a user backend's failure, bisect that backend (not tdbg's compiler)
    assert r.json["next_commands"][0] == f"tdbg bisect {S}/third_call.py --backend {BACKENDS}:wrong_below_minus_one"


def test_in_place_editing_backend_does_not_poison_the_reference(runs):
    r = runs("edits_in_place")
    assert r.code == exit_code("accuracy"), r.output
    err = r.json["verdict"]["error"]
    assert (err["graph"], err["call"], err["source"]) == (0, 3, THIRD_CALL_LINE)
    assert "the script failed on its own" not in r.stdout


def test_aot_autograd_user_backend_with_a_wrong_backward_compiler(runs):
    r = runs("aot_autograd_backward")
    assert r.code == exit_code("accuracy"), r.output
    err = r.json["verdict"]["error"]
    assert (err["part"], err["call"]) == ("backward", 1)
    [m] = err["evidence"]["mismatches"]                 # the backward's first output (doubled)
    assert m["output"] == "grad of fn.0.weight" and m["shape"] == [32, 16]


def test_failing_backward_kernel_is_put_on_the_backward_and_the_forward_call_site(runs):
    r = runs("backward_kernel")
    assert r.code == exit_code("kernel_runtime"), r.output
    err = r.json["verdict"]["error"]
    assert (err["graph"], err["during"], err["part"], err["fx_node"]) == (0, "backward", "backward", "le")
    assert "le" in err["kernel"]
    assert err["source"] == MLP_CALL_LINE               # not `loss.backward()`, not graph 0's forward op
    assert "a compiled kernel of a graph's backward failed while running" in r.stdout


@pytest.mark.slow
def test_hang_after_the_compiled_calls_returned_is_not_blamed_on_a_graph(tdbg_runs):
    script = f"{S}/hangs_after_calls.py"
    r = tdbg_runs(("run", script, "--backend", "aot_eager", "--timeout", "40"), {})
    assert r.code == exit_code("timeout"), r.output
    err = r.json["verdict"]["error"]
    assert err["graph"] is None and err["last_compiled"] == {"state": "returned", "graph": 0, "call": 3}
    assert "after graph 0's call 3 returned: outside every compiled graph" in err["message"]
    assert r.json["next_commands"] == [f"tdbg run {script} --backend eager --timeout 40"]
    assert os.path.basename(script) in r.stdout


@pytest.mark.slow
def test_real_inductor_training_step_passes_forward_and_backward(tdbg_runs):
    """No false alarm on a real backend's reordered float math, gradients included."""
    r = tdbg_runs(("run", f"{S}/train_mlp.py", "--backend", "torch:inductor", "--check-accuracy"), {})
    assert r.code == 0, r.output
    [graph] = r.json["verdict"]["graphs"]
    assert (graph["checked_calls"], graph["grads_checked"]) == (3, 3)   # the script's three steps
    assert "not checked" not in r.stdout


def test_a_graph_that_draws_random_numbers_is_not_excused_by_a_float64_reference(runs):
    """A float64 run draws other numbers than eager (rand_like), so its large "eager error" once let
    any compiled result pass: a false OK. Such graphs are judged against eager alone, and say why."""
    r = runs("random_graph")
    assert r.code == exit_code("accuracy"), r.output
    err = r.json["verdict"]["error"]
    assert (err["graph"], err["call"], err["part"]) == (0, 1, "forward")
    assert "This graph draws random numbers" in err["message"]


def test_dropout_under_tdbg_is_checked_on_eager_random_numbers_and_says_so(runs):
    """tdbg draws dropout masks in its kernels (not eager's stream): the check makes both draw
    eager's (fallback_random), passes the healthy graph, and says what it did not compare."""
    r = runs("dropout_tdbg")
    assert r.code == 0, r.output
    [graph] = r.json["verdict"]["graphs"]
    assert graph["draws_random"] and graph["grads_checked"] == 1
    assert ("not checked: graph 0 draws random numbers: they came from eager's generator while checking "
            "(fallback_random), so the backend's own random-number code was not compared") in r.stdout


def test_a_compiled_optimizer_step_is_taken_once_and_its_parameters_are_checked(runs):
    """Its parameters and state are get_attr tensors the step changes in place: the check's eager
    run took a second step on them (the script's own assert then failed, exit 1), and a wrong
    update passed as OK (the step returns nothing to compare)."""
    ok = runs("optimizer")
    assert ok.code == 0, ok.output   # the script's own assert: the compiled copy ended where the twin did
    assert "max parameter difference from the eager twin" in ok.stdout
    bad = runs("optimizer_sqrt")
    assert bad.code == exit_code("accuracy"), bad.output
    err = bad.json["verdict"]["error"]
    assert "inputs it changes in place differ from eager" in err["message"]
    names = [m["output"] for m in err["evidence"]["mismatches"]]
    assert names[:2] == ["self___param_groups_0__params___0 (changed in place)",
                         "self___param_groups_0__params___1 (changed in place)"]
    assert err["source"] == f"{S}/compiled_optimizer_step.py:17 in step: opt.step()"
