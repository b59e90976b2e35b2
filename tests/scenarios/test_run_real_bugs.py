"""`tdbg run` (accuracy compared by default) on real PyTorch Inductor bugs, none written here:
each must fail with the exact stage, part and evidence, never OK."""
import pytest

from tdbg.cli.console import exit_code

S = "tests/scenarios/scripts"
RUNS = {
    # bf16 margin 1.7: eager rounds it to 1.703125, Inductor does not; the gradients become 0. The
    # float64 reference flips the same way, so it must not excuse the compiled gradients.
    # (the command test_compare_real.py runs too: the session runs it once)
    "185517": (("run", f"{S}/issue_185517_bf16_margin.py", "--backend", "torch:inductor", "--check-accuracy"), {}),
    # int64 arange * tensor(1e9) computed in 32 bits inside an encoder (the script prints, never asserts)
    "175966": (("run", f"{S}/issue_175966_int64_arange.py"), {}),
    # Inductor's scheduler raises a plain ValueError on a NaN constant while compiling
    "188225": (("run", f"{S}/issue_188225_nan_amax.py"), {}),
    # an in-place change of the input through dropout's identity return is dropped (outputs right)
    "195422": (("run", f"{S}/issue_195422_dropout_alias.py"), {}),
}


@pytest.fixture(scope="module")
def runs(tdbg_runs):
    tdbg_runs.start(*RUNS.values())
    return lambda name: tdbg_runs(*RUNS[name])


def test_a_bf16_gradient_flip_is_an_accuracy_failure_of_the_backward(runs):
    r = runs("185517")
    assert r.code == exit_code("accuracy"), r.output
    err = r.json["verdict"]["error"]
    assert (err["part"], err["graph"], err["call"]) == ("backward", 0, 1)
    assert [m["output"] for m in err["evidence"]["mismatches"]] == ["grad of x", "grad of y"]
    assert all(m["max_abs_error"] == pytest.approx(0.769531, abs=1e-6) for m in err["evidence"]["mismatches"])


def test_an_int64_overflow_in_a_script_that_never_asserts_is_found(runs):
    r = runs("175966")
    assert r.code == exit_code("accuracy"), r.output
    err = r.json["verdict"]["error"]
    assert (err["part"], err["graph"], err["call"]) == ("forward", 0, 1)
    [m] = err["evidence"]["mismatches"]
    assert m["output"] == "out[1]" and m["dtype"] == "torch.int64"
    assert r.json["verdict"]["compile_backends"]["names"] == ["torch:inductor"]


def test_an_inductor_scheduler_crash_is_stage_scheduling(runs):
    r = runs("188225")
    assert r.code == exit_code("scheduling"), r.output
    err = r.json["verdict"]["error"]
    assert (err["stage"], err["during"], err["message"]) == (
        "scheduling", "compile", "ValueError: The argument 'nan' is not comparable.")


def test_an_input_change_the_compiled_graph_drops_is_found_and_minified(runs, tdbg_runs, tmp_path_factory):
    """Outputs alone matched here (tdbg run said OK); the input x eager changed in place is
    compared too, and minify after dynamo keeps the failure through repro.py."""
    r = runs("195422")
    assert r.code == exit_code("accuracy"), r.output
    err = r.json["verdict"]["error"]
    assert (err["part"], err["graph"], err["call"], err["fx_node"]) == ("forward", 0, 1, "y")
    [m] = err["evidence"]["mismatches"]
    assert (m["output"], m["max_abs_error"]) == ("x (changed in place)", 1.0)
    assert "inputs it changes in place differ from eager" in err["message"]
    out = tmp_path_factory.mktemp("m195422") / "out"
    mini = tdbg_runs(("minify", f"{S}/issue_195422_dropout_alias.py", "--after", "dynamo", "--level", "4",
                      "--backend", "torch:aot_eager", "--out", str(out)), {})
    assert mini.code == 0, mini.output
    check = mini.json["repro_check"]
    assert (check["code"], check["reproduced"]) == (exit_code("accuracy"), True)
    assert check["lines"][0] == "Reproduced: accuracy mismatch in l_x_ (changed in place)"


def _raised_in(path: str, function: str) -> BaseException:
    """An exception whose traceback has a frame of `function` in file `path`."""
    code = compile(f"def {function}():\n    raise ValueError('x')\n", path, "exec")
    namespace: dict = {}
    exec(code, namespace)
    try:
        namespace[function]()
    except ValueError as e:
        return e


@pytest.mark.parametrize("path, function, stage", [
    ("/x/torch/_inductor/graph.py", "run_node", "lowering"),
    ("/x/torch/_inductor/scheduler.py", "__init__", "scheduling"),
    ("/x/torch/_inductor/graph.py", "codegen", None),          # codegen of a lowered graph: not a phase row
    ("/x/torch/_inductor/lowering.py", "inner_fn", None),     # re-run by the scheduler too: says nothing alone
])
def test_inductor_phases_by_their_frames(path, function, stage):
    from tdbg.minifier.runs import inductor_hooks
    assert inductor_hooks.stage_of([_raised_in(path, function)]) == stage
