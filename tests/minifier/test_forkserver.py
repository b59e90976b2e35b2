"""The fork server: result round trip, crash -> signal, hang -> timeout killing the process group,
redirection, and a pool that replaces a dead server. Handlers are stdlib functions, so the servers
start without importing torch."""
import os
import signal
import time

import pytest

from tdbg.minifier.runs import forkserver


@pytest.fixture(scope="module")
def server():
    client = forkserver.Client(["json"])
    yield client
    client.close()


def test_result_round_trips(server):
    assert server.call("builtins:sorted", [3, 1, 2]) == forkserver.Reply("ok", [1, 2, 3])


def test_in_server_call_and_its_error(server):
    assert server.call("builtins:len", "abcd", fork=False) == forkserver.Reply("ok", 4)
    reply = server.call("builtins:int", "x", fork=False)
    assert reply.kind == "error" and "ValueError: invalid literal" in reply.value
    assert server.call("builtins:abs", -5) == forkserver.Reply("ok", 5)   # the server carries on


def test_crash_is_the_signal(server):
    assert server.call("signal:raise_signal", signal.SIGSEGV) == forkserver.Reply("crash", signal=signal.SIGSEGV)


def test_exit_without_answer_is_the_code(server):
    assert server.call("os:_exit", 3) == forkserver.Reply("exit", code=3)
    assert server.call("builtins:int", "x") == forkserver.Reply("exit", code=forkserver.HANDLER_FAILED)


def test_hang_times_out_and_kills_the_process_group(server, tmp_path):
    pid_file = tmp_path / "sleep.pid"
    start = time.monotonic()
    reply = server.call("os:system", f"sleep 60 & echo $! > {pid_file}; wait", timeout=1.0, session=True)
    assert reply == forkserver.Reply("timeout", seconds=1.0)
    assert time.monotonic() - start < 10
    grandchild = int(pid_file.read_text())
    for _ in range(50):   # killed with the group; reaped by init once its shell is gone
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the grandchild {grandchild} outlived the timeout")


def test_stdout_and_stderr_are_redirected(server, tmp_path):
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    assert server.call("builtins:print", "hello", stdout=str(out), stderr=str(err)) == forkserver.Reply("ok")
    assert (out.read_text(), err.read_text()) == ("hello\n", "")
    assert server.call("builtins:int", "x", stderr=str(err)).code == forkserver.HANDLER_FAILED
    assert "ValueError: invalid literal for int()" in err.read_text()


def test_pool_replaces_a_dead_server():
    with forkserver.Pool(["json"], size=1, keep_warm=1) as pool:
        with pool.server() as first:
            first_pid = first.proc.pid
        with pytest.raises(forkserver.ServerDied):
            with pool.server() as same:
                assert same.proc.pid == first_pid
                os.kill(first_pid, signal.SIGKILL)
                same.call("builtins:abs", -1)
        assert pool.replaced == 1
        with pool.server() as fresh:
            assert fresh.proc.pid != first_pid
            assert fresh.call("builtins:abs", -1) == forkserver.Reply("ok", 1)


def test_pool_without_a_startable_server_is_unavailable():
    with forkserver.Pool(["tdbg_no_such_module"], size=2) as pool:
        for _ in range(2):
            with pytest.raises(forkserver.Unavailable):
                with pool.server():
                    pass
        assert (pool.size, pool.started, pool.replaced) == (0, [], 0)
