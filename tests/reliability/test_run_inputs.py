"""`tdbg run` refuses what it cannot honour before any work (issue 11 items 11, 12, 16), and a
process that dies or hangs is placed where it really was (item 13, issue 9 item 7).

CLI refusals run in this process (click's CliRunner) with the child runner replaced by one that
fails the test: "before any work" means no child is ever started."""
import json
import os

import pytest
import torch
from click.testing import CliRunner
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from tdbg.cli.console import exit_code
from tdbg.cli.main import cli
from tdbg.minifier.runs import runner
from tdbg.minifier.runs.instrument import Session

SCRIPT = "examples/foo2.py"


@pytest.fixture
def no_child(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a child run started although the command line should have been refused")
    monkeypatch.setattr(runner, "run_script", refuse)


def _run(args):
    result = CliRunner().invoke(cli, ["run", SCRIPT, *args])
    assert "Traceback" not in result.output, result.output
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.parametrize("value", ["0", "-1"])
def test_timeout_must_be_positive(no_child, value):
    code, text = _run(["--timeout", value])
    assert code == exit_code("usage")
    assert f"Invalid value for '--timeout': {float(value)} is not in the range x>0" in text


def test_unwritable_json_path_is_refused_before_the_run(no_child, tmp_path):
    code, text = _run(["--json", str(tmp_path / "missing" / "out.json")])
    assert code == exit_code("usage") and f"the folder {tmp_path / 'missing'} does not exist" in text
    code, text = _run(["--json", str(tmp_path)])
    assert code == exit_code("usage") and "that is a directory" in text


def test_repro_out_dir_holding_user_files_is_never_overwritten(no_child, tmp_path):
    (tmp_path / "repro.py").write_text("# the user's own repro\n")
    code, text = _run(["--repro-after", "aot", "--out", str(tmp_path)])
    assert code == exit_code("usage") and "the folder exists and is not empty" in text
    assert (tmp_path / "repro.py").read_text() == "# the user's own repro\n"
    code, text = _run(["--repro-after", "aot", "--out", "/proc/x"])
    assert code == exit_code("usage") and "--out /proc/x" in text


def test_check_calls_needs_check_accuracy_and_a_positive_count(no_child):
    code, text = _run(["--no-check-accuracy", "--check-calls", "3"])
    assert code == exit_code("usage") and "it cannot be combined with --no-check-accuracy" in text
    code, _ = _run(["--check-accuracy", "--check-calls", "0"])
    assert code == exit_code("usage")


def test_function_matching_no_frame_is_bad_input(monkeypatch):
    verdict = {"status": "ok", "stage": None, "compile_calls": 1, "graphs": [], "error": None,
               "skipped_frames": ["foo2", "torch_dynamo_resume_in_foo2_at_7", "bar"]}
    monkeypatch.setattr(runner, "run_script", lambda request: dict(verdict))
    code, text = _run(["--function", "nosuchfn"])
    assert code == exit_code("bad_input")
    # the names --function takes: a resume function is its function's (was listed by Dynamo's code name)
    assert ("--function nosuchfn: no frame of a function named 'nosuchfn' was compiled "
            "(the functions torch.compile reached were: foo2, bar); nothing was checked") in text


def _frames_of(session, fn, *args):
    torch._dynamo.reset()
    with session.install():
        compiled = torch.compile(fn)
        return [compiled(*a) for a in args]


def test_session_names_the_frames_function_left_out():
    def add_one(x):
        return x + 1
    session = Session(lambda gm, ex: gm.forward, function="nosuchfn")
    _frames_of(session, add_one, (torch.ones(2),))
    assert (session.graphs, session.skipped_frames) == ([], ["add_one"])


def _dead(status_path, tmp_path, *, returncode=-9, timed_out=False):
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"event": "compile_start", "graph": 0, "frame": "f",
                                  "source": f"{os.getcwd()}/x.py:3  return x.sin()"}) + "\n")
    req = runner.RunRequest(script="x.py", timeout=5)
    return runner._dead_child_verdict(returncode, timed_out, req, str(events), str(status_path))["error"]


def test_status_after_three_returned_calls_blames_no_graph(tmp_path):
    status = tmp_path / "status.json"

    def f(x):
        return torch.sin(x) + 1
    session = Session(lambda gm, ex: gm.forward, status_path=str(status))
    _frames_of(session, f, *[(torch.randn(4),)] * 3)
    err = _dead(status, tmp_path, timed_out=True)
    assert err["message"] == ("the run exceeded its 5 s timeout (after graph 0's call 3 returned: outside every "
                              "compiled graph, in the script's own code or eager PyTorch)")
    assert (err["graph"], err["during"], err["last_compiled"]) == (None, None, {"state": "returned", "graph": 0,
                                                                               "call": 3})


def test_status_inside_a_backward_blames_that_graphs_backward(tmp_path):
    status = tmp_path / "status.json"
    seen = []

    def f(x):
        return (torch.sin(x) * 2).sum()

    def spying_backward(gm, example_inputs):   # reads the status file while the backward runs
        def run(*args):
            seen.append(json.loads(status.read_text()))
            return gm(*args)
        return make_boxed_func(run)
    backend = aot_autograd(fw_compiler=lambda gm, ex: make_boxed_func(gm.forward), bw_compiler=spying_backward)
    session = Session(backend, status_path=str(status))
    [loss] = _frames_of(session, f, (torch.randn(4, requires_grad=True),))
    loss.backward()
    assert seen == [{"state": "backward", "graph": 0, "call": 1}]
    assert json.loads(status.read_text()) == {"state": "backward_done", "graph": 0, "call": 1}
    status.write_text(json.dumps(seen[0]))
    err = _dead(status, tmp_path, returncode=-11)
    assert err["message"] == "the process died from signal SIGSEGV (while running graph 0's backward (for call 1))"
    assert (err["graph"], err["during"], err["part"], err["source"]) == (0, "backward", "backward",
                                                                        "x.py:3  return x.sin()")
