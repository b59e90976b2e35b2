"""The fork server: result round trip, crash -> signal, hang -> timeout killing the process group
(also what a finished child left behind), memory limit -> out_of_memory, redirection, and a pool
that replaces a dead server. Handlers are stdlib functions, so the servers
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


def _gone(pid: int) -> bool:
    """True once `pid` no longer runs (absent, or a zombie waiting for init)."""
    for _ in range(50):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_what_a_finished_child_left_running_in_its_group_is_killed(server, tmp_path):
    pid_file = tmp_path / "sleep.pid"
    reply = server.call("os:system", f"sleep 60 & echo $! > {pid_file}", timeout=30.0, session=True)
    assert reply == forkserver.Reply("ok", 0)
    assert _gone(int(pid_file.read_text())), "a process the request started outlived it"


def test_memory_error_under_the_limit_is_its_own_reply(server):
    reply = server.call("builtins:bytearray", 1 << 31, memory_limit=256 << 20, session=True)
    assert reply.kind == "out_of_memory"
    assert reply.value == "MemoryError (the request used up its memory limit of 0.25 GiB)"
    assert reply.peak_rss < 1 << 30
    assert server.call("builtins:len", b"x" * (64 << 20), memory_limit=256 << 20) == forkserver.Reply("ok", 64 << 20)


def test_memory_limit_sizes():
    ram = forkserver.physical_memory()
    assert [forkserver.parse_memory_limit(t) for t in ("4G", "512m", "1.5GiB", "300000000", "none", "0")] == \
        [4 << 30, 512 << 20, 3 << 29, 300000000, None, None]
    assert forkserver.parse_memory_limit("25%") == int(ram * 0.25)
    assert forkserver.default_memory_limit() == int(ram * forkserver.DEFAULT_MEMORY_FRACTION)
    for bad in ("4X", "-1G", "10", "1M", "lots"):
        with pytest.raises(ValueError, match="at least 64M"):
            forkserver.parse_memory_limit(bad)


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


def test_a_server_dead_before_the_call_is_server_died_not_a_broken_pipe():
    """Reaped before the request is written (killed, or out of memory, between two queries): the
    write meets a closed pipe. It raised BrokenPipeError past the pool (a traceback from minify;
    the test above failed so under load)."""
    with forkserver.Pool(["json"], size=1, keep_warm=1) as pool:
        with pool.server() as first:
            first_pid = first.proc.pid
        with pytest.raises(forkserver.ServerDied, match="its pipe is closed"):
            with pool.server() as same:
                os.kill(first_pid, signal.SIGKILL)
                same.proc.wait()
                same.call("builtins:abs", -1)
        assert pool.replaced == 1


def test_pool_without_a_startable_server_is_unavailable():
    with forkserver.Pool(["tdbg_no_such_module"], size=2) as pool:
        for _ in range(2):
            with pytest.raises(forkserver.Unavailable):
                with pool.server():
                    pass
        assert (pool.size, pool.started, pool.replaced) == (0, [], 0)


def test_pool_close_ends_every_server_and_closes_each_pipe_once():
    pool = forkserver.Pool(["json"], size=2, keep_warm=2)
    clients = list(pool.started)
    for client in clients:
        client.wait_ready()
    pool.close()
    assert [c.proc.poll() for c in clients] == [0, 0]      # os._exit(0) once the pipe closed
    assert all((c._w, c._r) == (-1, -1) for c in clients)  # a second close touches no reused fd
    reused = os.open(os.devnull, os.O_RDONLY)              # may get a number a pipe had
    try:
        for client in clients:
            client.close()
        os.fstat(reused)                                    # still open
    finally:
        os.close(reused)
