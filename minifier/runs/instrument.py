"""Inside the child process: send every torch.compile to one backend and record what happens.

`Session.install()` replaces `torch.compile` and `torch._dynamo.optimize` for the length of a
`with` block. Each graph Dynamo hands to the backend is recorded (frame, ops, why Dynamo cut the
graph there, user lines), every recompile (the guard that failed) and the guards of each frame.
Exceptions raised by the backend while compiling or by a compiled graph while running are
tagged with the stage and graph, so `classify` can tell them apart from the script's own errors.
An events file gets one JSON line per compile start/end and per graph's first call, and a
status file always holds where the program is now (graph, call number, running / returned /
in the backward): if the process dies from a signal or is killed at its timeout, the parent still
knows where it was. With `check_accuracy`, calls chosen by a `checks.CallPolicy` are checked
against eager on an untouched copy of the graph, forward and backward (diagnose/checks.py).
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import traceback
from typing import Any, Callable, Optional

from tdbg.compiler.errors import TdbgError
from tdbg.minifier.runs import own_backend
from tdbg.minifier.runs.backends import BackendError
from tdbg.minifier.runs.names import is_frame_of, source_line
from tdbg.minifier.runs.own_backend import Asked
from tdbg.minifier.diagnose import shapes
from tdbg.minifier.diagnose.checks import (AccuracyError, CallCounter, CallPolicy, check_call, node_source, places,
                                           signature, snapshot)

STATUS_BYTES = 512   # the status file is one line of this many bytes, rewritten in place
UNCHECKED_LINES = 3  # lines kept of why a call could not be checked
DETERMINISM_SIGNATURES = 4   # --check-determinism: input signatures checked per graph (first call's included)
_KERNEL_RANGE = re.compile(r"graph_\d+_(\w+)$")   # tdbg's profiler range around one kernel (wrapper.py)

# Frames from these directories are framework frames, never "the user's line".
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FRAMEWORK_DIRS = tuple(os.path.realpath(d) + os.sep for d in (
    os.path.dirname(traceback.__file__), *(os.path.join(_ROOT, p) for p in ("minifier", "cli", "compiler"))))


@functools.lru_cache(maxsize=4096)   # asked per frame on every call that builds an autograd graph
def is_user_file(filename: str) -> bool:
    """False for framework files and generated code (tdbg's output_code.py, <string> sources,
    the modules Inductor generates in its cache folder)."""
    real = os.path.realpath(filename)
    return not (real.startswith(_FRAMEWORK_DIRS) or "site-packages" in real or filename.startswith("<")
                or os.path.basename(filename) == "output_code.py" or _in_inductor_cache(real))


def _in_inductor_cache(real: str) -> bool:
    """Inside Inductor's cache folder: $TORCHINDUCTOR_CACHE_DIR, else its default
    <tmp>/torchinductor_<user> (any folder named torchinductor_*)."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if folder and real.startswith(os.path.realpath(folder) + os.sep):
        return True
    return any(part.startswith("torchinductor_") for part in real.split(os.sep)[:-1])


def user_frames(frames) -> list:
    """[{"file", "line", "function", "code"}] for FrameSummary-like frames outside frameworks."""
    return [{"file": f.filename, "line": f.lineno, "function": f.name, "code": (f.line or "").strip()}
            for f in frames if is_user_file(f.filename)]


def op_name(node) -> str:
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        mod = node.graph.owning_module.get_submodule(node.target) if node.graph.owning_module else None
        return type(mod).__name__ if mod is not None else str(node.target)
    return node.op


_STACK_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)\n\s*(?P<code>[^\n]*)')


def graph_lines(gm) -> list:
    """The user lines a graph's ops come from, in order, duplicates grouped: [{file, line, code, ops}]."""
    lines: dict = {}
    for node in gm.graph.nodes:
        frames = [m.groupdict() for m in _STACK_FRAME.finditer(node.meta.get("stack_trace") or "")]
        frames = [f for f in frames if is_user_file(f["file"])]
        if not node.op.startswith("call_") or not frames:
            continue
        f = frames[-1]
        entry = lines.setdefault((f["file"], int(f["line"])), {"file": f["file"], "line": int(f["line"]),
                                                               "code": f["code"].strip(), "ops": []})
        entry["ops"].append(op_name(node))
    return list(lines.values())


def _caller_line() -> Optional[str]:
    """'file:line in fn: code' of the innermost user frame on the current stack, or None."""
    import linecache
    import sys
    frame = sys._getframe(1)
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return source_line(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, code)


def _current_frame_name() -> str:
    from tdbg.compiler.torch_compat import InstructionTranslator
    try:
        return InstructionTranslator.current_tx().f_code.co_name
    except Exception:  # not inside a Dynamo translation (a backend called by hand)
        return "<unknown>"


def call_compiled(compiled: Callable, args) -> Any:
    # Dynamo calls a backend's result with positional args (aot_autograd's result carries a stale
    # `_boxed_call` copied by functools.wraps, so that attribute must not be trusted).
    return compiled(*args)


def _placeholder_symbols(gm) -> list:
    """Per placeholder of a Dynamo graph, the symbols of its sizes (graph_io.symbolic_dims of its
    fake value); [] when none is symbolic."""
    from tdbg.minifier.artifacts.graph_io import symbolic_dims
    dims = [symbolic_dims(n.meta.get("example_value", n.meta.get("val")))
            for n in gm.graph.nodes if n.op == "placeholder"]
    return dims if any(dims) else []


def call_symbols(dynamic, args) -> Optional[str]:
    """The plain symbols' values in one call ("s77=100, s27=8") from the graph's per-placeholder
    symbols and the call's arguments; None for a static graph."""
    if not dynamic:
        return None
    import torch
    values: dict = {}
    for dims, arg in zip(dynamic, args):
        sizes = tuple(arg.shape) if isinstance(arg, torch.Tensor) else (arg,)
        for symbol, size in zip(dims, sizes):
            if symbol and symbol.isidentifier() and isinstance(size, int):
                values.setdefault(symbol, size)
    return ", ".join(f"{k}={v}" for k, v in values.items()) or None


# Dynamo says it stopped compiling a frame (its recompile limit) only in this logger's warning:
# "torch._dynamo hit config.%s (%s)\n   function: %s\n   last reason: %s ..." with the limit's name,
# its value, "'NAME' (FILE:LINE)" and the guard failure that would have recompiled
_LIMIT_LOGGER = "torch._dynamo.convert_frame"
_LIMIT_FUNCTION = re.compile(r"^'(?P<frame>[^']*)' \((?P<file>.*):(?P<line>\d+)\)$")


class _LimitRecorder(logging.Handler):
    """Appends {frame, file, line, limit, value, reason} to `into` for each recompile-limit warning."""

    def __init__(self, into: list):
        super().__init__(logging.WARNING)
        self.into = into

    def emit(self, record) -> None:
        try:
            if not str(record.msg).startswith("torch._dynamo hit config.") or len(record.args or ()) < 4:
                return
            limit, value, function, reason = record.args[:4]
            m = _LIMIT_FUNCTION.match(str(function))
            self.into.append({"frame": m["frame"] if m else str(function), "file": m["file"] if m else None,
                              "line": int(m["line"]) if m else None, "limit": f"torch._dynamo.config.{limit}",
                              "value": value, "reason": str(reason or "")})
        except Exception:  # noqa: B902 - recording must never break the user's run
            pass


def _guard_summary(guards) -> dict:
    counts, tensors = {}, []
    for g in guards:
        kind = g.create_fn_name()
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "TENSOR_MATCH":
            tensors.append(g.name)
    return {"total": sum(counts.values()), "by_kind": dict(sorted(counts.items())), "tensors": tensors}


class Session:
    """Redirects compilation to `backend_fn` (None: run uncompiled) and records graphs.

    `check_accuracy` checks the calls `CallPolicy.every(check_calls)` picks. `status_path` turns
    on the status file and the backward hooks that put failures in a backward on their graph."""

    def __init__(self, backend_fn: Optional[Callable], *, backend_kind: str = "", backend_name: Optional[str] = None,
                 own: Optional[Callable] = None, script: Optional[str] = None, config=None,
                 fullgraph: bool = False, function: Optional[str] = None, check_accuracy: bool = False,
                 check_calls: Optional[int] = None, events_path: Optional[str] = None,
                 status_path: Optional[str] = None, check_determinism: bool = False):
        self.backend_fn, self.backend_kind, self.backend_name = backend_fn, backend_kind, backend_name
        # `own(Backend) -> Dynamo backend`: compile each call with its own backend (own_backend.py),
        # passed through `own` (which may wrap it: --save-io, repro dumps, profiling)
        self.own, self.script, self.config = own, script, config
        self._own_fns: dict = {}       # (asked text, dynamic, backend object) -> (compiler fn, kind, name)
        # (compiler fn, kind) -> the Dynamo backend: one object per compiler, as in the script's own run,
        # where torch.compile calls with one backend share Dynamo's compiled graphs (each layer of a model
        # compiled one by one calls the first layer's graph)
        self._dynamo_backends: dict = {}
        self.compile_records: list = []   # own_backend.CallRecord per torch.compile call
        self.setup_error: Optional[Exception] = None   # the script's own backend could not be set up
        self.fullgraph, self.function, self.check_accuracy = fullgraph, function, check_accuracy
        self.policy = CallPolicy.every(check_calls)
        self.check_determinism = check_determinism   # each graph's first call run twice (diagnose/determinism.py)
        self.events_path = events_path
        self._status_fd = os.open(status_path, os.O_WRONLY | os.O_CREAT, 0o600) if status_path else None
        self.backwards: list = []   # graphs whose backward is running now (innermost last)
        self.skipped_frames: list = []   # frames `function` left out (named if it matches none)
        self.node_sources: dict = {}   # graph -> {node name: (op name, user line or None)}
        self.compile_calls = 0
        self.graphs: list = []
        self.recompiles: list = []
        self.recompile_limits: list = []   # Dynamo's recompile limit hit: {frame, file, line, limit, value, reason}
        self._shapes = None   # the last graph's shapes.capture(), until its guards are exported
        self.guards: list = []
        self.tagged: list = []   # (exception, {"stage", "graph", "during"})
        self.code_recorder = None   # diagnose/code_view.CodeRecorder for explain --code
        self.graph_edit = None      # gm -> None, edits each Dynamo graph first (explain --break-at)

    # -- patching -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def install(self):
        import torch

        from tdbg.compiler.torch_compat import dynamo
        saved = (torch.compile, dynamo.optimize)
        self._optimize = saved[1]
        torch.compile, dynamo.optimize = self.compile, self.optimize
        limits = _LimitRecorder(self.recompile_limits)
        logging.getLogger(_LIMIT_LOGGER).addHandler(limits)
        try:
            yield self
        finally:
            torch.compile, dynamo.optimize = saved
            logging.getLogger(_LIMIT_LOGGER).removeHandler(limits)

    def compile(self, model=None, *, fullgraph: bool = False, dynamic=None, backend=None, mode=None,
                options=None, disable: bool = False, **_ignored):
        """torch.compile with each call's backend, mode and options kept (own) or replaced."""
        if model is None:   # @torch.compile(...) used as a decorator factory
            return lambda m: self.compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                                          options=options, disable=disable)
        self.compile_calls += 1
        fn_kind = self._backend_for(Asked(backend, mode, options), dynamic)
        if fn_kind is None or disable:
            return model
        return self._optimize(self._dynamo_backend_for(*fn_kind), nopython=fullgraph or self.fullgraph,
                              dynamic=dynamic, guard_fail_fn=self._guard_fail, guard_export_fn=self._guard_export)(model)

    def optimize(self, backend=None, *args, nopython: bool = False, **kwargs):
        self.compile_calls += 1
        fn_kind = self._backend_for(Asked(backend), kwargs.get("dynamic"))
        if fn_kind is None:
            return self._optimize(backend or "eager", disable=True)
        kwargs.setdefault("guard_fail_fn", self._guard_fail)
        kwargs.setdefault("guard_export_fn", self._guard_export)
        return self._optimize(self._dynamo_backend_for(*fn_kind), nopython=nopython or self.fullgraph, **kwargs)

    def _backend_for(self, asked: "Asked", dynamic) -> Optional[tuple]:
        """(compiler fn, kind) that compiles this call — its own backend, or the one that replaces
        it — recording the call; None for an uncompiled run."""
        name = own_backend.name_of(asked, self.script)
        if self.own is None:
            ran = self.backend_name if self.backend_fn is not None else None
            replaced = ran is not None and (ran != name or bool(asked.extras))
            self.compile_records.append(own_backend.CallRecord(self.compile_calls, asked, name, ran, replaced))
            return None if self.backend_fn is None else (self.backend_fn, self.backend_kind)
        key = (asked.text(), repr(dynamic), id(asked.backend))
        if key not in self._own_fns:
            try:
                resolved, _ = own_backend.resolve_call(asked, dynamic, self.config, self.script)
                self._own_fns[key] = (self.own(resolved), resolved.kind, resolved.name)
            except BackendError as e:   # e.g. --after aot for a backend with no AOT stage: bad input
                self.setup_error = e
                raise
        fn, kind, ran = self._own_fns[key]
        self.compile_records.append(own_backend.CallRecord(self.compile_calls, asked, name, ran))
        return fn, kind

    def _dynamo_backend_for(self, fn, kind):
        key = (id(fn), kind)
        if key not in self._dynamo_backends:
            def backend(gm, example_inputs):
                return self.dynamo_backend(gm, example_inputs, fn, kind)
            self._dynamo_backends[key] = (fn, backend)   # fn kept: its id names it while the run lasts
        return self._dynamo_backends[key][1]

    # -- the Dynamo backend ---------------------------------------------------------------------
    def dynamo_backend(self, gm, example_inputs, backend_fn=None, backend_kind=None):
        backend_fn = backend_fn or self.backend_fn
        backend_kind = self.backend_kind if backend_kind is None else backend_kind
        frame = _current_frame_name()
        if self.function and not is_frame_of(frame, self.function):
            # Skipping the frame (not running its graph eagerly) lets Dynamo see the functions it
            # calls as frames of their own, so `--function inner` works when inner is inlined.
            from tdbg.compiler.torch_compat import SkipFrame
            if frame not in self.skipped_frames:
                self.skipped_frames.append(frame)
            raise SkipFrame(f"tdbg --function {self.function}: frame {frame} not selected")
        index = len(self.graphs)
        info = {"index": index, "frame": frame, "ops": [op_name(n) for n in gm.graph.nodes
                                                        if n.op.startswith("call_")],
                "lines": graph_lines(gm)}
        info.update(self._reason(gm))
        dynamic = _placeholder_symbols(gm)
        if dynamic:   # a graph with symbolic sizes: each failing call names the sizes it ran at
            info["dynamic"] = dynamic
        self.graphs.append(info)
        self._shapes = shapes.capture(gm, example_inputs)   # described at guard export (explain's shapes)
        self.node_sources[index] = {n.name: (op_name(n), node_source(n, is_user_file))
                                    for n in gm.graph.nodes if n.op.startswith("call_")}
        first = (info["lines"] or info["stack"] or [None])[0]
        self.event("compile_start", graph=index, frame=frame,
                   source=f"{first['file']}:{first['line']}  {first['code']}" if first else None)
        if self.code_recorder is not None:
            self.code_recorder.note_graph(index, gm)
        if self.graph_edit is not None:
            self.graph_edit(gm)
        self.status("compiling", index, 0)
        # the reference must run the graph Dynamo made, not what an in-place editing backend left
        snap = snapshot(gm) if self.check_accuracy or self.check_determinism else None
        try:
            compiled = backend_fn(gm, example_inputs)
        except BaseException as e:
            self.tag(e, compile_stage(e, backend_kind), index, "compile")
            raise
        self.event("compiled", graph=index)
        self.status("compiled", index, 0)
        return self._wrap_call(compiled, snap, info, backend_fn)

    def _wrap_call(self, compiled, snap, info, backend_fn=None):
        index, counter = info["index"], CallCounter(self.policy)
        determined: set = set()   # input signatures whose determinism was checked (--check-determinism)

        def run(*args):
            # input signatures are only worth computing when calls are checked
            call, check = counter.next_call(args) if self.check_accuracy else (counter.count(), False)
            try:
                if call == 1:
                    self.event("first_call", graph=index)
                self.status("running", index, call)
                if self.check_determinism and len(determined) < DETERMINISM_SIGNATURES and (
                        call == 1 or signature(args) not in determined):
                    # the first call and each call with new input shapes: a graph compiled for
                    # dynamic sizes runs other kernel paths (a parallel reduction above its grain size)
                    determined.add(signature(args))
                    self._determinism(compiled, snap, info, args, backend_fn, call)
                if check:
                    actual = self._checked_call(compiled, snap, info, call, args)
                else:
                    actual = call_compiled(compiled, args)
            except BaseException as e:
                self.tag(e, runtime_stage(e), index, getattr(e, "tdbg_during", "run"), call,
                         sizes=call_symbols(info.get("dynamic"), args))
                raise
            self.status("returned", index, call)
            if self._status_fd is not None:   # only runs that report where they died pay for this
                self._watch_backward(actual, index, call)
            return actual
        run.tdbg_graph = index   # explain --code finds the graph a transformed frame calls by this
        return run

    def _checked_call(self, compiled, snap, info, call: int, args):
        result = check_call(compiled, snap, args, call=lambda fn, a: call_compiled(fn, a))
        if result.forward_checked:
            info["checked"] = True
            info["checked_calls"] = info.get("checked_calls", 0) + 1
        info["grads_checked"] = info.get("grads_checked", 0) + int(result.grads_checked)
        if result.draws_random:
            info["draws_random"] = True
        if result.unchecked:
            # whole lines (a cut line may be the part that helps), the first few of a long error
            reason = "\n".join(result.unchecked.splitlines()[:UNCHECKED_LINES])
            info.setdefault("unchecked", []).append({"call": call, "reason": reason})
        for part, found in (("forward", result.forward), ("backward", result.backward)):
            if found:
                error = AccuracyError(info["index"], call, part, found, places(snap, is_user_file),
                                      draws_random=result.draws_random)
                error.tdbg_during = part if part == "backward" else "run"
                raise error
        return result.actual

    def _determinism(self, compiled, snap, info, args, backend_fn, call: int = 1) -> None:
        """--check-determinism at a graph's call, before the user's call (which then runs from the
        same RNG state and inputs): the graph's record holds the first nondeterministic call's
        answer (else the first call's), `determinism_calls` every checked call's number."""
        from tdbg.minifier.diagnose.determinism import check_graph, localizer
        found = check_graph(lambda *a: call_compiled(compiled, a), snap, args, graph=info["index"], call=call,
                            localize_with=localizer(backend_fn, self.config) if backend_fn is not None else None)
        record = found.to_dict()
        node = record.get("first_node")
        if node and node.get("source"):
            from tdbg.minifier.runs.runner import _rel_source
            node["source"] = _rel_source(node["source"])
        info.setdefault("determinism_calls", []).append(call)
        if "determinism" not in info or (record["nondeterministic"] and not info["determinism"]["nondeterministic"]):
            info["determinism"] = record

    def _watch_backward(self, outputs, index: int, call: int) -> None:
        """Hooks on the outputs' autograd node: the status file and `backwards` say when this
        graph's backward runs, so a failure there is put on the right graph."""
        import torch

        from tdbg.compiler.torch_compat import pytree
        nodes = {id(t.grad_fn): t.grad_fn for t in pytree.tree_leaves(outputs)
                 if isinstance(t, torch.Tensor) and t.grad_fn is not None}
        if not nodes:
            return
        entry = (index, call, _caller_line())   # the forward's call site: where its backward came from
        for node in nodes.values():
            node.register_prehook(lambda grads, e=entry: self._backward(True, e))
            node.register_hook(lambda grads_in, grads_out, e=entry: self._backward(False, e))

    def _backward(self, starting: bool, entry: tuple) -> None:
        if starting:
            self.backwards.append(entry)
            self.status("backward", entry[0], entry[1])
        else:
            if entry in self.backwards:
                self.backwards.remove(entry)
            self.status("backward_done", entry[0], entry[1])

    @staticmethod
    def _reason(gm) -> dict:
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is None:
            return {"reason": "", "graph_break": False, "stack": []}
        return {"reason": str(reason.reason), "graph_break": bool(reason.graph_break),
                "stack": user_frames(reason.user_stack or [])}

    def _guard_fail(self, failure):
        code = failure.orig_code
        self.recompiles.append({"frame": code.co_name, "file": code.co_filename,
                                "line": code.co_firstlineno, "reason": str(failure.reason),
                                "graphs_before": len(self.graphs)})

    def _guard_export(self, guards):
        # Dynamo exports a frame's guards right after handing its graph to the backend.
        frame = self.graphs[-1]["frame"] if self.graphs else "<unknown>"
        captured, self._shapes = self._shapes, None
        self.guards.append({"frame": frame, **_guard_summary(guards), "shapes": shapes.describe(captured)})

    # -- bookkeeping ----------------------------------------------------------------------------
    def tag(self, exc: BaseException, stage: str, graph: int, during: str, call: Optional[int] = None,
            sizes: Optional[str] = None) -> None:
        """`sizes`: a graph with symbolic sizes, the symbols' values in the failing call ("s77=100")."""
        if not any(e is exc for e, _ in self.tagged):
            self.tagged.append((exc, {"stage": stage, "graph": graph, "during": during, "call": call,
                                      "sizes": sizes}))

    def tag_of(self, exc: BaseException) -> Optional[dict]:
        for e, info in self.tagged:
            if e is exc:
                return info
        return None

    def backward_tag(self, exc: BaseException) -> Optional[dict]:
        """The tag of an exception raised while a compiled graph's backward ran (autograd calls
        the backward outside `run`, so nothing tagged it), or None."""
        if not self.backwards:
            return None
        graph, call, site = self.backwards[-1]
        return {"stage": runtime_stage(exc), "graph": graph, "during": "backward", "call": call, "site": site}

    def status(self, state: str, graph: int, call: int) -> None:
        """Rewrite the status file: where the program is now (read if the process dies)."""
        if self._status_fd is None:
            return
        line = json.dumps({"state": state, "graph": graph, "call": call}).encode()
        os.pwrite(self._status_fd, line[:STATUS_BYTES - 1].ljust(STATUS_BYTES - 1) + b"\n", 0)

    def event(self, name: str, **fields) -> None:
        if not self.events_path:
            return
        with open(self.events_path, "a") as f:
            f.write(json.dumps({"event": name, **fields}) + "\n")
            f.flush()


def exception_chain(exc: BaseException) -> list:
    """exc, then what it wraps (Dynamo's inner_exception, __cause__, __context__), no repeats."""
    chain, todo = [], [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is c for c in chain):
            continue
        chain.append(e)
        todo += [getattr(e, "inner_exception", None), e.__cause__, e.__context__]
    return chain


def typed_error(exc: BaseException) -> Optional[TdbgError]:
    return next((e for e in exception_chain(exc) if isinstance(e, TdbgError)), None)


def _torch_lacks_internal(exc: BaseException) -> bool:
    """A torch internal tdbg relies on is missing (torch_compat): tdbg's fault with this torch,
    never the user's graph's, so no stage of the user's program is blamed."""
    from tdbg.compiler.torch_compat import TorchCompatError
    return any(isinstance(e, TorchCompatError) for e in exception_chain(exc))


def foreign_stage(exc: BaseException) -> Optional[str]:
    """The stage another compiler's own exception puts a failure at (Inductor's C++ compile
    error: cpp_build, see inductor_hooks.STAGES), or None."""
    from tdbg.minifier.runs import inductor_hooks
    return inductor_hooks.stage_of(exception_chain(exc))


def compile_stage(exc: BaseException, backend_kind: str) -> str:
    """The stage a backend compile failure belongs to."""
    if _torch_lacks_internal(exc):
        return "internal"
    typed = typed_error(exc)
    if typed is not None:
        return typed.stage
    foreign = foreign_stage(exc)
    if foreign is not None:
        return foreign
    if backend_kind not in ("aot_eager", "inductor"):
        return "backend"
    frames = traceback.extract_tb(exc.__traceback__)
    if any(f.name == "compile_aten" for f in frames):
        return "backend"
    if any(f"torch{os.sep}_functorch" in f.filename or f"torch{os.sep}_decomp" in f.filename for f in frames):
        return "aot_autograd"
    return "backend"


def runtime_stage(exc: BaseException) -> str:
    if _torch_lacks_internal(exc):
        return "internal"
    typed = typed_error(exc)
    return typed.stage if typed is not None else (foreign_stage(exc) or "backend")


# -- tdbg run --save-io -------------------------------------------------------------------------
@contextlib.contextmanager
def _stderr_silenced():
    """File descriptor 2 to /dev/null: the profiler's C++ side logs start/stop lines there, which
    are not the user's program's output."""
    import sys
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _with_attributes(snap, state, ended: dict, before: list, eager_in: list, args: Optional[list]) -> tuple:
    """(before, eager_in, args) extended by the graph's get_attr values (the save-io folder's
    inputs after the graph's own, graph_io.from_graph_module): the saved ones, eager's after its
    run, the program's now (None where args is None)."""
    import torch

    from tdbg.minifier.diagnose.kept_state import fetch_attr
    targets = [n.target for n in snap.graph.nodes if n.op == "get_attr"
               and not isinstance(fetch_attr(snap, n.target), torch.fx.GraphModule)]
    saved = [state.saved.get(t) for t in targets]
    return (before + saved, eager_in + [ended.get(t, v) for t, v in zip(targets, saved)],
            None if args is None else list(args) + [state.tensors.get(t) for t in targets])


def _in_place(before: list, eager_in: list, args: Optional[list]) -> list:
    """[(input index, eager's value after its run, the compiled call's (None: it failed))] for the
    tensor inputs that either side changed in place."""
    import torch

    from tdbg.repro_templates.runtime import same_bits
    out = []
    for i, b in enumerate(before):
        a = args[i] if args is not None and isinstance(args[i], torch.Tensor) else None
        if isinstance(b, torch.Tensor) and not (same_bits(b, eager_in[i]) and (a is None or same_bits(b, a))):
            out.append((i, eager_in[i], None if a is None else a.detach().clone()))
    return out


class IOSaver:
    """`tdbg run --save-io DIR`: the backend to run, with every graph it compiles saved at each call
    with a new input signature (checks.signature): real inputs, eager's outputs on the graph as it
    was handed to the compiler, the compiled outputs (artifacts/saved_io.py writes the folder).

    A backend with an AOT stage (aot_capture FAMILIES) is hooked there: forward, backward and
    inference aten graphs are saved. Any other backend is wrapped whole: the Dynamo graph is saved
    (kind "dynamo"; `after` says which). With `profile`, each saved aten graph is timed on copies
    of its inputs by diagnose/timing.measure (warmed up until stable, then sampled to a budget,
    NOISY when the machine was busy or the samples spread); a Dynamo graph (which may mutate
    module state) only by its later calls in the script, the first WARMUP_LATER_CALLS of them
    left out as warm-up (too few left: NOISY, and the record says why)."""

    MAX_SIGNATURES = 20        # per graph: a graph called with ever new shapes is not saved forever
    MAX_TIMED_CALLS = 50
    KERNEL_REPEATS = 10        # profiled calls of each saved tdbg graph, for its per-kernel times
    WARMUP_LATER_CALLS = 2     # a Dynamo graph's later calls not timed (they still warm up)

    def __init__(self, writer, backend, config, *, profile: bool = False, counter=None):
        import itertools

        from tdbg.minifier.reduce.oracle import backend_spec, config_fields
        from tdbg.minifier.runs import aot_capture
        self.writer, self.profile = writer, profile
        self.backend = backend
        self.counter = counter or itertools.count()   # shared by the savers of one folder: unique graph numbers
        spec = {"backend": backend_spec(backend, getattr(backend, "name", None)), "config": config_fields(config)}
        self.family = aot_capture.family_of(backend)
        if self.family is not None:
            self.after = "aot"
            _, self.backend_fn = aot_capture.capture(backend, self._aot_hook, config)
        else:
            self.after = "dynamo"
            self.backend_fn = self._dynamo_hook
        self.spec = dict(spec, after=self.after)
        self.timings: dict = {}    # saved graph name -> a Dynamo graph's later call times (seconds)
        self.measured: dict = {}   # saved graph name -> timing.Timing of an aten graph
        self.first_call_s: dict = {}   # saved graph name -> time of its saved (first) call
        from tdbg.minifier.diagnose.timing import CpuWatch
        self.watch = CpuWatch()    # how busy the machine was over the run (a Dynamo graph's calls)
        # per-kernel times need tdbg's compiler built with profiler ranges around its kernels
        self.per_kernel = profile and self.family == "tdbg" and bool(getattr(config, "enable_kernel_profile", False))
        self.kernel_timings: dict = {}   # saved graph name -> {kernel: [seconds]}

    def _aot_hook(self, gm, example_inputs, kind: str, compile_one):
        snap, index = snapshot(gm), self._next()
        compiled = compile_one(gm, example_inputs)
        from tdbg.compiler import static_input_names
        aot = {"family": self.family, "graph": kind}
        if self.family == "tdbg" and kind == "inference" and static_input_names(gm):
            aot["static_inputs"] = static_input_names(gm)   # what tdbg's compiler hoists (hoist.py)
        return self._wrap(compiled, snap, kind, index, dict(self.spec, aot=aot))

    def _dynamo_hook(self, gm, example_inputs):
        snap, index = snapshot(gm), self._next()
        compiled = getattr(self.backend, "compiler_fn", self.backend)(gm, example_inputs)
        return self._wrap(compiled, snap, "dynamo", index, self.spec)

    def _next(self) -> int:
        return next(self.counter)

    def _wrap(self, compiled, snap, kind: str, index: int, replay: dict):
        from tdbg.minifier.diagnose.checks import signature
        saved: dict = {}   # signature -> saved graph name (or None: not saved)
        calls = [0]

        def run(*args):
            calls[0] += 1
            sig = repr(signature(args))
            if sig not in saved:
                if len(saved) >= self.MAX_SIGNATURES:
                    saved[sig] = None
                    self.writer.skip(kind, index, calls[0], f"more than {self.MAX_SIGNATURES} input signatures")
                    return compiled(*args)
                saved[sig] = None
                return self._save_call(compiled, snap, kind, index, calls[0], args, replay, sig, saved)
            name = saved[sig]
            if name is None or not self.profile or name in self.measured \
                    or len(self.timings.get(name, ())) >= self.MAX_TIMED_CALLS:
                return compiled(*args)
            import time
            start = time.perf_counter()
            result = compiled(*args)
            self.timings.setdefault(name, []).append(time.perf_counter() - start)
            return result
        return run

    def _save_call(self, compiled, snap, kind, index, call, args, replay, sig, saved):
        import time

        import torch

        from tdbg.minifier.diagnose.accuracy import flatten
        from tdbg.minifier.diagnose.checks import _clones
        from tdbg.minifier.diagnose.kept_state import KeptState
        before = _clones(args)
        eager_in = _clones(before)   # eager's in-place changes land here
        state = KeptState(snap)      # get_attr tensors: saved as they were before the call
        rng = torch.get_rng_state()
        try:
            with torch.no_grad(), state.from_saved() as ended:
                expected = [v for _, v in flatten(snap(*eager_in))]
        except Exception as e:  # eager cannot run the graph: nothing to save as its truth
            torch.set_rng_state(rng)
            self.writer.skip(kind, index, call, f"eager failed on the graph: {type(e).__name__}: {e}")
            return compiled(*args)
        torch.set_rng_state(rng)
        start = time.perf_counter()
        try:
            actual = compiled(*args)
        except BaseException as e:
            self._write(kind, index, call, snap, before, expected, None, f"{type(e).__name__}: {e}", replay, sig, saved,
                        rng, _in_place(*_with_attributes(snap, state, ended, before, eager_in, None)), state)
            raise
        seconds = time.perf_counter() - start
        outputs = [v.detach() if isinstance(v, torch.Tensor) else v for _, v in flatten(actual)]
        name = self._write(kind, index, call, snap, before, expected, outputs, None, replay, sig, saved, rng,
                           _in_place(*_with_attributes(snap, state, ended, before, eager_in, args)), state)
        if name and self.profile:
            self.first_call_s[name] = seconds
            if self.after == "aot":
                self._repeat(compiled, before, name)
        return actual

    def _repeat(self, compiled, inputs, name: str) -> None:
        """Time the graph on copies of the saved inputs (timing.measure: warm-up left out): aten
        graphs after AOTAutograd are functional, so this changes nothing the program sees (the
        RNG state is put back); a first call alone would time lazy loading too."""
        import torch

        from tdbg.minifier.diagnose.checks import _clones
        from tdbg.minifier.diagnose.timing import measure
        rng = torch.get_rng_state()
        try:
            self.measured[name] = measure(compiled, setup=lambda: _clones(inputs))
            if self.per_kernel:
                self.kernel_timings[name] = self._kernel_times(compiled, inputs)
        except Exception:  # a call that fails on a copy: keep what was timed (the saved call at least)
            pass
        finally:
            torch.set_rng_state(rng)

    def _kernel_times(self, compiled, inputs) -> dict:
        """kernel name -> its times (seconds) over KERNEL_REPEATS calls (after `measure` warmed the
        graph up), from the profiler ranges tdbg's wrapper puts around each kernel with
        `enable_kernel_profile` (separate calls: the profiler's overhead must not reach the
        graph's own times)."""
        import torch

        from tdbg.minifier.diagnose.checks import _clones
        with _stderr_silenced(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(self.KERNEL_REPEATS):
                compiled(*_clones(inputs))
        times: dict = {}
        for event in prof.events():
            match = _KERNEL_RANGE.match(event.name)
            if match:
                times.setdefault(match.group(1), []).append(event.cpu_time_total / 1e6)
        return times

    def _write(self, kind, index, call, snap, inputs, expected, compiled, error, replay, sig, saved, rng, in_place,
               state):
        try:
            with state.from_saved():   # its get_attr tensors are saved as the call found them
                name = self.writer.add(kind=kind, graph=index, call=call, gm=snap, inputs=inputs, expected=expected,
                                       compiled=compiled, compiled_error=error, replay=replay, signature=sig,
                                       rng_state=rng, in_place=in_place,
                                       node_sources={n.name: node_source(n, is_user_file) for n in snap.graph.nodes
                                                     if n.op.startswith("call_") and node_source(n, is_user_file)})
        except Exception as e:  # the user's run goes on; the manifest says what was not saved
            self.writer.skip(kind, index, call, f"saving failed: {type(e).__name__}: {e}")
            return None
        saved[sig] = name
        return name

    def finish(self) -> None:
        """Write the timings (timing.Timing records; a graph with none but its saved first call gets
        that one, NOISY) and the manifest."""
        if self.profile:
            from tdbg.minifier.diagnose.timing import Timing
            share = self.watch.share()
            for name, first in self.first_call_s.items():
                later = self.timings.get(name, [])[self.WARMUP_LATER_CALLS:]
                timing = self.measured.get(name) or (
                    Timing(later, warmup_calls=1 + self.WARMUP_LATER_CALLS, busy_share=share) if later else
                    Timing([first], noisy="only the first call was timed (it includes warm-up): the graph was not "
                                          "called again with these input shapes"))
                kernels = {k: Timing(v, busy_share=timing.busy_share).to_dict()
                           for k, v in sorted(self.kernel_timings.get(name, {}).items()) if v}
                self.writer.set_timing(name, timing.to_dict(), kernels or None)
        self.writer.finish()
