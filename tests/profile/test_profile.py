"""`tdbg profile`: timing table, profiler table with tdbg's kernels, JSON fields, lost-speed flags."""
import json
import os
import subprocess
import sys
import tempfile

import pytest
from click.testing import CliRunner

from tdbg.cli.console import exit_code
from tdbg.cli.main import cli

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")


def _profile(tmp_path, script, *options, env=None):
    trace, out = tmp_path / "trace.json", tmp_path / "profile.json"
    result = CliRunner().invoke(cli, ["profile", os.path.join(SCRIPTS, script), "--backend", "inductor", "--iterations", "3",
                                      "--trace", str(trace), "--json", str(out), *options], env=env)
    doc = json.loads(out.read_text()) if out.exists() else None
    return result, doc, trace


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """Temporary folders of this test land in one folder, which must hold none of tdbg's afterwards
    (torch keeps its own torchinductor_<user> cache there)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert [name for name in os.listdir(root) if name.startswith("tdbg")] == []


def test_graph_breaks_and_recompiles_are_flagged(tmp_path, temp_root):
    result, doc, trace = _profile(tmp_path, "break_recompile.py", "--backend", "torch:eager")
    assert result.exit_code == 0, result.output
    assert doc["schema"] == "tdbg.profile" and doc["backend"] == "torch:eager"
    [step] = doc["callables"]
    assert step["label"] == "step (break_recompile.py:5)" and step["calls_in_script"] == 2
    assert step["speedup"] == pytest.approx(step["eager_s"] / step["compiled_s"])
    [fn] = doc["explain"]["functions"]
    [brk] = fn["breaks"]
    assert brk["line"].endswith("break_recompile.py:8  print(\"between graphs\")")
    assert brk["reason"] == "call to print(): Dynamo cannot put Python I/O in a graph"
    # the function and the resume function after the break both recompile for float64
    assert [(r["frame"], r["changed"]) for r in fn["recompiles"]] == [
        ("step", "argument `x` changed dtype: Float -> Double"),
        ("torch_dynamo_resume_in_step_at_8", "argument `y` changed dtype: Float -> Double")]
    assert [(g["compile_id"], g["frame"], g["recompile"]) for g in doc["graphs"]] == [
        ("0/0", "step", False), ("1/0", "torch_dynamo_resume_in_step_at_8", False),
        ("0/1", "step", True), ("1/1", "torch_dynamo_resume_in_step_at_8", True)]
    assert [f["kind"] for f in doc["flags"]][:3] == ["graph_breaks", "recompiles", "recompiles"]
    assert "recompiled because argument `x` changed dtype: Float -> Double" in result.output
    # the resume function by its user function (issue 25: never Dynamo's torch_dynamo_resume_in_step_at_8)
    assert "step, resumed after the break at line 8 recompiled because argument `y`" in result.output
    assert "torch_dynamo_resume" not in result.output
    # the script's output is shown once (its compiled run); the eager run and the replays print nothing
    assert result.output.count("between graphs\n") == 2
    assert json.loads(trace.read_text())["traceEvents"]


def test_tdbg_kernels_appear_by_name_next_to_aten_ops(tmp_path, temp_root):
    result, doc, trace = _profile(tmp_path, "small_add.py")   # default backend: tdbg's compiler
    assert result.exit_code == 0, result.output
    # the debug traces behind the stage times were temporary; the compiler's log lines are not shown
    assert doc["debug_dir"] is None and "[tdbg.compiler]" not in result.output
    assert "compiler debug traces: removed with the run's temporary folder (--debug keeps them)" in result.output
    assert doc["backend"] == "inductor" and doc["iterations"] == 3
    assert doc["kernels"] == ["cpp_fused_add_mul_0"] and doc["fallbacks"] == []
    [kernel] = doc["profiled_kernels"]
    assert kernel["name"] == "graph_0_cpp_fused_add_mul_0" and kernel["calls"] == 5
    assert "graph_0_cpp_fused_add_mul_0" in result.output
    assert any(r["name"].startswith("aten::add") for r in doc["eager_profiler_rows"])
    [fn] = doc["callables"]
    assert fn["label"] == "func (small_add.py:10)" and fn["calls_in_script"] == 3
    assert fn["eager_s"] > 0 and fn["compiled_s"] > 0 and fn["speedup"] == pytest.approx(fn["eager_s"] / fn["compiled_s"])
    assert set(doc["stages"]) >= {"lower", "schedule", "codegen", "build"}
    [graph] = doc["graphs"]
    assert graph["compile_id"] == "0/0" and graph["ops"] == 4 and graph["seconds"] >= sum(doc["stages"].values())
    assert "graph_0_cpp_fused_add_mul_0" in trace.read_text()
    assert list(doc["time_split"]) == ["generated kernels", "aten ops", "compiled-code wrappers", "other"]
    assert sum(doc["time_split"].values()) == pytest.approx(1.0)
    assert doc["time_split"]["generated kernels"] == pytest.approx(
        kernel["self_cpu_us"] / sum(r["self_cpu_us"] for r in doc["profiler_rows"]))


@pytest.mark.parametrize("args, message, code", [
    (["missing.py"], "does not exist", "bad_input"),
    ([os.path.join(SCRIPTS, "small_add.py"), "--backend", "nope"], "unknown backend 'nope'", "bad_input"),
])
def test_bad_input(args, message, code):
    result = CliRunner().invoke(cli, ["profile", *args])
    assert result.exit_code == exit_code(code)
    assert message in result.output


def test_script_without_compile(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import torch\nprint(torch.ones(2).sum().item())\n")
    result = CliRunner().invoke(cli, ["profile", str(script), "--backend", "torch:eager",
                                      "--trace", str(tmp_path / "t.json")])
    assert result.exit_code == exit_code("bad_input")
    assert "never calls torch.compile" in result.output


def test_existing_trace_is_not_overwritten(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text("mine")
    result = CliRunner().invoke(cli, ["profile", os.path.join(SCRIPTS, "small_add.py"), "--backend", "inductor", "--trace", str(trace)])
    assert result.exit_code == exit_code("usage") and "--force" in result.output
    assert trace.read_text() == "mine"


def test_help_does_not_import_torch():
    code = ("import sys; from click.testing import CliRunner; from tdbg.cli.main import cli; "
            "r = CliRunner().invoke(cli, ['profile', '--help']); "
            "assert r.exit_code == 0 and '--iterations' in r.output, r.output; "
            "assert 'torch' not in sys.modules; print('ok')")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == "ok\n"


def _report(**fields):
    from tdbg.minifier.diagnose.profiling import CallableProfile, ProfileReport
    base = dict(script="s.py", backend="inductor", iterations=1, eager_script_s=1.0, compiled_script_s=1.0,
                callables=[], graphs=[], stages={}, fallbacks=[], kernels=[],
                explain={"functions": [], "totals": {}}, profiler_rows=[], eager_profiler_rows=[], trace_path=None)
    base["callables"] = [CallableProfile("f", 1, 1.0, 2.0, 1.0, 2.0, fields.pop("faults", 0.0))]
    return ProfileReport(**{**base, **fields})


def test_lost_speed_flags_table():
    from tdbg.minifier.diagnose.profiling import PAGE_BYTES, lost_speed_flags
    assert lost_speed_flags(_report()) == []
    fallbacks = [{"graph": "g", "fx_node": "a", "target": "aten.addmm.default"},
                 {"graph": "g", "fx_node": "b", "target": "aten.sort.default"},
                 {"graph": "g", "fx_node": "c", "target": "aten.sort.default"}]
    assert lost_speed_flags(_report(fallbacks=fallbacks)) == [{"kind": "fallbacks", "message": (
        "2 op(s) ran through aten instead of generated kernels: aten.sort.default "
        "(library calls by design: aten.addmm.default)")}]
    # GEMMs alone are the intended path, not lost speed
    assert lost_speed_flags(_report(fallbacks=fallbacks[:1])) == []
    pages = (1 << 20) // PAGE_BYTES
    assert lost_speed_flags(_report(faults=pages - 1)) == []
    [flag] = lost_speed_flags(_report(faults=pages))
    assert flag["kind"] == "page_faults" and "1.0 MiB first touched each call" in flag["message"]
    split = {"generated kernels": 0.2, "aten ops": 0.3, "compiled-code wrappers": 0.5, "other": 0.0}
    [flag] = lost_speed_flags(_report(time_split=split))
    assert flag["kind"] == "overhead" and flag["message"].startswith("50% of the compiled run's self CPU time")
    assert lost_speed_flags(_report(time_split=dict(split, **{"compiled-code wrappers": 0.49}))) == []


def test_dynamo_optimize_is_timed_too(tmp_path):
    script = tmp_path / "opt.py"
    script.write_text("import torch, torch._dynamo\n\ndef f(x):\n    return torch.sin(x) * 2\n\n"
                      "g = torch._dynamo.optimize('inductor')(f)\nfor _ in range(2):\n    g(torch.randn(8))\n")
    result = CliRunner().invoke(cli, ["profile", str(script), "--backend", "torch:eager", "--iterations", "2",
                                      "--trace", str(tmp_path / "t.json"), "--json", str(tmp_path / "p.json")])
    assert result.exit_code == 0, result.output
    [f] = json.loads((tmp_path / "p.json").read_text())["callables"]
    assert f["label"] == "f (opt.py:3)" and f["calls_in_script"] == 2 and f["compiled_s"] > 0


def test_compile_failure_gets_its_stage_exit_code(tmp_path):
    foo1 = os.path.join(os.path.dirname(os.path.dirname(SCRIPTS)), "..", "examples", "foo1.py")
    result = CliRunner(env={"TDBG_INJECT_BUG": "neg:compile_error"}).invoke(
        cli, ["profile", os.path.normpath(foo1), "--backend", "inductor", "--trace", str(tmp_path / "t.json")])
    assert result.exit_code == exit_code("cpp_build"), result.output
    assert "failed: stage cpp_build" in result.output and "kernel: cpp_fused_cat_maximum_neg_0" in result.output
    assert not (tmp_path / "t.json").exists()


def test_script_own_error_keeps_its_exit_code(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("import torch\nf = torch.compile(lambda x: x + 1)\nf(torch.ones(2))\n"
                      "raise RuntimeError('my own bug')\n")
    result = CliRunner().invoke(cli, ["profile", str(script), "--backend", "torch:eager",
                                      "--trace", str(tmp_path / "t.json")])
    assert result.exit_code == 1
    assert "the eager run of the script failed: stage script" in result.output
    assert "bad.py:4 in <module>: raise RuntimeError('my own bug')" in result.output


@pytest.mark.parametrize("source, error", [
    ("raise ImportError('no such helper')\n\ndef be(gm, inputs):\n    return gm\n", "1: ImportError: no such helper"),
    ("\ndef be(gm, inputs)\n    return gm\n", "2: SyntaxError: expected ':'"),
])
def test_backend_file_that_fails_to_load(tmp_path, source, error):
    backend = tmp_path / "be.py"
    backend.write_text(source)
    result = CliRunner().invoke(cli, ["profile", os.path.join(SCRIPTS, "small_add.py"), "--backend", f"{backend}:be",
                                      "--trace", str(tmp_path / "t.json")])
    assert result.exit_code == exit_code("bad_input"), result.output
    assert f"backend '{backend}:be': loading {backend} failed at {backend}:{error}." in " ".join(result.output.split())


def test_debug_keeps_the_compiler_traces_of_this_run(tmp_path, temp_root):
    debug = tmp_path / "dbg"
    (debug / "run_earlier").mkdir(parents=True)    # an earlier run's traces are neither read nor touched
    (debug / "run_earlier" / "debug.log").write_text("build 100.0\n")
    result, doc, _ = _profile(tmp_path, "small_add.py", "--debug", env={"TDBG_DEBUG_DIR": str(debug)})
    assert result.exit_code == 0, result.output
    [run] = [d for d in os.listdir(debug) if d != "run_earlier"]
    assert doc["debug_dir"] == str(debug / run)
    [graph] = os.listdir(debug / run / "compiler")
    assert os.path.isfile(debug / run / "compiler" / graph / "debug.log")
    assert 0 < doc["stages"]["build"] < 100 and f"compiler debug traces (output_code.py, debug.log per graph): " \
        f"{debug / run}" in " ".join(result.output.split())


def test_the_eager_pass_output_is_kept_in_a_real_file(tmp_path):
    """The eager pass's output is captured (shown once, not twice) through a real file, so a script
    that asks its streams for a file descriptor (faulthandler, subprocess) runs as it would alone."""
    from tdbg.minifier.diagnose.profiling import run_script
    from tdbg.minifier.runs.instrument import Session
    script = tmp_path / "fd.py"
    script.write_text("import os, sys\nprint('out')\nsys.stdout.flush()\nos.write(sys.stdout.fileno(), b'fd\\n')\n"
                      "print('err', file=sys.stderr)\n")
    result = run_script(str(script), [], "eager", Session(None), capture=True)
    assert result.error is None and result.exit_code == 0
    assert result.output == "out\nfd\nerr\n"


def test_graph_numbers_restart_after_a_reset_when_frame_0_went_to_another_backend():
    """Kernels are named graph_<n>_...; after test_memory's run (frame 0 compiled by another backend,
    frame 1 by tdbg) the next run's first graph was graph_1 instead of graph_0. A frame's first
    compile below a frame already numbered means Dynamo was reset; a recompile does not."""
    import torch

    import tdbg.compiler as tc
    from tdbg.compiler.torch_compat import CompileContext
    seen = []

    def spy(gm, example_inputs):
        seen.append((str(CompileContext.current_compile_id()), tc._graph_number()))
        return gm.forward
    torch.compiler.reset()
    for fn in (lambda x: x + 1, lambda x: x + 2, lambda x: x + 3):   # frames 0, 1, 2 numbered
        torch.compile(fn, backend=spy)(torch.ones(2))
    torch.compiler.reset()
    torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))   # frame 0 elsewhere
    f = torch.compile(lambda x, n: x * n, backend=spy)
    f(torch.ones(2), 2)
    f(torch.ones(3), 2)                                           # a recompile of frame 1
    torch.compile(lambda x: x - 1, backend=spy)(torch.ones(2))
    torch.compiler.reset()
    torch.compile(lambda x: x / 2, backend=spy)(torch.ones(2))
    torch.compiler.reset()
    assert seen == [("0/0", 0), ("1/0", 1), ("2/0", 2), ("1/0", 0), ("1/1", 1), ("2/0", 2), ("0/0", 0)]
