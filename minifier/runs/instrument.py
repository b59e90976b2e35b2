"""Inside the child process: send every torch.compile to one backend and record what happens.

`Session.install()` replaces `torch.compile` and `torch._dynamo.optimize` for the length of a
`with` block. Each graph Dynamo hands to the backend is recorded (frame, ops, why Dynamo cut the
graph there, user lines), every recompile (the guard that failed) and the guards of each frame.
Exceptions raised by the backend while compiling or by a compiled graph while running are
tagged with the stage and graph, so `classify` can tell them apart from the script's own errors.
An events file gets one JSON line per compile start/end and per graph's first call: if the
process dies from a signal the parent still knows where it was.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import traceback
from typing import Any, Callable, Optional

from tdbg.compiler.errors import TdbgError

# Frames from these directories are framework frames, never "the user's line".
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FRAMEWORK_DIRS = tuple(os.path.realpath(d) + os.sep for d in (
    os.path.dirname(traceback.__file__), *(os.path.join(_ROOT, p) for p in ("minifier", "cli", "compiler"))))


class AccuracyError(TdbgError):
    """A compiled graph's first call returned results that differ from eager."""
    stage = "accuracy"

    def __init__(self, graph: int, mismatches: list):
        self.graph, self.mismatches = graph, mismatches
        lines = [f"{m.output} ({m.dtype}{list(m.shape)}): {m.message}" for m in mismatches]
        super().__init__(f"compiled graph {graph} differs from eager:\n" + "\n".join(lines))

    def evidence(self) -> dict:
        return {"stage": self.stage, "message": str(self),
                "mismatches": [m.to_dict() for m in self.mismatches]}


def is_user_file(filename: str) -> bool:
    """False for framework files and generated code (tdbg's output_code.py, <string> sources)."""
    real = os.path.realpath(filename)
    return not (real.startswith(_FRAMEWORK_DIRS) or "site-packages" in real or filename.startswith("<")
                or os.path.basename(filename) == "output_code.py")


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


def _current_frame_name() -> str:
    from torch._dynamo.symbolic_convert import InstructionTranslator
    try:
        return InstructionTranslator.current_tx().f_code.co_name
    except Exception:  # not inside a Dynamo translation (a backend called by hand)
        return "<unknown>"


def _frame_matches(frame: str, function: str) -> bool:
    return frame == function or frame.startswith(f"torch_dynamo_resume_in_{function}_at_")


def call_compiled(compiled: Callable, args) -> Any:
    # Dynamo calls a backend's result with positional args (aot_autograd's result carries a stale
    # `_boxed_call` copied by functools.wraps, so that attribute must not be trusted).
    return compiled(*args)


def _clone(args) -> list:
    import torch
    return [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]


def _detach(value):
    import torch.utils._pytree as pytree
    import torch
    return pytree.tree_map(lambda v: v.detach() if isinstance(v, torch.Tensor) else v, value)


def _guard_summary(guards) -> dict:
    counts, tensors = {}, []
    for g in guards:
        kind = g.create_fn_name()
        counts[kind] = counts.get(kind, 0) + 1
        if kind == "TENSOR_MATCH":
            tensors.append(g.name)
    return {"total": sum(counts.values()), "by_kind": dict(sorted(counts.items())), "tensors": tensors}


class Session:
    """Redirects compilation to `backend_fn` (None: run uncompiled) and records graphs."""

    def __init__(self, backend_fn: Optional[Callable], *, backend_kind: str = "", fullgraph: bool = False,
                 function: Optional[str] = None, check_accuracy: bool = False,
                 events_path: Optional[str] = None):
        self.backend_fn, self.backend_kind = backend_fn, backend_kind
        self.fullgraph, self.function, self.check_accuracy = fullgraph, function, check_accuracy
        self.events_path = events_path
        self.compile_calls = 0
        self.graphs: list = []
        self.recompiles: list = []
        self.guards: list = []
        self.tagged: list = []   # (exception, {"stage", "graph", "during"})

    # -- patching -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def install(self):
        import torch
        import torch._dynamo
        saved = (torch.compile, torch._dynamo.optimize)
        self._optimize = saved[1]
        torch.compile, torch._dynamo.optimize = self.compile, self.optimize
        try:
            yield self
        finally:
            torch.compile, torch._dynamo.optimize = saved

    def compile(self, model=None, *, fullgraph: bool = False, dynamic=None, backend=None, mode=None,
                options=None, disable: bool = False, **_ignored):
        """torch.compile with the backend replaced (mode/options belong to the replaced backend)."""
        if model is None:
            return lambda m: self.compile(m, fullgraph=fullgraph, dynamic=dynamic, disable=disable)
        self.compile_calls += 1
        if self.backend_fn is None or disable:
            return model
        return self._optimize(self.dynamo_backend, nopython=fullgraph or self.fullgraph, dynamic=dynamic,
                              guard_fail_fn=self._guard_fail, guard_export_fn=self._guard_export)(model)

    def optimize(self, backend=None, *args, nopython: bool = False, **kwargs):
        self.compile_calls += 1
        if self.backend_fn is None:
            return self._optimize(backend or "eager", disable=True)
        kwargs.setdefault("guard_fail_fn", self._guard_fail)
        kwargs.setdefault("guard_export_fn", self._guard_export)
        return self._optimize(self.dynamo_backend, nopython=nopython or self.fullgraph, **kwargs)

    # -- the Dynamo backend ---------------------------------------------------------------------
    def dynamo_backend(self, gm, example_inputs):
        frame = _current_frame_name()
        if self.function and not _frame_matches(frame, self.function):
            # Skipping the frame (not running its graph eagerly) lets Dynamo see the functions it
            # calls as frames of their own, so `--function inner` works when inner is inlined.
            from torch._dynamo.exc import SkipFrame
            raise SkipFrame(f"tdbg --function {self.function}: frame {frame} not selected")
        index = len(self.graphs)
        info = {"index": index, "frame": frame, "ops": [op_name(n) for n in gm.graph.nodes
                                                        if n.op.startswith("call_")],
                "lines": graph_lines(gm)}
        info.update(self._reason(gm))
        self.graphs.append(info)
        first = (info["lines"] or info["stack"] or [None])[0]
        self.event("compile_start", graph=index, frame=frame,
                   source=f"{first['file']}:{first['line']}  {first['code']}" if first else None)
        try:
            compiled = self.backend_fn(gm, example_inputs)
        except BaseException as e:
            self.tag(e, compile_stage(e, self.backend_kind), index, "compile")
            raise
        self.event("compiled", graph=index)
        return self._wrap_call(compiled, gm, info)

    def _wrap_call(self, compiled, gm, info):
        state = {"first": True}

        def run(*args):
            try:
                if state["first"]:
                    state["first"] = False
                    self.event("first_call", graph=info["index"])
                    if self.check_accuracy:
                        return self._checked_call(compiled, gm, info, args)
                return call_compiled(compiled, args)
            except BaseException as e:
                self.tag(e, runtime_stage(e), info["index"], "run")
                raise
        return run

    def _checked_call(self, compiled, gm, info, args):
        import torch
        from tdbg.minifier.diagnose.accuracy import compare, fp64_reference
        rng = torch.get_rng_state()
        with torch.no_grad():
            expected = gm(*_clone(args))
        torch.set_rng_state(rng)
        reference = fp64_reference(gm, _clone(args))
        torch.set_rng_state(rng)
        actual = call_compiled(compiled, args)
        mismatches = compare(expected, _detach(actual), reference)
        info["checked"] = True
        if mismatches:
            raise AccuracyError(info["index"], mismatches)
        return actual

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
        self.guards.append({"frame": frame, **_guard_summary(guards)})

    # -- bookkeeping ----------------------------------------------------------------------------
    def tag(self, exc: BaseException, stage: str, graph: int, during: str) -> None:
        if not any(e is exc for e, _ in self.tagged):
            self.tagged.append((exc, {"stage": stage, "graph": graph, "during": during}))

    def tag_of(self, exc: BaseException) -> Optional[dict]:
        for e, info in self.tagged:
            if e is exc:
                return info
        return None

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


def compile_stage(exc: BaseException, backend_kind: str) -> str:
    """The stage a backend compile failure belongs to."""
    typed = typed_error(exc)
    if typed is not None:
        return typed.stage
    if backend_kind not in ("aot_eager", "inductor"):
        return "backend"
    frames = traceback.extract_tb(exc.__traceback__)
    if any(f.name == "compile_aten" for f in frames):
        return "backend"
    if any(f"torch{os.sep}_functorch" in f.filename or f"torch{os.sep}_decomp" in f.filename for f in frames):
        return "aot_autograd"
    return "backend"


def runtime_stage(exc: BaseException) -> str:
    typed = typed_error(exc)
    return typed.stage if typed is not None else "backend"
