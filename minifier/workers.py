"""Warm, isolated workers for the minifier's queries.

A worker is a process that imports torch and tdbg's compiler once, then serves queries over a
pair of pipes. It runs no tensor code itself: for each query it forks a child (cheap: torch is
already loaded) that rebuilds the graph from its source, evaluates it (`oracle.evaluate`) and
writes the outcome back. A child that dies from a signal becomes a `crash` outcome with that
signal, one that outlives the per-query timeout is killed and becomes a `hang`; the worker and
the minifier carry on. If a worker itself dies or stalls, the pool replaces it.

Tensors cross the pipe once per worker (by SHA-256); the graph crosses as source text.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from typing import Optional

from tdbg.minifier.oracle import Outcome

_HEADER = struct.Struct("<Q")
STARTUP_TIMEOUT = 300.0
MARGIN = 30.0
# imported before the first fork, so no query pays for them (torch._dynamo alone takes seconds)
WARM_MODULES = ("sympy", "torch._dynamo", "torch._functorch.aot_autograd", "torch._subclasses.fake_tensor",
                "torch.fx.passes.fake_tensor_prop", "torch.fx.experimental.symbolic_shapes",
                "torch._decomp", "tdbg.minifier.accuracy", "tdbg.minifier.backends")  # slack on top of the query timeout before the worker itself counts as stuck


def _write(fd: int, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


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


def _read(fd: int, deadline: Optional[float] = None):
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(head)[0], deadline)
    return None if body is None else pickle.loads(body)


class Worker:
    """One warm worker process (see module doc)."""

    def __init__(self):
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()
        code = f"from tdbg.minifier.workers import serve; serve({to_child_r}, {from_child_w})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(to_child_r, from_child_w),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.seen: set = set()
        self.ready = False

    def wait_ready(self) -> None:
        if not self.ready:
            msg = _read(self._r, time.monotonic() + STARTUP_TIMEOUT)
            if msg != "ready":
                raise RuntimeError("a minifier worker failed to start (could not import torch/tdbg)")
            self.ready = True

    def query(self, source: str, specs: list, store, spec: dict, timeout: float) -> Outcome:
        self.wait_ready()
        new = {s.sha: store.tensors[s.sha] for s in specs if s.is_tensor and s.sha not in self.seen}
        _write(self._w, {"source": source, "inputs": specs, "tensors": new, "spec": spec,
                         "timeout": timeout})
        self.seen.update(new)
        try:
            reply = _read(self._r, time.monotonic() + timeout + MARGIN)
        except TimeoutError:
            reply = None
        if reply is None:
            raise WorkerDied()
        return Outcome.from_dict(reply)

    def close(self) -> None:
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class WorkerDied(Exception):
    pass


class Pool:
    """Workers that answer `query`; a spare is kept warm so a replacement is instant."""

    def __init__(self, timeout: float = 60.0, spares: int = 0):
        self.timeout = timeout
        self._workers = [Worker() for _ in range(1 + spares)]
        self.replaced = 0

    def query(self, source: str, specs: list, store, spec: dict) -> Outcome:
        for _attempt in range(2):
            worker = self._workers[0]
            try:
                return worker.query(source, specs, store, spec, self.timeout)
            except (WorkerDied, OSError):
                worker.close()
                self._workers = self._workers[1:] + [Worker()]
                self.replaced += 1
        return Outcome("hang", message=f"the worker stopped answering (timeout {self.timeout:g} s)")

    def close(self) -> None:
        for w in self._workers:
            w.close()
        self._workers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------- worker side

def serve(rfd: int, wfd: int) -> None:
    """Worker main loop: warm up, then fork one child per query."""
    import torch  # noqa: F401  (the point of a warm worker)
    import tdbg.compiler  # noqa: F401
    import tdbg.minifier.accuracy  # noqa: F401
    from tdbg.minifier import graph_io, oracle  # noqa: F401
    _warm_up()
    tensors: dict = {}
    _write(wfd, "ready")
    while True:
        msg = _read(rfd)
        if msg is None:
            return
        tensors.update(msg["tensors"])
        _write(wfd, _run_forked(msg, tensors).to_dict())


def _warm_up() -> None:
    """Pay one-time costs (FX codegen, lazy imports) before forking; runs no tensor code, so
    no thread pool exists yet and forking stays safe."""
    import importlib
    import pkgutil

    import tdbg.compiler
    from tdbg.minifier.graph_io import trace_source
    for name in WARM_MODULES + tuple(f"tdbg.compiler.{m.name}" for m in pkgutil.iter_modules(tdbg.compiler.__path__)):
        try:
            importlib.import_module(name)
        except Exception:  # a module that cannot load here only loses its head start
            pass
    trace_source("import torch\nclass Repro(torch.nn.Module):\n    def forward(self, x):\n"
                 "        return (torch.ops.aten.neg.default(x), torch.neg(x))\n")


def _run_forked(msg: dict, tensors: dict) -> Outcome:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            _write(w, _evaluate(msg, tensors).to_dict())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + msg["timeout"]
    try:
        reply = _read(r, deadline)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        return Outcome("hang", message=f"no answer within {msg['timeout']:g} s", seconds=msg["timeout"])
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if reply is not None:
        return Outcome.from_dict(reply)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return Outcome("crash", message=f"killed by signal {sig}", signal=sig)
    return Outcome("crash", message=f"exited with code {os.WEXITSTATUS(status)} without an answer")


def _evaluate(msg: dict, tensors: dict) -> Outcome:
    from tdbg.minifier.graph_io import TensorStore, trace_source
    from tdbg.minifier.oracle import evaluate
    store = TensorStore()
    store.tensors = tensors
    gm = trace_source(msg["source"])
    return evaluate(gm, store.values(msg["inputs"]), msg["spec"])
