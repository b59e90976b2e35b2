"""Dump repro files while a program runs: `wrap_backend` (what `tdbg run --repro-after/--repro-level`
and `tdbg minify SCRIPT` install).

Levels, as PyTorch users know them:
  1  write repro.py when a graph fails to compile or run
  2  also write minifier_launcher.py (the file `tdbg minify` takes)
  3  also, before compiling each graph, write graph_<k>/minifier_launcher.py (random inputs shaped
     like the real ones after AOT, where only fake tensors exist; rewritten with the real inputs
     on the first call): what survives a segfault
  4  check each compiled graph's first call against eager (float64 reference, per-dtype
     tolerances); on a mismatch write both files and raise AccuracyError

The original failure is always re-raised after dumping, with `tdbg_repro_dir` set on it (or
`tdbg_repro_error` if the dump itself failed). Dumping happens in the failing process; nothing
is printed.
"""
from __future__ import annotations

import itertools
import os
from typing import Optional

from tdbg.compiler.errors import TdbgError
from tdbg.minifier.artifacts.repro import LAUNCHER, REPRO, Dump, write

LEVELS = {1: (REPRO,), 2: (REPRO, LAUNCHER), 3: (REPRO, LAUNCHER), 4: (REPRO, LAUNCHER)}


class AccuracyError(TdbgError):
    """A compiled graph's results differ from eager (level 4)."""
    stage = "accuracy"

    def __init__(self, graph: str, mismatches: list):
        self.graph, self.mismatches = graph, list(mismatches)
        lines = "\n".join(f"  {m.output}: {m.message}" for m in self.mismatches)
        super().__init__(f"compiled graph {graph} differs from eager:\n{lines}")

    def evidence(self) -> dict:
        return {"stage": self.stage, "message": str(self), "graph": self.graph,
                "mismatches": [m.to_dict() for m in self.mismatches]}


def wrap_backend(backend, *, after: str, level: int, out_dir: str, config):
    """A Dynamo backend that behaves like `backend` and dumps repro files per `level` into out_dir.

    `backend` is a resolved `backends.Backend` (its name says how a repro file finds it again)
    or a plain backend callable. after="dynamo" wraps `backend` itself (any backend);
    after="aot" hooks the backend's own per-graph compiler after AOTAutograd (aot_capture: tdbg's
    compiler, torch:inductor, aot_autograd(...) backends), so the aten graphs that backend
    compiles are checked and dumped; any other backend raises `aot_capture.NoAotStage`.
    """
    if after not in ("dynamo", "aot") or level not in LEVELS:
        raise ValueError(f"repro after must be dynamo|aot and level 1..4, got {after!r}, {level!r}")
    from tdbg.minifier.artifacts.repro import new_run_dir
    _quiet_torch_dumper()
    dumper = _Dumper(after, level, out_dir or new_run_dir(), config, backend)
    if after == "dynamo":
        return dumper.dynamo_backend
    from tdbg.minifier.runs.aot_capture import capture
    dumper.family, aot = capture(backend, dumper.inner_compile, config)

    def backend_after_aot(gm, example_inputs):
        dumper.real_inputs = list(example_inputs)  # Dynamo's inputs are real; AOT's are fake
        return aot(gm, example_inputs)
    return backend_after_aot


def _quiet_torch_dumper() -> None:
    """tdbg's dumper has taken over TORCHDYNAMO_REPRO_AFTER/LEVEL: PyTorch's own must not also
    dump (or raise its own AccuracyError) inside the same compile."""
    from tdbg.compiler.torch_compat import dynamo_config
    dynamo_config.repro_after = None


class _Dumper:
    def __init__(self, after, level, out_dir, config, backend):
        self.after, self.level, self.out_dir, self.config = after, level, out_dir, config
        self.backend = backend
        self.family: Optional[str] = None        # after aot: aot_capture's family of the backend
        self.graphs: dict = {}                    # id(snapshot) -> forward|backward|inference
        self.static_inputs: dict = {}             # id(snapshot) -> its parameters' and buffers' names
        self.counter = itertools.count()
        self.real_inputs: list = []

    # ------------------------------------------------------------ the two hooks
    def dynamo_backend(self, gm, example_inputs):
        k = next(self.counter)
        snap = _snapshot(gm)
        if self.level == 3:
            self._dump(snap, example_inputs, (LAUNCHER,), None, f"graph_{k}")
        fn = getattr(self.backend, "compiler_fn", self.backend)
        try:
            compiled = fn(gm, example_inputs)
        except Exception as e:
            raise self._failed(e, "compile_error", snap, example_inputs)
        return _Checked(compiled, snap, self, f"graph_{k}")

    def inner_compile(self, gm, example_inputs, graph: str, compile_one):
        """aot_capture's hook: dump/check one aten graph the backend's own compiler compiles."""
        k = next(self.counter)
        snap = _snapshot(gm)
        self.graphs[id(snap)] = graph
        from tdbg.compiler import static_input_names
        self.static_inputs[id(snap)] = static_input_names(gm)
        known = _match_real(example_inputs, self.real_inputs) if graph != "backward" else example_inputs
        if self.level == 3:
            self._dump(snap, known, (LAUNCHER,), None, f"graph_{k}")
        try:
            compiled = compile_one(gm, example_inputs)
        except Exception as e:
            raise self._failed(e, "compile_error", snap, known)
        return _Checked(compiled, snap, self, f"graph_{k}")

    # ------------------------------------------------------------ dumping
    def spec(self, snap=None) -> dict:
        from tdbg.minifier.reduce.oracle import backend_spec, config_fields
        import torch
        grad = torch.is_grad_enabled()   # the program's, at the call (or the compile it made)
        spec = {"after": self.after, "config": config_fields(self.config),
                "check_accuracy": self.level == 4, "tolerance": None, "ignore_non_fp": False,
                # level 4 checks gradients too when the dynamo graph builds an autograd graph
                "check_grads": self.level == 4 and self.after == "dynamo" and grad,
                "backend": backend_spec(self.backend, getattr(self.backend, "name", None))}
        if self.after == "dynamo":
            spec["grad_enabled"] = grad   # under no_grad AOTAutograd makes an inference graph
        if getattr(self, "call", 1) > 1:
            spec["call"] = self.call      # the graph's call that failed: the ones before it run first
        if self.after == "aot":
            spec["aot"] = {"family": self.family, "graph": self.graphs.get(id(snap), "forward")}
            if self.family == "tdbg" and spec["aot"]["graph"] == "inference" and self.static_inputs.get(id(snap)):
                spec["aot"]["static_inputs"] = self.static_inputs[id(snap)]   # what tdbg's compiler hoists
        return spec

    def _dump(self, snap, inputs, files, outcome, subdir: Optional[str] = None) -> str:
        from tdbg.compiler.torch_compat import unset_fake_temporarily
        with unset_fake_temporarily():  # AOT compiles under a fake mode; the dump is real
            return self._write(snap, inputs, files, outcome, subdir)

    def _write(self, snap, inputs, files, outcome, subdir) -> str:
        from tdbg.minifier.artifacts.graph_io import TensorStore, from_graph_module
        from tdbg.minifier.reduce.oracle import Signature
        store = TensorStore()
        case = from_graph_module(snap, _grad_flags(snap, _realize(inputs)), store)
        expected = Signature.of(outcome).to_dict() if outcome is not None else None
        where = "before compiling" if outcome is None else outcome.summary()
        spec = self.spec(snap)
        graph = f" ({spec['aot']['graph']} graph for {spec['aot']['family']})" if "aot" in spec else ""
        dump = Dump(case, store, spec, expected,
                    title=f"graph captured after {self.after}{graph}, {case.num_nodes} nodes", failure=where)
        directory = os.path.join(self.out_dir, subdir) if subdir else self.out_dir
        write(directory, dump, files)
        return directory

    def _failed(self, e: BaseException, kind: str, snap, inputs) -> BaseException:
        """Dump for a failure (never masking it) and hand back the exception to re-raise."""
        from tdbg.minifier.reduce.oracle import exception_outcome
        outcome = e.tdbg_outcome if hasattr(e, "tdbg_outcome") else exception_outcome(kind, e)
        try:
            path = self._dump(snap, inputs, LEVELS[self.level], outcome)
            _attach(e, "tdbg_repro_dir", os.path.abspath(path))
        except Exception as dump_error:  # the user's failure matters more than the dump's
            _attach(e, "tdbg_repro_error", f"{type(dump_error).__name__}: {dump_error}")
        return e


def _attach(e: BaseException, name: str, value) -> None:
    try:
        setattr(e, name, value)
    except (AttributeError, TypeError):
        pass


def _snapshot(gm):
    """A copy of the graph as given (compilers may rewrite theirs): checks.snapshot."""
    from tdbg.minifier.diagnose.checks import snapshot
    return snapshot(gm)


def _match_real(fakes, reals) -> list:
    """The real tensors Dynamo saw, when the aten graph takes exactly those (same count, shapes,
    dtypes, in order: no lifted state); else the fake ones (dumped as random values)."""
    same = len(fakes) == len(reals) and all(
        _hints(getattr(f, "shape", None)) == _hints(getattr(r, "shape", None))
        and getattr(f, "dtype", None) == getattr(r, "dtype", None) for f, r in zip(fakes, reals))
    return list(reals) if same else list(fakes)


def _hint(size):
    """A size's value without a guard: a SymInt's hint (int() or == on a SymInt would add a guard
    to the ShapeEnv of the graph being compiled and specialize it to this size)."""
    import torch
    return size.node.hint if isinstance(size, torch.SymInt) else size


def _hints(sizes):
    return None if sizes is None else tuple(_hint(s) for s in sizes)


def _grad_flags(snap, inputs) -> list:
    """The inputs with requires_grad as the graph saw them (Dynamo's placeholders record it):
    copies made for checking lose the flag, and the repro's gradient check needs it."""
    import torch
    metas = [n.meta.get("example_value", n.meta.get("val")) for n in snap.graph.nodes if n.op == "placeholder"]
    out = []
    for x, meta in zip(inputs, metas + [None] * (len(inputs) - len(metas))):
        wants = isinstance(meta, torch.Tensor) and meta.requires_grad
        if wants and isinstance(x, torch.Tensor) and x.is_floating_point() and not x.requires_grad:
            x = x.detach().requires_grad_(True)
        out.append(x)
    return out


def _realize(inputs) -> list:
    """Real tensors for the inputs: fake tensors (AOT compile time) become random ones of the
    same shape, stride and dtype; symbolic sizes become their hints."""
    import torch
    from tdbg.compiler.torch_compat import FakeTensor
    out = []
    for x in inputs:
        if isinstance(x, FakeTensor):
            real = torch.empty_strided(_hints(x.shape), _hints(x.stride()), dtype=x.dtype)
            out.append(_fill(real))
        elif isinstance(x, torch.SymInt):
            out.append(_hint(x))
        else:
            out.append(x)
    return out


def _fill(t):
    import torch
    if t.is_floating_point() or t.is_complex():
        return t.copy_(torch.randn(t.shape, dtype=t.dtype))
    if t.dtype == torch.bool:
        return t.copy_(torch.randint(0, 2, t.shape).bool())
    return t.copy_(torch.randint(0, 8, t.shape, dtype=t.dtype))


class _Checked:
    """The compiled callable, plus the call-time duties of levels 3 and 4 and runtime dumps.

    Level 3 rewrites the graph's launcher with the real inputs of its first call. Level 4 checks
    the calls a `checks.CallPolicy` picks (`dumper.check_calls` when the dumper has it, else the
    default: the first few calls and every new input signature), against `snap`, the graph as it
    was before the backend saw it: outputs always, and gradients when the call builds an autograd
    graph (after dynamo). A mismatch dumps and raises an AccuracyError naming the call and part."""

    def __init__(self, compiled, snap, dumper: _Dumper, tag: str):
        from tdbg.minifier.diagnose.checks import CallCounter, CallPolicy
        self._compiled, self._snap, self._dumper, self._tag = compiled, snap, dumper, tag
        self._counter = CallCounter(CallPolicy.every(getattr(dumper, "check_calls", None)))

    def __getattr__(self, name):
        # Plain attributes only (`_boxed_call`...): forwarding `__self__`/`__name__` of a lazy
        # GraphModule's forward makes Dynamo swap in that forward and drop this wrapper.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._compiled, name)

    def __call__(self, *args):
        from tdbg.minifier.diagnose.checks import check_call
        # AOT calls a compiled graph that has `_boxed_call` with one list of inputs
        boxed = len(args) == 1 and isinstance(args[0], list) and getattr(self._compiled, "_boxed_call", False)
        flat = list(args[0]) if boxed else list(args)
        call, check = self._counter.next_call(flat)
        d = self._dumper
        d.call = call   # a failure's dump replays the calls before it (a backend that changes between calls)
        if call == 1 and d.level == 3:
            d._dump(self._snap, flat, (LAUNCHER,), None, self._tag)
        if not (check and d.level == 4):
            try:
                return self._compiled(*args)
            except Exception as e:
                raise d._failed(e, "runtime_error", self._snap, flat)
        inputs = _clones(flat)   # what the graph was given (it may mutate its inputs)
        try:
            result = check_call(self._compiled, self._snap, flat,
                                call=(lambda fn, a: fn(list(a))) if boxed else (lambda fn, a: fn(*a)))
        except Exception as e:
            raise d._failed(e, "runtime_error", self._snap, inputs)
        for part, found in (("backward" if _is_backward(self._snap) else "forward", result.forward),
                            ("backward", result.backward)):
            if found:
                raise d._failed(_mismatch(self._snap, self._tag, call, part, found), "accuracy", self._snap, inputs)
        return result.actual


class _CallMismatch(AccuracyError):
    """AccuracyError that also names the call, the part (forward/backward) and where each
    mismatch comes from (`checks.places`)."""

    def __init__(self, tag: str, call: int, part: str, mismatches: list, places: dict):
        super().__init__(f"{tag} ({part}), call {call},", mismatches)
        self.tag, self.call, self.part = tag, call, part
        self.places = {m.output: places.get(m.output) or {} for m in self.mismatches}

    def evidence(self) -> dict:
        nodes = list(dict.fromkeys(p["fx_node"] for p in self.places.values() if p.get("fx_node")))
        source = next((p["source"] for p in self.places.values() if p.get("source")), None)
        return dict(super().evidence(), graph=self.tag, call=self.call, part=self.part, places=self.places,
                    source=source, fx_node=", ".join(nodes) or None)


def _mismatch(snap, tag: str, call: int, part: str, found: list) -> "_CallMismatch":
    from tdbg.minifier.diagnose.checks import places
    from tdbg.minifier.reduce.oracle import Outcome
    from tdbg.minifier.runs.instrument import is_user_file
    error = _CallMismatch(tag, call, part, found, places(snap, is_user_file))
    error.tdbg_outcome = Outcome("accuracy", outputs=tuple(m.output for m in found))
    return error


def _is_backward(snap) -> bool:
    """An AOT backward graph: its inputs include the tangents (gradients of the outputs)."""
    return any(n.op == "placeholder" and n.name.startswith("tangents") for n in snap.graph.nodes)


def _clones(args) -> list:
    import torch
    return [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
