"""Warm processes that fork one child per run, so repeated runs skip importing torch.

A zygote (`python -m tdbg.minifier.runner --zygote`) imports torch, Dynamo and tdbg, runs no
tensor op (so no OpenMP pool exists when it forks), then serves one request at a time on stdin:
a spec path in, `pid N` out, the child forked (own session, stdout/stderr to the spec's files,
runs `runner.child_main`), `exit CODE` out when it ends (negative: killed by that signal). The
parent kills a child that overruns its timeout by process group. `ZygotePool` hands zygotes to
concurrent callers and shuts them all down on exit; a zygote that fails to start makes the pool
fall back to fresh processes.
"""
from __future__ import annotations

import contextlib
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from typing import Optional


def zygote_main() -> int:
    import torch  # noqa: F401 - the point is to import once
    import torch._dynamo  # noqa: F401
    import functorch.compile  # noqa: F401

    from tdbg.minifier import backends, instrument, runner  # noqa: F401
    with contextlib.suppress(ImportError):
        import tdbg.compiler.lowering  # noqa: F401
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        spec_path = line.strip()
        if not spec_path:
            continue
        pid = os.fork()
        if pid == 0:
            _child(spec_path)
        out.write(f"pid {pid}\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(f"exit {os.waitstatus_to_exitcode(status)}\n")
        out.flush()
    return 0


def _child(spec_path: str) -> None:
    import json

    from tdbg.minifier.runner import child_main
    code = 0
    try:
        os.setsid()
        with open(spec_path) as f:
            spec = json.load(f)
        for fd, key in ((1, "stdout"), (2, "stderr")):
            target = os.open(spec[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        sys.stdin = open(os.devnull)
        code = child_main(spec_path)
    except BaseException:  # noqa: B902 - the parent reads the missing verdict as a failure
        code = 70
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


class Zygote:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "tdbg.minifier.runner", "--zygote"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self._buffer = b""
        if self._readline(timeout=300) != "ready":
            self.close()
            raise RuntimeError("the tdbg zygote did not start")

    def _readline(self, timeout: Optional[float] = None) -> Optional[str]:
        """One line from the zygote, or None on timeout/EOF."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def run(self, spec_path: str, timeout: Optional[float]):
        """(exit code, timed out) of one child run."""
        self.proc.stdin.write(spec_path.encode() + b"\n")
        self.proc.stdin.flush()
        pid = int(self._readline(timeout=60).split()[1])
        try:
            line = self._readline(timeout)
        except BaseException:   # interrupted: the child runs in its own session, stop it too
            self._kill(pid)
            raise
        timed_out = line is None
        if timed_out:
            self._kill(pid)
            line = self._readline(timeout=60)
        return int(line.split()[1]), timed_out

    @staticmethod
    def _kill(pid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class ZygotePool:
    """Up to `size` zygotes, started on demand, each serving one run at a time."""

    def __init__(self, size: int):
        self.size, self.started, self.idle = size, [], queue.Queue()
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def zygote(self):
        with self.lock:
            if self.idle.empty() and len(self.started) < self.size:
                try:
                    z = Zygote()
                except (RuntimeError, OSError):
                    z = None
                if z is None:
                    self.size = len(self.started)
                else:
                    self.started.append(z)
                    self.idle.put(z)
        if not self.started:
            yield None
            return
        z = self.idle.get()
        broken = False
        try:
            yield z
        except BaseException:
            broken = True
            raise
        finally:
            if broken:   # a half-served zygote cannot be trusted with the next run
                z.close()
                with self.lock:
                    self.started.remove(z)
            else:
                self.idle.put(z)

    def close(self) -> None:
        for z in self.started:
            z.close()
        self.started = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
