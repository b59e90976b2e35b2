"""`tdbg memory`: compiled vs eager memory per graph and call, measured with the CPU allocator's
own events.

How it measures (nothing is estimated): `track(fn)` runs `fn` under `torch.profiler` with
`profile_memory=True`, which makes PyTorch's CPU allocator report every allocation and free
(size, pointer, time). The live-bytes curve of a call is the running sum of the allocations made
during the call minus the frees of those same allocations; its maximum is the call's peak (bytes
above what was live before the call), its last value what the call left alive (outputs, and
whatever else stays: activations saved for backward, an output pool's storage, caches). Memory
that existed before the call and is freed during it (a backward releasing the activations it was
given) is not subtracted, for eager and compiled alike, so the two are measured the same way.
Allocations outside PyTorch's CPU allocator (a library's own malloc, OpenMP worker threads'
private buffers) are not seen.

What is compared, per graph Dynamo hands the backend (`MemoryRecorder`, installed through
`instrument.Session` as `tdbg run` and `tdbg profile` install theirs):

  forward   the Dynamo graph's call (kind "forward"; "inference" when grad is off): the backend's
            compiled callable vs an untouched copy of the graph run by PyTorch eager on clones of
            the same inputs, in the same grad mode (so eager autograd saves what it saves)
  backward  for backends with an AOT stage (aot_capture.WITH_TORCH_AOT_EAGER: tdbg, torch:inductor,
            aot_autograd backends, torch:aot_eager) the compiled backward aten graph vs the same aten graph run
            eagerly op by op on clones of its inputs; other backends compile no backward graph

The first `calls` calls of each graph are measured (each measurement starts and stops the
profiler, ~30 ms). The result is a `MemoryReport` (`to_dict()` is the `--json` payload).
Nothing here prints.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

METHOD = ("measured: torch.profiler(profile_memory=True) allocation events of PyTorch's CPU allocator; peak and "
          "left-alive bytes count allocations made during the call (frees of older memory are not subtracted)")
CURVE_POINTS = 100          # the live-bytes curve is kept at this many evenly spaced instants of the call
RATIO_FLOOR_BYTES = 4096    # --max-memory-ratio leaves out calls whose compiled peak is below this
DEFAULT_CALLS = 3


# ---------------------------------------------------------------- measuring one call

@dataclass
class Trace:
    """The allocator's view of one call: `events` are (ns since the call began, byte delta, ptr)
    for allocations made during the call and frees of those allocations, in time order."""
    events: list
    duration_ns: int
    ops: list = field(default_factory=list)   # per event: the outermost aten op it happened under

    def curve(self) -> list:
        """Live bytes after each event (starting from 0 = what was live before the call)."""
        live, out = 0, []
        for _, delta, _ in self.events:
            live += delta
            out.append(live)
        return out

    @property
    def peak(self) -> int:
        return max([0, *self.curve()])

    @property
    def end(self) -> int:
        return sum(delta for _, delta, _ in self.events)

    def live_at_end(self) -> dict:
        """ptr -> bytes of the allocations made during the call and still alive at its end."""
        live: dict = {}
        for _, delta, ptr in self.events:
            if delta > 0:
                live[ptr] = delta
            else:
                live.pop(ptr, None)
        return live

    def sampled(self, points: int = CURVE_POINTS) -> list:
        """Live bytes at `points` evenly spaced instants from the call's start to its end (a step
        curve; the peak instant is always kept, so the drawn maximum is the measured peak)."""
        if not self.events:
            return [0] * points
        span = max(self.duration_ns, self.events[-1][0], 1)
        curve, out, i, live, peak = self.curve(), [], 0, 0, self.peak
        for k in range(points):
            t = span * k / (points - 1)
            best = live
            while i < len(self.events) and self.events[i][0] <= t:
                live = curve[i]
                best = max(best, live)
                i += 1
            out.append(max(best, live) if k else live)
        if peak not in out:   # a peak between two instants: put it at the nearest one
            at = next(k for k, e in enumerate(self.events) if curve[k] == peak)
            out[min(points - 1, round(self.events[at][0] / span * (points - 1)))] = peak
        return out


class Busy(RuntimeError):
    """The profiler is already on (the script profiles itself, or a measurement is running)."""


_active = [False]


def track(fn: Callable, names: Optional[dict] = None) -> tuple:
    """(fn(), Trace) — `fn` run with the CPU allocator's events recorded (see the module docstring).
    With `names` (a dict), memory_buffers.LocalNames fills it while `fn` runs: storage ptr ->
    (local name, file) in generated graph code. Raises Busy when the profiler is already on;
    `fn`'s own exception passes through."""
    from tdbg.minifier.diagnose.memory_buffers import LocalNames
    import time

    from torch.autograd import profiler as autograd_profiler
    from torch.profiler import ProfilerActivity, profile
    if _active[0] or autograd_profiler._is_profiler_enabled:
        raise Busy("torch.profiler is already running")
    _active[0] = True
    try:
        from tdbg.minifier.runs.instrument import _stderr_silenced
        with _stderr_silenced():   # Kineto logs start/stop (and unknown-free warnings) on fd 2
            prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            prof.start()
            try:
                begin = time.perf_counter_ns()
                if names is None:
                    result = fn()
                else:
                    with LocalNames() as local:
                        result = fn()
                    names.update(local.first)
                duration = time.perf_counter_ns() - begin
            finally:
                prof.stop()
    finally:
        _active[0] = False
    events, ops = _allocations(prof)
    return result, Trace(events, duration, ops)


def _allocations(prof) -> tuple:
    """([(ns from the first event, delta, ptr)] of allocations and of frees of those, in time
    order; ptr -> the outermost aten op each allocation happened under)."""
    raw = []

    def walk(node, op):
        extra = node.extra_fields
        if op is None and "::" in node.name:   # aten::mm, mkl::_mkl_reorder_linear_weight, ...
            op = node.name
        if type(extra).__name__ == "_ExtraFields_Allocation" and extra.alloc_size:
            raw.append((node.start_time_ns, len(raw), extra.alloc_size, extra.ptr, op))
        for child in node.children:
            walk(child, op)
    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, None)
    raw.sort()
    seen: set = set()
    events, ops = [], []
    for t, _, delta, ptr, op in raw:
        if delta > 0:
            seen.add(ptr)
        elif ptr not in seen:   # memory allocated before the call: not this call's
            continue
        else:
            seen.discard(ptr)
        events.append((t, delta, ptr))
        ops.append(op)
    t0 = events[0][0] if events else 0
    return [(t - t0, d, p) for t, d, p in events], ops


# ---------------------------------------------------------------- records

@dataclass
class CallMemory:
    """One measured call of one graph: eager and compiled peak and left-alive bytes (above what
    was live before the call), the compiled outputs' own bytes, and both curves."""
    graph: int                      # the Dynamo graph's number (as tdbg run/explain count them)
    kind: str                       # forward | inference | backward
    call: int                       # 1-based call number of this graph (this kind)
    eager_peak_bytes: Optional[int]
    compiled_peak_bytes: int
    eager_end_bytes: Optional[int]
    compiled_end_bytes: int
    eager_output_bytes: Optional[int]
    compiled_output_bytes: int
    eager_curve: list = field(default_factory=list)
    compiled_curve: list = field(default_factory=list)
    eager_error: Optional[str] = None   # why eager could not be measured on this call
    # compiled outputs on storage allocated before the call that is no input's: an output pool
    # (tdbg, Inductor) keeping memory between calls, which this call's peak does not show
    compiled_reused_bytes: int = 0
    # forward only: bytes of the distinct storages autograd saved for backward during the call
    # (its saved-tensor pack hook), inputs' own storage left out (it is alive anyway)
    eager_saved_bytes: Optional[int] = None
    compiled_saved_bytes: Optional[int] = None
    # the largest buffers alive at each side's peak (memory_buffers.peak_buffers rows)
    eager_peak_buffers: list = field(default_factory=list)
    compiled_peak_buffers: list = field(default_factory=list)

    @property
    def ratio(self) -> Optional[float]:
        if self.eager_peak_bytes is None:
            return None
        return self.compiled_peak_bytes / self.eager_peak_bytes if self.eager_peak_bytes else None

    @property
    def eager_kept_bytes(self) -> Optional[int]:
        """Left alive by the call besides its outputs (saved for backward, caches, pools)."""
        if self.eager_end_bytes is None:
            return None
        return self.eager_end_bytes - self.eager_output_bytes

    @property
    def compiled_kept_bytes(self) -> int:
        return self.compiled_end_bytes - self.compiled_output_bytes

    @property
    def eager_held_bytes(self) -> Optional[int]:
        """Left alive besides outputs and tensors saved for backward: a pool's or cache's storage."""
        if self.eager_kept_bytes is None:
            return None
        return max(0, self.eager_kept_bytes - (self.eager_saved_bytes or 0))

    @property
    def compiled_held_bytes(self) -> int:
        return max(0, self.compiled_kept_bytes - (self.compiled_saved_bytes or 0))

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), ratio=self.ratio, eager_kept_bytes=self.eager_kept_bytes,
                    compiled_kept_bytes=self.compiled_kept_bytes, eager_held_bytes=self.eager_held_bytes,
                    compiled_held_bytes=self.compiled_held_bytes)


@dataclass
class GraphMemory:
    """One Dynamo graph: where it comes from and its measured calls."""
    graph: int
    frame: str
    source: Optional[str]           # its first user line, "file:line  code"
    has_backward_graph: bool = False
    # AOT kind -> (its aten graph's untouched copy, what the backend compiled it to, the kernels'
    # FX nodes when the backend does not carry them: Inductor's): names the compiled code's
    # buffers (memory_buffers.Namer)
    aot: dict = field(default_factory=dict, repr=False)
    calls: list = field(default_factory=list)     # CallMemory
    skipped: list = field(default_factory=list)   # {"kind", "call", "reason"}


@dataclass
class MemoryReport:
    script: str
    backend: str
    method: str
    calls_measured: int
    graphs: list                    # GraphMemory
    notes: list = field(default_factory=list)

    def all_calls(self) -> list:
        return [c for g in self.graphs for c in g.calls]

    def first_calls(self) -> list:
        """The first measured call of each graph and kind: the whole footprint (later calls may
        reuse storage a pool kept)."""
        firsts: dict = {}
        for c in self.all_calls():
            firsts.setdefault((c.graph, c.kind), c)
        return list(firsts.values())

    def differences(self, limit: int = 5) -> list:
        """The largest compiled-minus-eager differences of the first calls (peak, saved for
        backward, held after the call), largest first."""
        rows = []
        for c in self.first_calls():
            if c.eager_peak_bytes is None:
                continue
            rows.append({"graph": c.graph, "kind": c.kind, "call": c.call, "what": "peak",
                         "bytes": c.compiled_peak_bytes - c.eager_peak_bytes})
            if c.eager_kept_bytes is not None:
                rows.append({"graph": c.graph, "kind": c.kind, "call": c.call, "what": "held_after_call",
                             "bytes": c.compiled_held_bytes - c.eager_held_bytes})
            if c.kind == "forward" and c.eager_saved_bytes is not None:
                rows.append({"graph": c.graph, "kind": c.kind, "call": c.call, "what": "saved_for_backward",
                             "bytes": c.compiled_saved_bytes - c.eager_saved_bytes})
        rows = [r for r in rows if r["bytes"]]
        return sorted(rows, key=lambda r: -abs(r["bytes"]))[:limit]

    def over_ratio(self, ratio: float) -> list:
        """Calls whose compiled peak exceeds `ratio` times eager's (compiled peak >= RATIO_FLOOR_BYTES)."""
        return [c for c in self.all_calls() if c.eager_peak_bytes is not None
                and c.compiled_peak_bytes >= RATIO_FLOOR_BYTES and c.compiled_peak_bytes > ratio * c.eager_peak_bytes]

    def to_dict(self) -> dict:
        return {"script": self.script, "backend": self.backend, "method": self.method,
                "calls_measured": self.calls_measured,
                "graphs": [{"graph": g.graph, "frame": g.frame, "source": g.source,
                            "has_backward_graph": g.has_backward_graph, "calls": [c.to_dict() for c in g.calls],
                            "skipped": g.skipped} for g in self.graphs],
                "differences": self.differences(), "notes": self.notes}


# ---------------------------------------------------------------- recording inside the script's run

@contextlib.contextmanager
def saved_storages(args, into: dict):
    """Within the block, every tensor autograd saves for backward lands in `into` (storage ptr ->
    bytes), except storage of `args` (inputs and parameters are alive whether saved or not)."""
    import torch
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in inputs:
            into[storage.data_ptr()] = storage.nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def _grad_clones(args) -> list:
    """Clones that keep requires_grad, so eager autograd saves what it would for the originals."""
    import torch
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]


def reused_bytes(value, live: dict, args) -> int:
    """Bytes of `value`'s storages neither allocated during the call (`live`) nor an input's."""
    import torch

    from tdbg.compiler.torch_compat import pytree
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in pytree.tree_leaves(value)
                if isinstance(t, torch.Tensor)}
    return sum(n for p, n in storages.items() if p not in live and p not in inputs)


def output_bytes(value, live: dict) -> int:
    """Bytes of the distinct storages of `value`'s tensors that were allocated during the call."""
    import torch

    from tdbg.compiler.torch_compat import pytree
    ptrs = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)}
    return sum(live.get(p, 0) for p in ptrs)


class MemoryRecorder:
    """Makes the Dynamo backend `tdbg memory` runs: `backend` (a resolved backends.Backend) with
    every graph's first `calls` calls measured against eager. `session` (instrument.Session) is
    set before the script runs; its graph list numbers the graphs."""

    def __init__(self, calls: int = DEFAULT_CALLS, config=None):
        self.calls, self.config = calls, config
        self.session = None
        self.graphs: list = []      # GraphMemory, in Dynamo's order

    def backend_for(self, backend) -> Callable:
        """The Dynamo backend: `backend` with every graph (and its AOT backward) measured."""
        from tdbg.minifier.runs import aot_capture, inductor_hooks
        families = aot_capture.WITH_TORCH_AOT_EAGER
        family = aot_capture.family_of(backend, families)
        if family == "torch:inductor":   # its kernels' FX nodes name the buffers at the peak
            inductor_hooks.record_kernel_origins()

        def compile_graph(gm, example_inputs):
            from tdbg.minifier.diagnose.checks import snapshot
            record = self._new_graph()
            snap = snapshot(gm)
            if family is None:
                compiled = backend.compiler_fn(gm, example_inputs)
            else:
                record.has_backward_graph = True
                hook = functools.partial(self._aot_hook, record, family)
                compiled = aot_capture.capture(backend, hook, self.config, families)[1](gm, example_inputs)
            return self._measured(compiled, snap, record, None)
        return compile_graph

    def _new_graph(self) -> GraphMemory:
        info = self.session.graphs[-1] if self.session is not None and self.session.graphs else {}
        line = (info.get("lines") or [None])[0]
        record = GraphMemory(info.get("index", len(self.graphs)), info.get("frame", "<unknown>"),
                             f"{line['file']}:{line['line']}  {line['code']}" if line else None)
        self.graphs.append(record)
        return record

    def _aot_hook(self, record: GraphMemory, family: str, gm, example_inputs, kind: str, compile_one):
        from tdbg.minifier.diagnose.checks import snapshot
        from tdbg.minifier.runs import inductor_hooks
        snap = snapshot(gm)
        kernels = None
        if family == "torch:inductor":
            # A hit in Inductor's FX graph cache generates no kernel, so no origins would be
            # recorded: compile afresh (the same code; only the compile takes longer)
            with inductor_hooks.inductor_config.patch(fx_graph_cache=False):
                compiled = compile_one(gm, example_inputs)
            kernels = inductor_hooks.kernel_origins(gm.graph)
        else:
            compiled = compile_one(gm, example_inputs)
        record.aot[kind] = (snap, getattr(compiled, "tdbg_compiled", compiled), kernels)
        if kind != "backward":   # forward and inference are measured whole, at the Dynamo graph
            return compiled
        return self._measured(compiled, snap, record, "backward")

    def _measured(self, compiled, snap, record: GraphMemory, kind: Optional[str]):
        counts: dict = {}

        def run(*args):
            import torch
            which = kind or ("forward" if torch.is_grad_enabled() and any(
                isinstance(a, torch.Tensor) and a.requires_grad for a in args) else "inference")
            counts[which] = counts.get(which, 0) + 1
            if counts[which] > self.calls:
                return compiled(*args)
            return self._measure_call(compiled, snap, record, which, counts[which], args)
        return run

    def _measure_call(self, compiled, snap, record: GraphMemory, kind: str, call: int, args):
        import torch

        from tdbg.minifier.diagnose.memory_buffers import Namer, peak_buffers
        eager, eager_error = None, None
        eager_names: dict = {}
        compiled_names: dict = {}
        eager_saved: dict = {}
        compiled_saved: dict = {}
        from tdbg.minifier.diagnose.kept_state import KeptState
        rng = torch.get_rng_state()
        state = KeptState(snap)   # what eager's run changes through get_attr is put back before the call
        try:
            clones = _grad_clones(args) if kind == "forward" else [
                a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
            with torch.set_grad_enabled(kind == "forward"), saved_storages(clones, eager_saved), state.from_saved():
                result, trace = track(lambda: snap(*clones), eager_names)
            eager = (trace, output_bytes(result, trace.live_at_end()))
            del result, clones
        except Busy as e:
            record.skipped.append({"kind": kind, "call": call, "reason": str(e)})
            return compiled(*args)
        except Exception as e:   # eager cannot run this graph: the compiled call is still measured
            eager_error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        finally:
            torch.set_rng_state(rng)
        try:
            with saved_storages(args, compiled_saved):
                actual, trace = track(lambda: compiled(*args), compiled_names)
        except Busy as e:
            record.skipped.append({"kind": kind, "call": call, "reason": str(e)})
            return compiled(*args)
        e_trace, e_out = eager if eager else (None, None)
        aten_snap, aten_compiled, kernels = record.aot.get(kind, (snap, None, None))
        record.calls.append(CallMemory(
            record.graph, kind, call,
            eager_peak_bytes=e_trace.peak if e_trace else None, compiled_peak_bytes=trace.peak,
            eager_end_bytes=e_trace.end if e_trace else None, compiled_end_bytes=trace.end,
            eager_output_bytes=e_out, compiled_output_bytes=output_bytes(actual, trace.live_at_end()),
            eager_curve=e_trace.sampled() if e_trace else [], compiled_curve=trace.sampled(),
            eager_error=eager_error,
            eager_saved_bytes=sum(eager_saved.values()) if kind == "forward" and eager else None,
            compiled_saved_bytes=sum(compiled_saved.values()) if kind == "forward" else None,
            compiled_reused_bytes=reused_bytes(actual, trace.live_at_end(), args),
            eager_peak_buffers=peak_buffers(e_trace, eager_names, Namer(snap)) if e_trace else [],
            compiled_peak_buffers=peak_buffers(trace, compiled_names, Namer(
                aten_snap, aten_compiled, kernels, also=(snap,) if aten_snap is not snap else ()))))
        return actual



# ---------------------------------------------------------------- the script's run

def memory_script(script: str, argv: list = (), *, backend: str = "own", calls: int = DEFAULT_CALLS, config=None,
                  on_step: Optional[Callable] = None) -> MemoryReport:
    """Run `script` once as `__main__` (its output shown), every graph compiled by `backend` (own:
    each torch.compile call's own) and measured by a MemoryRecorder. Raises BackendError (a
    ValueError), ValueError when the script never calls torch.compile, or profiling.ScriptFailed."""
    from tdbg.compiler import config as tdbg_config
    from tdbg.minifier.diagnose.profiling import _check_pass, _quiet_compiler_log, _ran, _resolve, run_script
    from tdbg.minifier.runs.backends import resolve
    from tdbg.minifier.runs.instrument import Session
    from tdbg.minifier.runs.own_backend import OWN
    step = on_step or (lambda text: None)
    cfg = config or tdbg_config.current()
    recorder = MemoryRecorder(calls, cfg)
    if backend == OWN:
        session = Session(None, own=recorder.backend_for, script=script, config=cfg)
    else:
        step(f"loading backend {backend}")
        resolved = _resolve(resolve, backend, cfg, script)
        session = Session(recorder.backend_for(resolved), backend_kind=resolved.kind, backend_name=backend)
    recorder.session = session
    with tdbg_config.use(cfg), _quiet_compiler_log(cfg):
        step(f"the measured run of {script} (backend {backend})")
        run = run_script(script, list(argv), "compiled", session)
    _check_pass(run, script)
    if not session.compile_records:
        raise ValueError(f"{script} never calls torch.compile, so there is nothing to measure")
    report = MemoryReport(script=script, backend=_ran(backend, session), method=METHOD, calls_measured=calls,
                          graphs=recorder.graphs)
    report.notes = _notes(report)
    return report


def _notes(report: MemoryReport) -> list:
    notes = []
    if any(not g.has_backward_graph and any(c.kind == "forward" for c in g.calls) for g in report.graphs):
        notes.append("graphs without an AOT stage (a backend that compiles the Dynamo graph its own way) have no "
                     "backward graph of their own: their backward is PyTorch eager autograd, not compared")
    for g in report.graphs:
        for kind in ("forward", "inference", "backward"):
            calls = [c for c in g.calls if c.kind == kind]
            if len(calls) > 1 and min(c.compiled_peak_bytes for c in calls[1:]) < calls[0].compiled_peak_bytes:
                notes.append(f"graph {g.graph} {kind}: later calls allocate less than call 1 "
                             f"({_mib(min(c.compiled_peak_bytes for c in calls[1:]))} vs "
                             f"{_mib(calls[0].compiled_peak_bytes)} MiB): the backend reuses storage kept from "
                             "earlier calls (a pool), memory held between calls that their peaks leave out; "
                             "call 1 shows the whole footprint")
        for s in g.skipped:
            notes.append(f"graph {g.graph} {s['kind']} call {s['call']} not measured: {s['reason']}")
        for c in g.calls:
            if c.eager_error:
                notes.append(f"graph {g.graph} {c.kind} call {c.call}: eager could not run the graph ({c.eager_error})")
    return notes


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"
