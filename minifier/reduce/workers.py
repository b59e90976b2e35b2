"""Warm, isolated workers for the minifier's queries, on top of `forkserver`.

`Pool.query(source, specs, store, spec) -> Outcome`: a warm fork server (torch and tdbg's
compiler already imported) forks a child that rebuilds the graph from its source, evaluates it
(`oracle.evaluate`) and returns the outcome. A child that dies from a signal becomes a `crash`
outcome with that signal, one that outlives the per-query timeout is killed and becomes a `hang`;
the minifier carries on. A server that dies or stalls is replaced (`Pool.replaced` counts them).

Tensors cross to each server once (keyed by InputSpec.key, kept in `_TENSORS` inside the server and
inherited by every forked child); the graph crosses as source text.
"""
from __future__ import annotations

import contextlib
import importlib
import pkgutil

from tdbg.minifier.runs import forkserver
from tdbg.minifier.reduce.oracle import Outcome

# imported before the first fork, so no query pays for them (torch._dynamo alone takes seconds)
WARM = ("torch", "sympy", "torch._dynamo", "torch._functorch.aot_autograd", "torch._subclasses.fake_tensor",
        "torch.fx.passes.fake_tensor_prop", "torch.fx.experimental.symbolic_shapes", "torch._decomp",
        "tdbg.compiler", "tdbg.minifier.diagnose.accuracy", "tdbg.minifier.runs.backends", "tdbg.minifier.artifacts.graph_io",
        "tdbg.minifier.reduce.oracle", "tdbg.minifier.reduce.workers:warm_up")
_TENSORS: dict = {}   # server side: InputSpec.key -> tensor, filled by `remember`


class Pool:
    """Workers that answer `query`; `spares` extra servers are kept warm so a replacement is instant."""

    def __init__(self, timeout: float = 60.0, spares: int = 0):
        self.timeout = timeout
        self._servers = forkserver.Pool(WARM, size=1 + spares, keep_warm=1 + spares)

    @property
    def replaced(self) -> int:
        return self._servers.replaced

    def query(self, source: str, specs: list, store, spec: dict) -> Outcome:
        for _attempt in range(2):
            try:
                with self._servers.server() as server:
                    return self._query(server, source, specs, store, spec)
            except forkserver.Unavailable:
                raise
            except (forkserver.ServerDied, OSError):
                continue
        return Outcome("hang", message=f"the worker stopped answering (timeout {self.timeout:g} s)")

    def _query(self, server: forkserver.Client, source: str, specs: list, store, spec: dict) -> Outcome:
        seen = server.state.setdefault("tensors", set())
        new = {s.key: store.tensors[s.key] for s in specs if s.is_tensor and s.key not in seen}
        if new:
            reply = server.call("tdbg.minifier.reduce.workers:remember", new, fork=False, timeout=self.timeout)
            if reply.kind != "ok":
                raise forkserver.ServerDied(reply.value)
            seen.update(new)
        reply = server.call("tdbg.minifier.reduce.workers:evaluate_query", {"source": source, "inputs": specs, "spec": spec},
                            timeout=self.timeout)
        return _outcome(reply)

    def close(self) -> None:
        self._servers.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _outcome(reply: forkserver.Reply) -> Outcome:
    if reply.kind == "ok":
        return Outcome.from_dict(reply.value)
    if reply.kind == "crash":
        return Outcome("crash", message=f"killed by signal {reply.signal}", signal=reply.signal)
    if reply.kind == "timeout":
        return Outcome("hang", message=f"no answer within {reply.seconds:g} s", seconds=reply.seconds)
    return Outcome("crash", message=f"exited with code {reply.code} without an answer")


# ---------------------------------------------------------------- server side

def warm_up() -> None:
    """Pay one-time costs (compiler modules, FX codegen) before forking; runs no tensor code, so
    no thread pool exists yet and forking stays safe."""
    import tdbg.compiler
    from tdbg.minifier.artifacts.graph_io import trace_source
    for m in pkgutil.iter_modules(tdbg.compiler.__path__):
        with contextlib.suppress(Exception):   # a module that cannot load here only loses its head start
            importlib.import_module(f"tdbg.compiler.{m.name}")
    trace_source("import torch\nclass Repro(torch.nn.Module):\n    def forward(self, x):\n"
                 "        return (torch.ops.aten.neg.default(x), torch.neg(x))\n")


def remember(tensors: dict) -> None:
    """In the server (not forked): keep `tensors` for every later child."""
    _TENSORS.update(tensors)


def evaluate_query(msg: dict) -> dict:
    """In a forked child: the Outcome (as a dict) of the graph `msg["source"]` on its inputs."""
    from tdbg.minifier.artifacts.graph_io import TensorStore, trace_source
    from tdbg.minifier.reduce.oracle import evaluate
    store = TensorStore()
    store.tensors = _TENSORS
    gm = trace_source(msg["source"])
    return evaluate(gm, store.values(msg["inputs"]), msg["spec"]).to_dict()
