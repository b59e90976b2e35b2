"""A warm Python process that forks one child per request, so repeated runs skip importing torch.

Server (`serve`, started by `Client`): imports its `warm` entries once ("module" is imported,
"module:function" is called with no arguments), runs no tensor op itself (so no OpenMP pool
exists when it forks), then serves length-prefixed pickled requests on a pipe, one at a time:

- forked (the default): it forks a child, answers `("pid", pid)`, and the child calls
  `handler(payload)` ("module:function"), optionally in its own session, with stdout/stderr
  redirected to files and with a memory limit (`memory_limit` bytes of data memory on top of
  what it inherits, RLIMIT_DATA; its subprocesses get the same ceiling). The answer is a `Reply`:
  `ok` with the handler's (pickled) return value, `crash` with the signal that killed the child,
  `exit` with the code of a child that ended without an answer (a handler that raises exits 70),
  `out_of_memory` when the handler raised MemoryError, or when a child with a memory limit was
  SIGKILLed by someone else (the kernel's OOM killer) after using at least half of it, or
  `timeout` once the child outlives `timeout` seconds. Every reply carries the child's peak RSS.
  A child in its own session takes its whole process group with it: the group is SIGKILLed when
  the child times out and also when it ends, so nothing it started (a hung `sleep`, a compiler
  daemon) outlives its request.
- in-server (`fork=False`): the server calls the handler itself and answers `ok`/`error`. Forked
  children inherit whatever it stores in module state (e.g. tensors sent once per server).

`Client` is one server; `Pool` hands idle servers to concurrent callers and replaces a server
that died, stalled or was interrupted mid-request. This module never imports torch itself.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import queue
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

_HEADER = struct.Struct("<Q")
STARTUP_TIMEOUT = 300.0
MARGIN = 30.0   # slack on top of a request's timeout before the server itself counts as stuck
HANDLER_FAILED = 70
DEFAULT_MEMORY_FRACTION = 0.5   # of physical RAM, for one query child at a time
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass
class Reply:
    kind: str                       # ok | crash | exit | out_of_memory | timeout | error
    # out_of_memory: `value` says how (MemoryError text, or the SIGKILL and peak RSS)
    value: Any = None               # ok: the handler's result; error: the traceback text
    signal: Optional[int] = None    # crash
    code: Optional[int] = None      # exit
    seconds: Optional[float] = None  # timeout
    peak_rss: Optional[int] = field(default=None, compare=False)   # forked: the child's peak RSS, bytes


def physical_memory() -> int:
    """Bytes of RAM on this machine."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_memory_limit() -> int:
    """DEFAULT_MEMORY_FRACTION of physical RAM, in bytes."""
    return int(physical_memory() * DEFAULT_MEMORY_FRACTION)


def parse_memory_limit(text: str) -> Optional[int]:
    """'4G', '512M', '1.5GiB', '300000000' (bytes), '25%' (of RAM) -> bytes; 'none', 'off' or '0'
    -> None (no limit). ValueError, naming the accepted forms, for anything else or under 64 MiB."""
    t = text.strip().lower()
    if t in ("none", "off", "0"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(?:(%)|([kmgt]?)(?:i?b)?)", t)
    value = -1.0 if m is None else float(m[1]) * (physical_memory() / 100 if m[2] else _SIZE_UNITS[m[3]])
    if value < 64 << 20:
        raise ValueError(f"memory limit {text!r} is not a size of at least 64M: give bytes or a number "
                         "with K, M, G or T (4G, 512M), a percentage of RAM (50%), or 'none'")
    return int(value)


def limit_memory(nbytes: int) -> None:
    """In a child: let it allocate at most `nbytes` more data memory (RLIMIT_DATA above what it
    already holds, so a warm process keeps its imports); a subprocess inherits the ceiling."""
    import resource
    cap = _data_bytes() + nbytes
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))


def _data_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


class ServerDied(Exception):
    """The server stopped answering (died, stalled past timeout + MARGIN, or failed to start)."""


class Unavailable(ServerDied, RuntimeError):
    """No fork server could be started (its warm imports failed)."""


# ---------------------------------------------------------------- framing

def write_msg(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd: int, n: int, deadline: Optional[float]) -> Optional[bytes]:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_msg(fd: int, deadline: Optional[float] = None):
    """The next message, None at EOF; TimeoutError past `deadline` (time.monotonic())."""
    head = _read_exact(fd, _HEADER.size, deadline)
    body = None if head is None else _read_exact(fd, _HEADER.unpack(head)[0], deadline)
    return None if body is None else pickle.loads(body)


def _resolve(handler: str):
    module, _, name = handler.partition(":")
    return getattr(importlib.import_module(module), name)


# ---------------------------------------------------------------- server side

def serve(rfd: int, wfd: int, warm: Sequence[str]) -> None:
    """Server main loop (see module doc); returns when the client closes its end."""
    for entry in warm:
        if ":" in entry:
            _resolve(entry)()
        else:
            importlib.import_module(entry)
    write_msg(wfd, "ready")
    while (req := read_msg(rfd)) is not None:
        if req.get("fork", True):
            write_msg(wfd, _forked(req, (rfd, wfd), lambda pid: write_msg(wfd, ("pid", pid))))
        else:
            write_msg(wfd, _in_server(req))


def _in_server(req: dict) -> Reply:
    try:
        return Reply("ok", _resolve(req["handler"])(req["payload"]))
    except Exception:  # noqa: BLE001 - the client gets the traceback, the server carries on
        return Reply("error", traceback.format_exc())


def _forked(req: dict, server_fds: tuple, announce) -> Reply:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(req, w, server_fds)
    os.close(w)
    announce(pid)
    timeout, session = req.get("timeout"), req.get("session", False)
    try:
        answer = read_msg(r, None if timeout is None else time.monotonic() + timeout)
    except TimeoutError:
        kill_child(pid, session)
        return Reply("timeout", seconds=timeout, peak_rss=_reap(pid, session)[1])
    finally:
        os.close(r)
    status, peak = _reap(pid, session)
    if answer is not None and len(answer) == 1:
        return Reply("ok", answer[0], peak_rss=peak)
    if answer is not None:      # (kind, text) from the child's own handling, e.g. MemoryError
        return Reply(answer[0], answer[1], peak_rss=peak)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        limit = req.get("memory_limit")
        if sig == signal.SIGKILL and limit and peak >= limit // 2:
            return Reply("out_of_memory", f"killed by SIGKILL (the kernel's out-of-memory killer) at a peak "
                         f"RSS of {peak / 2**30:.2f} GiB", signal=sig, peak_rss=peak)
        return Reply("crash", signal=sig, peak_rss=peak)
    return Reply("exit", code=os.waitstatus_to_exitcode(status), peak_rss=peak)


def _reap(pid: int, session: bool) -> tuple:
    """(wait status, peak RSS in bytes) of the ended child; in its own session whatever is left
    of its process group is SIGKILLed first, while the child's zombie still holds the group id."""
    if session:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    _, status, usage = os.wait4(pid, 0)
    return status, usage.ru_maxrss * 1024


def _child(req: dict, w: int, server_fds: tuple) -> None:
    code = 0
    try:
        for fd in server_fds:
            os.close(fd)
        if req.get("session"):
            os.setsid()
        if req.get("memory_limit"):
            limit_memory(req["memory_limit"])
        for fd, key in ((1, "stdout"), (2, "stderr")):
            if req.get(key):
                target = os.open(req[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(target, fd)
                os.close(target)
        sys.stdin = open(os.devnull)
        result = _resolve(req["handler"])(req["payload"])
        write_msg(w, (result,))
    except MemoryError as e:
        limit = req.get("memory_limit")
        where = f"its memory limit of {limit / 2**30:.2f} GiB" if limit else "the memory available"
        with contextlib.suppress(Exception):
            write_msg(w, ("out_of_memory", f"MemoryError{': ' + str(e) if str(e) else ''} (the request used up {where})"))
    except BaseException:  # noqa: B902 - no answer + this exit code is the client's verdict
        code = HANDLER_FAILED
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def kill_child(pid: int, session: bool) -> None:
    """SIGKILL a child, and its whole process group when it leads its own session (the child
    alone too: it may not have called setsid yet)."""
    if session:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- client side

class Client:
    """One fork server, started at construction (warming up in the background)."""

    def __init__(self, warm: Sequence[str]):
        to_server_r, self._w = os.pipe()
        self._r, from_server_w = os.pipe()
        # os._exit once served: tearing down an interpreter that holds torch takes a quarter of a
        # second, paid by every close(); the server has nothing to flush (its output is /dev/null)
        code = (f"import os; from tdbg.minifier.runs.forkserver import serve; "
                f"serve({to_server_r}, {from_server_w}, {list(warm)!r}); os._exit(0)")
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(to_server_r, from_server_w),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_server_r)
        os.close(from_server_w)
        self.ready = False
        self.state: dict = {}   # callers' bookkeeping about what this server holds

    def wait_ready(self) -> None:
        """Block until warm; Unavailable when the server could not start."""
        if not self.ready:
            try:
                msg = read_msg(self._r, time.monotonic() + STARTUP_TIMEOUT)
            except TimeoutError:
                msg = None
            if msg != "ready":
                raise Unavailable("a tdbg fork server failed to start (could not import its warm modules)")
            self.ready = True

    def call(self, handler: str, payload=None, *, timeout: Optional[float] = None, fork: bool = True,
             session: bool = False, stdout: Optional[str] = None, stderr: Optional[str] = None,
             memory_limit: Optional[int] = None) -> Reply:
        """Run `handler(payload)` (see module doc; `memory_limit` in bytes, None for none, forked
        only). ServerDied when the server stops answering; on any exception while a child runs
        (e.g. KeyboardInterrupt) the child (its group, with `session`) is killed first."""
        self.wait_ready()
        try:
            write_msg(self._w, {"handler": handler, "payload": payload, "timeout": timeout, "fork": fork,
                                "session": session, "stdout": stdout, "stderr": stderr,
                                "memory_limit": memory_limit})
        except BrokenPipeError:   # it died since its last answer (killed, out of memory)
            raise ServerDied("the tdbg fork server is gone (its pipe is closed)") from None
        pid = None
        try:
            if fork:
                pid = self._answer(time.monotonic() + 60)[1]
            reply = self._answer(None if timeout is None else time.monotonic() + timeout + MARGIN)
        except BaseException:
            if pid is not None:
                kill_child(pid, session)
            raise
        return reply

    def _answer(self, deadline: Optional[float]):
        try:
            msg = read_msg(self._r, deadline)
        except TimeoutError:
            msg = None
        if msg is None:
            raise ServerDied("the tdbg fork server stopped answering")
        return msg

    def hang_up(self) -> None:
        """Close this end of the pipes: the server exits when it reads EOF. Once only: a closed fd's
        number may already belong to another file."""
        for fd in (self._w, self._r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._w = self._r = -1

    def close(self, kill: bool = False) -> None:
        self.hang_up()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=0 if kill else 10)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class Pool:
    """Up to `size` servers, each serving one caller at a time; `keep_warm` of them are started
    at once and after every replacement. A server whose use raised is killed and dropped
    (`replaced` counts them). When a server cannot start, `size` shrinks to those running and
    `server()` raises Unavailable once none is left."""

    def __init__(self, warm: Sequence[str], size: int = 1, keep_warm: int = 0):
        self.warm, self.size, self.keep_warm = list(warm), size, keep_warm
        self.started: list = []
        self.idle: queue.LifoQueue = queue.LifoQueue()   # the most recently used server holds the most state
        self.lock = threading.Lock()
        self.replaced = 0
        self._top_up()

    def _top_up(self) -> None:
        while len(self.started) < min(self.keep_warm, self.size):
            self._start()

    def _start(self) -> None:
        client = Client(self.warm)
        self.started.append(client)
        self.idle.put(client)

    def _acquire(self) -> Client:
        while True:
            with self.lock:
                if self.idle.empty() and len(self.started) < self.size:
                    self._start()
                if not self.started:
                    raise Unavailable("no tdbg fork server could be started")
            client = self.idle.get()
            if client is not None:   # None: a server was dropped, look again
                return client

    @contextlib.contextmanager
    def server(self):
        """An idle, warm `Client` for the duration of the block."""
        client = self._acquire()
        try:
            client.wait_ready()
            yield client
        except BaseException as e:
            client.close(kill=True)
            with self.lock:
                self.started.remove(client)
                if isinstance(e, Unavailable):
                    self.size = len(self.started)
                else:
                    self.replaced += 1
                    self._top_up()
                self.idle.put(None)
            raise
        self.idle.put(client)

    def close(self) -> None:
        for client in self.started:    # every server ends at once, then each is waited for
            client.hang_up()
        for client in self.started:
            client.close()
        self.started = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
