"""Faults inside minifier queries (issue 11): a backend's hung subprocess, a backend that allocates
without end, and inputs whose bytes collide. One warm worker pool is shared by the tests."""
import os
import time

import pytest
import torch
import torch.fx as fx

from tdbg.minifier.artifacts.graph_io import TensorStore, case_source, from_graph_module
from tdbg.minifier.reduce.workers import Pool

LIMIT = 512 << 20
TOKEN = f"1234.{os.getpid()}"   # `sleep TOKEN` names this test's processes and no one else's

HANGS = f"""
def hangs(gm, example_inputs):
    import subprocess
    subprocess.run(["sleep", "{TOKEN}"])
    return gm
"""
HOGS = """
def hogs(gm, example_inputs):
    held = []
    while True:
        held.append(torch.ones(1 << 26))
"""
RETURNS = "def returns(gm, example_inputs):\n    return gm\n"


def backend(name: str, source: str) -> dict:
    return {"after": "dynamo", "config": {}, "backend": {"kind": "source", "name": name, "source": source}}


@pytest.fixture(scope="module")
def pool():
    with Pool(timeout=3.0, memory_limit=LIMIT) as p:
        yield p


def query(pool, fn, inputs, spec):
    store = TensorStore()
    case = from_graph_module(fx.symbolic_trace(fn), inputs, store)
    return pool.query(case_source(case), list(case.inputs), store, spec)


def sleepers() -> list:
    """Pids of running `sleep TOKEN` processes (zombies waiting for init do not count)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv[:2] == [b"sleep", TOKEN.encode()] and state != "Z":
            found.append(int(pid))
    return found


def test_a_timed_out_query_leaves_no_process_behind(pool):
    outcome = query(pool, lambda x: torch.neg(x), [torch.ones(3)], backend("hangs", HANGS))
    assert (outcome.kind, outcome.message) == ("hang", "no answer within 3 s")
    for _ in range(30):
        if not sleepers():
            break
        time.sleep(0.1)
    assert sleepers() == []


def test_a_backend_that_allocates_without_end_is_out_of_memory(pool):
    outcome = query(pool, lambda x: torch.neg(x), [torch.ones(3)], backend("hogs", HOGS))
    assert outcome.kind == "out_of_memory"
    assert outcome.message.startswith("RuntimeError: [enforce fail")
    assert "DefaultCPUAllocator: can't allocate memory" in outcome.message
    assert outcome.message.endswith("(while compiling); the query's memory limit is 0.50 GiB "
                                    "(tdbg minify --memory-limit)")
    assert outcome.summary().startswith("out of memory: RuntimeError")
    assert outcome.seconds < 3.0   # stopped by the limit, not by the 3 s timeout


def test_inputs_with_the_same_bytes_and_other_dtypes_reach_the_query_apart(pool):
    # before InputSpec.key, y arrived as float32 zeros and bitwise_not failed in eager ("invalid")
    outcome = query(pool, lambda x, y: (x + 1, torch.bitwise_not(y)),
                    [torch.zeros(4), torch.zeros(4, dtype=torch.int32)], backend("returns", RETURNS))
    assert outcome.kind == "pass", outcome.report()


def test_the_capture_run_forks_from_the_query_server(pool):
    # `tdbg minify SCRIPT` can run its capture here instead of importing torch a second time
    from tdbg.minifier.runs.runner import RunRequest, run_script
    script = os.path.join(os.path.dirname(__file__), "..", "scenarios", "scripts", "uses_sin.py")
    verdict = run_script(RunRequest(script=script, backend="eager", capture=True, timeout=60), pool=pool.servers)
    assert (verdict["status"], verdict["compile_calls"], verdict["stdout_tail"]) == ("ok", 1, "True\n")
    assert pool.replaced == 0


def test_a_backend_warm_up_runs_once_per_server_in_the_server(pool, monkeypatch):
    # torch:inductor's per-process costs (its modules, the vector-ISA probe) are paid by the
    # server once instead of by every forked query (5-7 s instead of 16-30 s per amin query)
    from tdbg.minifier.reduce import workers
    calls = []
    monkeypatch.setattr(workers, "BACKEND_WARM", {"probe": "os:getpid"})
    real_call = workers.forkserver.Client.call

    def spy(self, handler, payload=None, **kw):
        calls.append((handler, kw.get("fork", True)))
        return real_call(self, handler, payload, **kw)
    monkeypatch.setattr(workers.forkserver.Client, "call", spy)
    pool.prepare("probe")
    pool.prepare("probe")
    pool.prepare("inductor")   # tdbg's own compiler: nothing to warm
    assert calls == [("os:getpid", False)]


def test_minify_memory_limit_flag_parses_or_refuses():
    from click.testing import CliRunner

    from tdbg.cli.main import cli
    from tdbg.cli.minify import _memory_limit
    assert (_memory_limit(None), _memory_limit("none"), _memory_limit("512M")) == (None, "none", 512 << 20)
    result = CliRunner().invoke(cli, ["minify", "examples/foo1.py", "--memory-limit", "3"])
    assert result.exit_code == 2 and "is not a size of at least 64M" in result.output
