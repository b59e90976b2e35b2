"""Warm, isolated workers for the minifier's queries, on top of `forkserver`.

`Pool.query(source, specs, store, spec) -> Outcome`: a warm fork server (torch and tdbg's
compiler already imported) forks a child that rebuilds the graph from its source, evaluates it
(`oracle.evaluate`) and returns the outcome. A child that dies from a signal becomes a `crash`
outcome with that signal, one that outlives the per-query timeout is killed and becomes a `hang`;
the minifier carries on. Each child leads its own process group, killed with it when the query
ends, so a backend's subprocess never outlives its query. Each child may allocate at most
`memory_limit` bytes (default half the RAM); a query that runs out (MemoryError, an allocator's
"can't allocate memory" while compiling or running, or the OOM killer) is an `out_of_memory`
outcome. A server that dies or stalls is replaced (`Pool.replaced` counts them).

Tensors cross to each server once (keyed by InputSpec.key, kept in `_TENSORS` inside the server and
inherited by every forked child); the graph crosses as source text.
"""
from __future__ import annotations

import contextlib
import importlib
import pkgutil
from typing import Optional

from tdbg.compiler.torch_compat import MINIFY_WARM
from tdbg.minifier.runs import forkserver
from tdbg.minifier.reduce.oracle import Outcome

DEFAULT = object()   # Pool(memory_limit=...): the machine's default
# An exception whose text holds one of these is an allocation that failed: under a query's
# memory limit that is the limit speaking, not the failure being minified.
ALLOCATION_FAILED = ("can't allocate memory", "std::bad_alloc", "Cannot allocate memory",
                     "virtual memory exhausted", "out of memory allocating")
# outcome kind whose allocation failure becomes out_of_memory -> what the query was doing; an
# eager failure stays `invalid` (the candidate is no compiler failure), never passing for the backend's
OUT_OF_MEMORY_FROM = {"compile_error": "compiling", "runtime_error": "running the compiled graph"}

# imported before the first fork, so no query pays for them (torch._dynamo alone takes seconds);
# a superset of runner.ZYGOTE_WARM, so `Pool.servers` can also fork the capture run
# (the torch internals among them: torch_compat.MINIFY_WARM, each checked by tests/compat)
WARM = ("torch", "sympy", *MINIFY_WARM, "tdbg.compiler", "tdbg.minifier.diagnose.accuracy",
        "tdbg.minifier.runs.backends", "tdbg.minifier.runs.instrument", "tdbg.minifier.runs.runner", "tdbg.minifier.artifacts.graph_io",
        "tdbg.minifier.reduce.oracle", "tdbg.minifier.reduce.workers:warm_up")
_TENSORS: dict = {}   # server side: InputSpec.key -> tensor, filled by `remember`
# named backend -> in-server handler paying that backend's once-per-process costs, run before the
# first query (or capture) that uses it, so forked children inherit them instead of each paying
BACKEND_WARM = {"torch:inductor": "tdbg.minifier.reduce.workers:warm_inductor"}


class Pool:
    """Workers that answer `query`; `spares` extra servers are kept warm so a replacement is instant.
    `memory_limit`: bytes one query may allocate on top of its warm server (None: no limit;
    default `forkserver.default_memory_limit()`)."""

    def __init__(self, timeout: float = 60.0, spares: int = 0, memory_limit: Optional[int] = DEFAULT):
        self.timeout = timeout
        self.memory_limit = forkserver.default_memory_limit() if memory_limit is DEFAULT else memory_limit
        self._servers = forkserver.Pool(WARM, size=1 + spares, keep_warm=1 + spares)

    @property
    def replaced(self) -> int:
        return self._servers.replaced

    @property
    def servers(self) -> forkserver.Pool:
        """The warm servers themselves, for `runner.run_script(request, pool=...)`: the capture run
        forks from the server that then answers the queries, so torch is imported once, not twice
        at the same time (on 2 cores that halved the start of `tdbg minify SCRIPT`)."""
        return self._servers

    def query(self, source: str, specs: list, store, spec: dict, constants: tuple = ()) -> Outcome:
        """The outcome of the graph `source` on the inputs `specs`, with its tensor `constants`
        (Case.constants) set as the attributes it reads; values from `store`."""
        for _attempt in range(2):
            try:
                with self._servers.server() as server:
                    return self._query(server, source, specs, store, spec, tuple(constants))
            except forkserver.Unavailable:
                raise
            except (forkserver.ServerDied, OSError):
                continue
        return Outcome("hang", message=f"the worker stopped answering (timeout {self.timeout:g} s)")

    def prepare(self, backend: Optional[str]) -> None:
        """Warm the idle server for `backend` (a name as in BACKEND_WARM; others need nothing),
        e.g. before a capture run forks from it. A warm-up that fails only loses its head start."""
        if backend in BACKEND_WARM:
            with contextlib.suppress(forkserver.ServerDied, OSError):
                with self._servers.server() as server:
                    self._prepare(server, backend)

    def _prepare(self, server: forkserver.Client, backend: Optional[str]) -> None:
        done = server.state.setdefault("warm", set())
        if backend in BACKEND_WARM and backend not in done:
            done.add(backend)
            server.call(BACKEND_WARM[backend], None, fork=False, timeout=forkserver.STARTUP_TIMEOUT)

    def _query(self, server: forkserver.Client, source: str, specs: list, store, spec: dict,
               constants: tuple) -> Outcome:
        self._prepare(server, (spec.get("backend") or {}).get("name"))
        seen = server.state.setdefault("tensors", set())
        new = {s.key: store.tensors[s.key] for s in (*specs, *constants) if s.is_tensor and s.key not in seen}
        if new:
            reply = server.call("tdbg.minifier.reduce.workers:remember", new, fork=False, timeout=self.timeout)
            if reply.kind != "ok":
                raise forkserver.ServerDied(reply.value)
            seen.update(new)
        reply = server.call("tdbg.minifier.reduce.workers:evaluate_query",
                            {"source": source, "inputs": specs, "constants": constants, "spec": spec,
                             "memory_limit": self.memory_limit},
                            timeout=self.timeout, session=True, memory_limit=self.memory_limit)
        return _outcome(reply, self.memory_limit)

    def close(self) -> None:
        self._servers.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _outcome(reply: forkserver.Reply, memory_limit: Optional[int]) -> Outcome:
    if reply.kind == "ok":
        return Outcome.from_dict(reply.value)
    if reply.kind == "out_of_memory":
        return Outcome("out_of_memory", "MemoryError", f"{reply.value}; {_limit_text(memory_limit)}",
                       signal=reply.signal or 0)
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
                 "        neg = torch.ops.aten.neg.default(x)\n        neg_1 = torch.neg(x)\n"
                 "        return (neg, neg_1)\n")


def warm_inductor(_payload=None) -> None:
    """In the server: import the Inductor modules a first compile loads (~400) and run its CPU
    vector-ISA probe (it compiles a library and loads it in a fresh interpreter that imports
    torch: 3.5 s per process with a warm disk cache, 20 s cold, on the busy 2-core machine), both
    cached per process. Runs no tensor op here, so forking stays safe."""
    from tdbg.minifier.runs import inductor_hooks
    inductor_hooks.warm()


def remember(tensors: dict) -> None:
    """In the server (not forked): keep `tensors` for every later child."""
    _TENSORS.update(tensors)


def evaluate_query(msg: dict) -> dict:
    """In a forked child: the Outcome (as a dict) of the graph `msg["source"]` on its inputs."""
    from tdbg.minifier.artifacts.graph_io import TensorStore, trace_source
    from tdbg.minifier.reduce.oracle import evaluate
    store = TensorStore()
    store.tensors = _TENSORS
    gm = trace_source(msg["source"], constants=msg.get("constants", ()), store=store)
    return _memory_verdict(evaluate(gm, store.values(msg["inputs"]), msg["spec"]), msg.get("memory_limit")).to_dict()


def _memory_verdict(outcome: Outcome, memory_limit: Optional[int]) -> Outcome:
    """`outcome`, or out_of_memory when the backend failed to allocate (see ALLOCATION_FAILED)."""
    text = f"{outcome.exc_type}: {outcome.message}"
    if outcome.kind not in OUT_OF_MEMORY_FROM or not (
            outcome.exc_type == "MemoryError" or any(p in text for p in ALLOCATION_FAILED)):
        return outcome
    first = next((line for line in text.splitlines() if line.strip()), text)
    return Outcome("out_of_memory", outcome.exc_type, f"{first} (while {OUT_OF_MEMORY_FROM[outcome.kind]}); "
                   f"{_limit_text(memory_limit)}", stage=outcome.stage or outcome.kind, seconds=outcome.seconds)


def _limit_text(memory_limit: Optional[int]) -> str:
    if memory_limit is None:
        return "no memory limit was set: the machine ran out"
    return f"the query's memory limit is {memory_limit / 2**30:.2f} GiB (tdbg minify --memory-limit)"
