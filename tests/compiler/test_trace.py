"""compiler/trace.py and the TDBG_COMPILE_DEBUG workflow of the seed tutorial, on tdbg."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch._dynamo

from tdbg.compiler import trace
from tdbg.compiler.config import Config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRACE_FILES = ["debug.log", "fx_graph_readable.py", "fx_graph_runnable.py", "fx_graph_transformed.py",
               "ir.txt", "ir_post_fusion.txt", "ir_pre_fusion.txt", "kernel_map.json", "kernels.cpp",
               "output_code.py", "provenance.json"]
RUN_DIR = re.compile(r"run_\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d-pid_(\d+)$")


@pytest.fixture(autouse=True)
def quiet_channels():
    yield
    trace.configure_logging(Config())


def test_no_trace_without_debug(tmp_path):
    assert trace.DebugTrace.start(Config(debug_dir=str(tmp_path)), "model", 0, "forward", 0) is None
    assert os.listdir(tmp_path) == []


def test_trace_directory_layout_and_files(tmp_path, capsys):
    cfg = Config(debug=True, debug_dir=str(tmp_path / "dbg"))
    fw = trace.DebugTrace.start(cfg, "model", 3, "forward", 1)
    bw = trace.DebugTrace.start(cfg, "model", 3, "backward", 1)
    run = os.path.dirname(os.path.dirname(fw.path))
    assert RUN_DIR.search(run) and RUN_DIR.search(run).group(1) == str(os.getpid())
    assert os.listdir(tmp_path / "dbg") == [os.path.basename(run)]  # one run dir per process
    assert (os.path.basename(fw.path), os.path.basename(bw.path)) == ("model__3_forward_1", "model__3_backward_1")
    assert fw.write("a.txt", "text") == os.path.join(fw.path, "a.txt")
    fw.write_json("k.json", {"kernel": ["neg"]})
    assert json.loads(open(os.path.join(fw.path, "k.json")).read()) == {"kernel": ["neg"]}
    assert capsys.readouterr().err.splitlines() == [
        f"[tdbg.compiler] debug trace for model forward graph 3: {fw.path}",
        f"[tdbg.compiler] debug trace for model backward graph 3: {bw.path}"]


def test_repeated_names_get_their_own_directory(tmp_path):
    cfg = Config(debug=True, debug_dir=str(tmp_path))
    a, b = (trace.DebugTrace.start(cfg, "m", 0, "inference", 0) for _ in range(2))
    assert a.path != b.path and os.path.isdir(a.path) and os.path.isdir(b.path)


def test_stages_append_timings_to_debug_log(tmp_path):
    t = trace.DebugTrace.start(Config(debug=True, debug_dir=str(tmp_path)), "m", 0, "inference", 0)
    with t.stage("lowering"):
        pass
    with pytest.raises(ZeroDivisionError):
        with t.stage("codegen"):
            1 / 0
    lines = [line.split() for line in open(os.path.join(t.path, "debug.log")).read().splitlines()]
    assert [(line[0], line[2:]) for line in lines] == [("lowering", []), ("codegen", ["failed:ZeroDivisionError"])]
    assert all(float(line[1]) >= 0 for line in lines)


def test_channels_are_silent_until_configured(capfd):
    for channel in ("compiler", "output_code", "schedule", "graph"):
        trace.get_logger(channel).warning("not shown")
    trace.configure_logging(Config(logs=frozenset({"schedule", "graph"}), verbose_logs=frozenset({"schedule"})))
    trace.configure_logging(Config(logs=frozenset({"schedule", "graph"}), verbose_logs=frozenset({"schedule"})))
    trace.get_logger("schedule").debug("fused buf0 into buf1")
    trace.get_logger("graph").debug("hidden: graph is not verbose")
    trace.get_logger("graph").info("graph shown")
    trace.get_logger("compiler").info("hidden: compiler is off")
    out, err = capfd.readouterr()
    assert out == "" and err.splitlines() == ["[tdbg.schedule] fused buf0 into buf1", "[tdbg.graph] graph shown"]
    trace.configure_logging(Config())
    trace.get_logger("schedule").info("off again")
    assert capfd.readouterr() == ("", "")
    with pytest.raises(ValueError, match="unknown log channel 'dynamo'"):
        trace.get_logger("dynamo")


def test_default_compile_prints_nothing(capfd):
    def f(x):
        return torch.relu(x) * 2

    torch._dynamo.reset()
    try:
        with Config.patch(logs=frozenset(), debug=False):
            out = torch.compile(f, backend="tdbg")(torch.randn(5))
    finally:
        torch._dynamo.reset()
    assert out.shape == (5,)
    assert capfd.readouterr() == ("", "")


# Runs the seed script examples/foo1.py with backend="tdbg" (it calls torch.compile(foo1)).
_RUN_FOO1 = (
    "import functools, runpy, torch\n"
    "torch.compile = functools.partial(torch.compile, backend='tdbg')\n"
    f"runpy.run_path({os.path.join(REPO, 'examples', 'foo1.py')!r}, run_name='__main__')\n")


@pytest.fixture(scope="module")
def foo1_debug_run(tmp_path_factory):
    """One TDBG_COMPILE_DEBUG=1 TDBG_LOGS=+schedule,output_code run of foo1; (cwd, completed process)."""
    cwd = tmp_path_factory.mktemp("foo1-debug")
    env = dict(os.environ, TDBG_COMPILE_DEBUG="1", TDBG_LOGS="+schedule,output_code")
    proc = subprocess.run([sys.executable, "-c", _RUN_FOO1], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return cwd, proc


def _graph_dirs(cwd):
    (run,) = os.listdir(cwd / "tdbg_debug")
    assert RUN_DIR.search(run), run
    base = cwd / "tdbg_debug" / run / "compiler"
    return [base / d for d in sorted(os.listdir(base))]


def test_foo1_debug_tree(foo1_debug_run):
    cwd, proc = foo1_debug_run
    assert "foo1 ok (8390, 8)" in proc.stdout
    (graph,) = _graph_dirs(cwd)
    assert re.fullmatch(r"\w+__0_inference_0", graph.name), graph.name
    assert sorted(os.listdir(graph)) == TRACE_FILES
    assert str(graph) in proc.stderr  # the path is logged
    code = (graph / "output_code.py").read_text()
    assert "// FX: neg = torch.ops.aten.neg.default(" in code
    assert "cpp_fused_" in code and "def call(args)" in code
    for name in ("ir_pre_fusion.txt", "ir_post_fusion.txt"):
        assert "neg" in (graph / name).read_text()
    stages = [line.split() for line in (graph / "debug.log").read_text().splitlines()]
    assert len(stages) >= 3 and all(len(s) == 2 and float(s[1]) >= 0 for s in stages), stages
    kernel_map = json.loads((graph / "kernel_map.json").read_text())
    assert "neg" in json.dumps(kernel_map) and "cpp_fused_" in json.dumps(kernel_map)


def test_foo1_log_channels(foo1_debug_run):
    _, proc = foo1_debug_run
    channels = {m.group(1) for m in re.finditer(r"^\[tdbg\.(\w+)\]", proc.stderr, re.M)}
    assert {"compiler", "output_code"} <= channels <= {"compiler", "output_code", "schedule"}, proc.stderr[-3000:]
    assert "[tdbg.output_code] output code for foo1__0_inference_0:" in proc.stderr
    assert "[tdbg.compiler] foo1__0_inference_0: 1 kernel(s), 3 lowered node(s), 0 fallback(s)" in proc.stderr


def test_schedule_output_code_and_graph_channels(capfd):
    def f(x, y):
        return torch.relu(x).sum(dim=1) + y  # small: the loop is too little work to go parallel

    torch._dynamo.reset()
    try:
        with Config.patch(logs=frozenset({"schedule", "output_code", "graph"})):
            torch.compile(f, backend="tdbg")(torch.randn(4, 8), torch.randn(4))
    finally:
        torch._dynamo.reset()
    err = capfd.readouterr().err
    lines = err.splitlines()
    assert any(line.startswith("[tdbg.schedule] ") and "not parallel" in line for line in lines), err
    assert any(line.startswith("[tdbg.output_code] output code for ") for line in lines), err
    assert any(line.startswith("[tdbg.graph] ") for line in lines), err
    assert "torch.ops.aten.relu.default" in err
    assert not any(line.startswith("[tdbg.compiler]") for line in lines)


@pytest.mark.parametrize("script", ["output_code.py", "fx_graph_runnable.py"])
def test_trace_scripts_run_standalone(foo1_debug_run, script, tmp_path):
    cwd, _ = foo1_debug_run
    (graph,) = _graph_dirs(cwd)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TDBG_") or k == "TDBG_CACHE_DIR"}
    proc = subprocess.run([sys.executable, str(graph / script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
