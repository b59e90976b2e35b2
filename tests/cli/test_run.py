"""`tdbg run` on the seed examples: verdict, exit code and JSON for each failure stage."""
import os
import subprocess
import sys

import pytest

from tdbg.cli.console import exit_code

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# scenario -> (stage, exit code name, FX node, phrase of the report)
FAILURES = {
    "run_foo2_accuracy": ("accuracy", "accuracy", None, "differ from eager"),
    "run_foo1_compile_error": ("cpp_build", "cpp_build", "cat, maximum, neg", "tdbg_injected_compile_error_neg"),
    "run_foo2_crash": ("crash", "crash", None, "SIGSEGV"),
    "run_foo2_kernel_runtime": ("kernel_runtime", "kernel_runtime", "neg", "injected runtime error in neg"),
    "run_toy_compiler": ("backend", "backend", None, "toy_compiler does not support relu"),
    "run_fullgraph": ("dynamo", "dynamo", None, "builtin operator `print`"),
}


def _with_scenario(names):
    """Parameters that each mark the scenario they read (so -k starts only those)."""
    return [pytest.param(n, marks=pytest.mark.scenario(n)) for n in names]


@pytest.mark.parametrize("name", _with_scenario(sorted(FAILURES)))
def test_failure_stage_exit_code_and_json(scenarios, name):
    stage, code_name, fx_node, phrase = FAILURES[name]
    r = scenarios[name]
    assert r.code == exit_code(code_name), r.output
    assert f"(stage {stage}, exit code {exit_code(code_name)})" in r.stdout
    assert phrase in r.stdout
    doc = r.json
    assert (doc["schema"], doc["version"], doc["exit_code"]) == ("tdbg.run", 2, exit_code(code_name))
    assert doc["verdict"]["status"] == "failed" and doc["verdict"]["stage"] == stage
    if fx_node:
        assert doc["verdict"]["error"]["fx_node"] == fx_node


@pytest.mark.parametrize("name", _with_scenario(["run_foo2_accuracy", "run_foo1_compile_error",
                                                  "run_foo2_kernel_runtime", "run_foo2_crash"]))
def test_compiler_failures_name_graph_and_next_commands(scenarios, name):
    r = scenarios[name]
    err = r.json["verdict"]["error"]
    assert (err["graph"], err["frame"]) == (0, name.split("_")[1])
    script = "examples/foo1.py" if "foo1" in name else "examples/foo2.py"
    level = {"run_foo2_accuracy": "4", "run_foo2_crash": "3"}.get(name, "2")
    # the backend is always named: suggestions never depend on a command's default backend
    assert r.json["next_commands"] == [f"tdbg bisect {script} --backend inductor",
                                       f"tdbg minify {script} --after aot --level {level} --backend inductor"]
    assert f"tdbg bisect {script} --backend inductor" in r.stdout


@pytest.mark.scenario("run_foo1_compile_error", "run_fullgraph")
def test_source_line_and_kernel_are_reported(scenarios):
    err = scenarios["run_foo1_compile_error"].json["verdict"]["error"]
    # the fused kernel's first op's own line, not the call site (line 17)
    assert err["source"] == "examples/foo1.py:6 in foo1: a = torch.neg(x1)"
    assert err["kernel"].startswith("cpp_") and "neg" in err["kernel"]
    # the real g++ error, trimmed: a few lines, not the whole log
    assert "error:" in err["message"] and len(err["message"].splitlines()) <= 13
    dyn = scenarios["run_fullgraph"].json["verdict"]["error"]
    assert dyn["source"] == 'examples/toy_example.py:7 in toy_example: print("woo")'
    assert scenarios["run_fullgraph"].json["next_commands"] == ["tdbg explain examples/toy_example.py"]


@pytest.mark.scenario("run_foo2_accuracy")
def test_accuracy_report_names_output(scenarios):
    err = scenarios["run_foo2_accuracy"].json["verdict"]["error"]
    mismatch = err["evidence"]["mismatches"][0]
    assert mismatch["output"] == "out[0]" and mismatch["shape"] == [8390, 8]
    assert mismatch["max_abs_error"] > 1.0
    assert (err["call"], err["part"], err["fx_node"]) == (1, "forward", "y")
    assert err["source"] == "examples/foo2.py:8 in foo2: y = torch.cat([b], dim=0)"


@pytest.mark.scenario("run_foo2_kernel_runtime", "run_foo2_crash")
def test_runtime_failures_name_the_call_and_the_ops_line(scenarios):
    err = scenarios["run_foo2_kernel_runtime"].json["verdict"]["error"]
    assert (err["during"], err["call"], err["source"]) == ("run", 1, "examples/foo2.py:6 in foo2: a = torch.neg(x1)")
    crash = scenarios["run_foo2_crash"].json["verdict"]["error"]
    assert (crash["graph"], crash["during"], crash["call"]) == (0, "run", 1)
    assert "(while running graph 0 (call 1))" in crash["message"]


@pytest.mark.scenario("run_toy_compiler")
def test_user_backend_failure_points_at_minify_after_dynamo(scenarios):
    r = scenarios["run_toy_compiler"]
    assert r.json["next_commands"] == [
        "tdbg bisect examples/toy_compiler.py --backend examples/toy_compiler.py:toy_compiler",
        "tdbg minify examples/toy_compiler.py --after dynamo --level 2 --backend examples/toy_compiler.py:toy_compiler"]
    assert r.json["verdict"]["error"]["message"] == "AssertionError: toy_compiler does not support relu"


@pytest.mark.scenario("run_exits_seven")
def test_script_own_failure_keeps_its_exit_code(scenarios):
    r = scenarios["run_exits_seven"]
    assert r.code == 7
    assert r.json["verdict"]["stage"] == "script" and r.json["exit_code"] == 7


@pytest.mark.scenario("run_no_compile")
def test_script_that_never_compiles_is_bad_input(scenarios):
    r = scenarios["run_no_compile"]
    assert r.code == exit_code("bad_input")
    assert "never called torch.compile" in r.stdout
    assert r.json["verdict"]["stage"] == "bad_input"


@pytest.mark.scenario("run_timeout")
def test_timeout_kills_the_child(scenarios):
    r = scenarios["run_timeout"]
    assert r.code == exit_code("timeout")
    assert r.json["verdict"]["stage"] == "timeout" and r.json["verdict"]["duration_s"] < 30


@pytest.mark.scenario("run_function")
def test_function_compiles_only_that_frame_and_passes_argv(scenarios):
    r = scenarios["run_function"]
    assert r.code == 0, r.output     # the script exits 5 unless it got `--flag`
    graphs = r.json["verdict"]["graphs"]
    assert [(g["frame"], g["ops"]) for g in graphs] == [("inner", ["sin", "add"])]


@pytest.mark.slow
@pytest.mark.scenario("run_mlp_ok")
def test_training_step_passes_with_accuracy_check(scenarios):
    r = scenarios["run_mlp_ok"]
    assert r.code == 0, r.output
    assert r.json["verdict"]["status"] == "ok"
    assert all(g.get("checked") for g in r.json["verdict"]["graphs"])
    # tdbg's compiler by name: the bare "backend inductor" of older output read as PyTorch's Inductor
    assert "OK examples/mlp_train.py: 1 graph(s) compiled by tdbg's compiler (inductor); results match eager" in r.stdout


@pytest.mark.scenario("run_foo2_repro")
def test_repro_options_reach_the_dumper(scenarios):
    r = scenarios["run_foo2_repro"]
    assert r.code == exit_code("accuracy"), r.output
    assert r.json["verdict"]["repro_dir"].endswith("/repro")
    assert {"repro/repro.py", "repro/minifier_launcher.py"} <= set(r.files)
    assert r.json["next_commands"][-1] == f"tdbg minify {r.json['verdict']['repro_dir']}"


@pytest.mark.scenario("run_foo2_kernel_runtime")
def test_debug_dir_and_log_channels(scenarios):
    r = scenarios["run_foo2_kernel_runtime"]
    debug_dir = r.json["verdict"]["debug_dir"]
    assert "/dbg/run_" in debug_dir and f"debug dir: {debug_dir}" in r.stdout
    assert any(f.startswith("dbg/run_") and f.endswith("output_code.py") for f in r.files)
    assert "[tdbg.compiler]" in r.stderr
    assert r.json["options"]["logs"] == "compiler"


def test_what_a_script_leaves_to_interpreter_exit_is_still_written(tmp_path):
    # the runner's child skips the exit's cyclic collections (gc.freeze): atexit handlers and the
    # teardown of module-level objects must still happen as under `python script.py`
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", "run", "tests/cli/scripts/writes_at_exit.py",
                           "--backend", "eager", "--", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "unclosed.txt").read_text() == "written by the script, never closed\n"
    assert (tmp_path / "atexit.txt").read_text() == "written at exit\n"
