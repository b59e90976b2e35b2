"""Measuring compiled programs: `profile_script` (the timing helpers it shares with benchmarks/
and `tdbg run --save-io --profile` are diagnose/timing.py).

`profile_script` runs a user script twice in this process, as `__main__` with its own argv,
under an `instrument.Session` (the same recorder `tdbg run` uses): once with every
`torch.compile(...)` returning the original callable (eager) and once with it compiling through
the chosen backend (`backends.resolve`, as for `tdbg run`). Both passes wrap what
`torch.compile` returns in a `TimedCallable`, so every call is timed. Afterwards each compiled
callable and its original (eager) are warmed up until their times settle (timing.warm_up), then
re-run `iterations` times each with the arguments of its last call in the script, alternating
(a sample batches calls shorter than timing.SAMPLE_MIN_S), judged NOISY or not (timing.noisy_reason:
a busy machine, widely spread samples), and once more under `torch.profiler`; the result is a
`ProfileReport` (plain data, `to_dict()` is the `--json` payload): per-callable times and
speedups, what subnormal values cost (`subnormals.examine`: counted in one eager call; where
there are any, eager and compiled timed again with them flushed), per-graph backend compile
times, tdbg's per-stage compile times (its debug.log), the compiler's kernels and aten fallbacks
(its report_path lines), graph breaks and recompiles (`explain.build_report`), profiler tables
and the lost-speed flags. Nothing here prints.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import json
import os
import re
import resource
import runpy
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from tdbg.minifier.diagnose.timing import (CpuWatch, Timing, alternate, calls_per_sample, median, minor_faults,
                                           warm_up)
from tdbg.minifier.diagnose.subnormals import examine, flag_message as subnormal_flag
from tdbg.minifier.runs.names import frame_label

KERNEL_NAME = re.compile(r"cpp_fused")
# where the compiled run's self CPU time goes: (category, pattern on the profiler row name); first match wins
TIME_CATEGORIES = (
    ("generated kernels", re.compile(r"cpp_fused")),
    ("aten ops", re.compile(r"^(aten|mkl|mkldnn|onednn)::")),
    ("compiled-code wrappers", re.compile(r"Torch-Compiled Region|TorchDynamo|Pregraph bytecode|AOTDispatcher"
                                          r"|CompiledFunction|CompiledFxGraph")),
)
OTHER = "other"
OVERHEAD_FLAG_SHARE = 0.5   # flag when wrappers take at least this share of the compiled self time


# ---------------------------------------------------------------- compile records

@dataclass
class GraphCompile:
    """One graph handed to the backend: Dynamo's compile id, size, backend time, and its frame."""
    compile_id: str
    ops: int
    seconds: float
    error: Optional[str] = None
    frame: str = ""

    @property
    def recompile(self) -> bool:
        # compile ids are "<frame>/<n>"; n > 0 means the frame was compiled again
        return not self.compile_id.endswith("/0") and "/" in self.compile_id


def timed_backend(backend: Callable, log: list) -> Callable:
    """Wrap a Dynamo backend so each graph's compile time and size land in `log`."""
    from tdbg.compiler.torch_compat import CompileContext

    def compile_graph(gm, example_inputs):
        cid = str(CompileContext.current_compile_id())
        ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
        t0 = time.perf_counter()
        try:
            compiled = backend(gm, example_inputs)
        except Exception as e:
            log.append(GraphCompile(cid, ops, time.perf_counter() - t0, f"{type(e).__name__}: {e}"))
            raise
        log.append(GraphCompile(cid, ops, time.perf_counter() - t0))
        return compiled
    return compile_graph


# ---------------------------------------------------------------- script passes

class TimedCallable:
    """What the patched `torch.compile` returns: times every call of `target`.

    Attribute access goes to `target` (so `compiled_model.parameters()` still works), and it
    binds like a function when `torch.compile` decorated a method.
    """

    def __init__(self, label: str, original: Callable, target: Callable):
        self.__dict__.update(_label=label, _original=original, _target=target, calls=[], last=None)

    def __call__(self, *args, **kwargs):
        import torch
        self.__dict__["last"] = (args, kwargs, torch.is_grad_enabled())
        f0, t0 = minor_faults(), time.perf_counter()
        try:
            return self._target(*args, **kwargs)
        finally:
            self.calls.append((time.perf_counter() - t0, minor_faults() - f0))

    def __getattr__(self, name):
        return getattr(self.__dict__["_target"], name)

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)

    def replay(self, fn: Callable) -> Callable:
        """A no-argument callable running `fn` on this callable's last arguments, in its grad mode."""
        import torch
        args, kwargs, grad = self.last

        def run():
            with torch.set_grad_enabled(grad):
                return fn(*args, **kwargs)
        return run


def callable_label(model: Any) -> str:
    import torch
    if isinstance(model, torch.nn.Module):
        return type(model).__name__
    code = getattr(model, "__code__", None)
    name = getattr(model, "__qualname__", None) or type(model).__name__
    if code is None:
        return name
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


@contextlib.contextmanager
def timed_compile(session, passes: list):
    """Within `session.install()`, what `torch.compile(m)` and `torch._dynamo.optimize(...)(m)`
    return is a TimedCallable, appended to `passes`."""
    import torch

    from tdbg.compiler.torch_compat import dynamo
    with session.install():
        inner, inner_optimize = torch.compile, dynamo.optimize

        def compile(model=None, **kwargs):
            if model is None:
                return lambda m: compile(m, **kwargs)
            return _timed(passes, model, inner(model, **kwargs))

        def optimize(*args, **kwargs):
            return _TimedOptimize(inner_optimize(*args, **kwargs), passes)
        torch.compile, dynamo.optimize = compile, optimize
        try:
            yield
        finally:
            torch.compile, dynamo.optimize = inner, inner_optimize


def _timed(passes: list, model, target) -> TimedCallable:
    timed_fn = TimedCallable(callable_label(model), model, target)
    passes.append(timed_fn)
    return timed_fn


class _TimedOptimize:
    """`torch._dynamo.optimize(...)`'s result: decorating times the result; `with` passes through."""

    def __init__(self, context, passes: list):
        self.context, self.passes = context, passes

    def __call__(self, model):
        return _timed(self.passes, model, self.context(model))

    def __enter__(self):
        return self.context.__enter__()

    def __exit__(self, *exc):
        return self.context.__exit__(*exc)


@dataclass
class ScriptPass:
    """One run of the script: wall time, how it ended, the callables it compiled, the session,
    and (when captured) what the script printed."""
    mode: str
    session: Any = None
    seconds: float = 0.0
    exit_code: int = 0
    error: Optional[BaseException] = None
    callables: list = field(default_factory=list)
    output: str = ""


def run_script(path: str, argv: list, mode: str, session, capture: bool = False) -> ScriptPass:
    """Run `path` as `__main__` with `argv`, compiling through `session` (an instrument.Session).
    With `capture`, what the script writes to sys.stdout/sys.stderr is kept in `.output` instead
    of shown (profile shows one pass's output, not two)."""
    result = ScriptPass(mode, session)
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    # a real file, not a StringIO: scripts may ask sys.stdout/sys.stderr for their fileno()
    sink = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") if capture else None
    t0 = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            if capture:
                stack.enter_context(contextlib.redirect_stdout(sink))
                stack.enter_context(contextlib.redirect_stderr(sink))
            stack.enter_context(timed_compile(session, result.callables))
            runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        result.exit_code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:
        result.error = e
    finally:
        result.seconds = time.perf_counter() - t0
        sys.argv, sys.path[:] = saved_argv, saved_path
        if sink is not None:
            sink.seek(0)
            result.output = sink.read()
            sink.close()
    return result


# ---------------------------------------------------------------- report

@dataclass
class CallableProfile:
    """Timing of one compiled callable: eager vs compiled, per call (medians)."""
    label: str
    calls_in_script: int
    first_call_s: float
    eager_s: Optional[float]
    compiled_s: Optional[float]
    speedup: Optional[float]
    minor_faults_per_call: Optional[float]
    noisy: Optional[str] = None     # why eager vs compiled cannot be compared here (timing.noisy_reason)
    calls_per_sample: int = 1
    subnormals: Optional[dict] = None   # subnormals.examine: what the eager call read, what flushing saves

    @property
    def cold_compile_s(self) -> Optional[float]:
        return None if self.compiled_s is None else max(0.0, self.first_call_s - self.compiled_s)


@dataclass
class ProfileReport:
    script: str
    backend: str
    iterations: int
    eager_script_s: float
    compiled_script_s: float
    callables: list
    graphs: list                  # GraphCompile
    stages: dict                  # stage -> seconds summed over graphs (tdbg debug.log)
    fallbacks: list               # {"graph", "fx_node", "target"}
    kernels: list                 # kernel names from the compiler's report
    explain: dict                 # minifier.explain.build_report: graph breaks and recompiles per function
    profiler_rows: list           # compiled run, {"name", "calls", "self_cpu_us", "cpu_total_us", "self_cpu_pct"}
    eager_profiler_rows: list
    trace_path: Optional[str]
    debug_dir: Optional[str] = None             # the compiler's debug traces of the compiled run
    time_split: dict = field(default_factory=dict)  # TIME_CATEGORIES name -> share of compiled self CPU time
    flags: list = field(default_factory=list)   # {"kind", "message"}

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["callables"] = [dict(dataclasses.asdict(c), cold_compile_s=c.cold_compile_s) for c in self.callables]
        d["graphs"] = [dict(dataclasses.asdict(g), recompile=g.recompile) for g in self.graphs]
        d["profiled_kernels"] = [r for r in self.profiler_rows if KERNEL_NAME.search(r["name"])]
        return d


class ScriptFailed(Exception):
    """A pass of the script failed. `info` is runner.describe's dict (stage, message, source, ...);
    `exit_code` is the script's own code when it exited non-zero without raising."""

    def __init__(self, run: ScriptPass, script: str):
        from tdbg.minifier.runs.runner import describe
        self.mode, self.exit_code, self.output = run.mode, run.exit_code, run.output
        self.info = describe(run.error, run.session, script) if run.error is not None else None
        what = self.info["message"] if self.info else f"the script exited with code {run.exit_code}"
        super().__init__(f"{what} (in the {run.mode} run)")


def profile_script(script: str, argv: list = (), *, backend: str = "inductor", iterations: int = 20,
                   trace_path: Optional[str] = None, config=None, profile_iterations: int = 5,
                   debug_dir: Optional[str] = None, on_step: Optional[Callable] = None) -> ProfileReport:
    """Profile `script` eager vs compiled through `backend`; see the module docstring.

    The script's output is shown once: the compiled pass prints as usual, the eager pass's output
    is kept (ScriptFailed.output when that pass fails). The compiler's debug traces (needed for
    its stage times) go to a temporary folder removed before returning, or, with `debug_dir`, to
    a new run folder under it that stays (`report.debug_dir`); its `compiler` log channel stays
    quiet unless the config enables it. `on_step(text)` is called as each phase starts.

    Raises BackendError (a ValueError), ValueError when the script never calls torch.compile,
    or ScriptFailed.
    """
    from tdbg.compiler import config as tdbg_config
    work = tempfile.mkdtemp(prefix="tdbg-profile-")
    try:
        cfg = (config or tdbg_config.current()).replace(
            enable_kernel_profile=True, debug=True, debug_dir=debug_dir or os.path.join(work, "debug"),
            report_path=os.path.join(work, "report.jsonl"))
        report = _profile_passes(script, list(argv), backend, iterations, trace_path, cfg, profile_iterations,
                                 on_step or (lambda text: None))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.debug_dir = report.debug_dir if debug_dir else None
    return report


def _profile_passes(script: str, argv: list, backend: str, iterations: int, trace_path: Optional[str], cfg,
                    profile_iterations: int, step: Callable) -> ProfileReport:
    import torch

    from tdbg.compiler import config as tdbg_config
    from tdbg.minifier.diagnose.explain import build_report
    from tdbg.minifier.runs.backends import resolve
    from tdbg.minifier.runs.instrument import Session

    from tdbg.minifier.runs.names import backend_label
    from tdbg.minifier.runs.own_backend import OWN
    step(f"loading backend {backend_label(backend)}")
    resolved = None if backend == OWN else _resolve(resolve, backend, cfg, script)
    step(f"the eager run of {script}")
    eager = run_script(script, argv, "eager", Session(None), capture=True)
    _check_pass(eager, script)
    if not eager.callables:
        raise ValueError(f"{script} never calls torch.compile, so there is nothing to profile")
    torch.compiler.reset()
    graphs: list = []
    if resolved is None:   # each torch.compile call's own backend, timed the same way
        session = Session(None, own=lambda b: timed_backend(b.compiler_fn, graphs), script=script, config=cfg)
    else:
        session = Session(timed_backend(resolved.compiler_fn, graphs), backend_kind=resolved.kind, backend_name=backend)
    before = _entries(cfg.debug_dir)
    with tdbg_config.use(cfg), _quiet_compiler_log(cfg):
        step(f"the compiled run of {script} (backend {backend_label(backend)})")
        compiled = run_script(script, argv, "compiled", session)
        _check_pass(compiled, script)
        # the replays repeat the script's calls; whatever they print was already shown once
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            step(f"timing {len(compiled.callables)} compiled callable(s), {iterations} calls each")
            timings = [_time_callable(c, iterations) for c in compiled.callables]
            step("counting subnormal values")
            for c, t in zip(compiled.callables, timings):
                t.subnormals = examine(c.replay(c._original), c.replay(c._target)) if c.last is not None else None
            step("profiling with torch.profiler")
            rows, eager_rows = _profiler_tables(compiled.callables, profile_iterations, trace_path)
    for g, info in zip(graphs, session.graphs):
        g.frame = info["frame"]
    runs = sorted(os.path.join(cfg.debug_dir, d) for d in _entries(cfg.debug_dir) - before)   # this pass's
    explained = build_report({"graphs": session.graphs, "recompiles": session.recompiles, "guards": session.guards})
    report = ProfileReport(
        script=script, backend=_ran(backend, session), iterations=iterations,
        eager_script_s=eager.seconds, compiled_script_s=compiled.seconds, callables=timings,
        graphs=graphs, stages=_stage_times(runs), fallbacks=_fallbacks(cfg.report_path),
        kernels=_kernels(cfg.report_path), explain=explained,
        profiler_rows=rows, eager_profiler_rows=eager_rows, trace_path=trace_path,
        debug_dir=runs[0] if len(runs) == 1 else (cfg.debug_dir if runs else None))
    report.time_split = time_split(rows)
    report.flags = lost_speed_flags(report)
    return report


def _entries(folder: str) -> set:
    return set(os.listdir(folder)) if os.path.isdir(folder) else set()


def drop_compiler_log(cfg):
    """Drop the `compiler` channel's records from now on (returns the filter, None when kept):
    `debug=True` turns that channel on, but a command that switches the debug traces on for its
    own use (profile's stage times, --html's page) was not asked for compiler logs — unless the
    config (TDBG_LOGS=compiler) asks for them."""
    if "compiler" in cfg.logs:
        return None
    import logging
    drop = _DropAll()
    logging.getLogger("tdbg.compiler").addFilter(drop)
    return drop


@contextlib.contextmanager
def _quiet_compiler_log(cfg):
    """drop_compiler_log while profiling."""
    drop = drop_compiler_log(cfg)
    try:
        yield
    finally:
        if drop is not None:
            import logging
            logging.getLogger("tdbg.compiler").removeFilter(drop)


class _DropAll:
    def filter(self, record) -> bool:
        return False


def time_split(rows: list) -> dict:
    """Share of the profiled self CPU time per TIME_CATEGORIES entry (and `other`)."""
    total = sum(r["self_cpu_us"] for r in rows) or 1.0
    split = {name: 0.0 for name, _ in TIME_CATEGORIES}
    split[OTHER] = 0.0
    for r in rows:
        name = next((n for n, pattern in TIME_CATEGORIES if pattern.search(r["name"])), OTHER)
        split[name] += r["self_cpu_us"] / total
    return split


def _ran(backend: str, session) -> str:
    """The backend the compiled pass ran: --backend's, or the script's own (by their names)."""
    ran = sorted({r.ran for r in session.compile_records if r.ran})
    return ", ".join(ran) if ran else backend


def _resolve(resolve: Callable, backend: str, cfg, script: str):
    """backends.resolve, with a user backend file that fails while loading turned into a ValueError."""
    from tdbg.minifier.runs.backends import BackendError
    try:
        return resolve(backend, cfg, script=script)
    except BackendError:
        raise
    except Exception as e:
        inner = getattr(e, "inner_exception", None) or e   # Dynamo's wrapper names only the backend
        first = (str(inner).strip().splitlines() or [""])[0]
        raise ValueError(f"loading backend {backend!r} failed: {type(inner).__name__}: {first}") from e


def _check_pass(run: ScriptPass, script: str) -> None:
    if run.error is not None or run.exit_code != 0:
        raise ScriptFailed(run, script)


def _time_callable(c: TimedCallable, iterations: int) -> CallableProfile:
    first = c.calls[0][0] if c.calls else 0.0
    if c.last is None:
        return CallableProfile(c._label, len(c.calls), first, None, None, None, None)
    runs = {"eager": c.replay(c._original), "compiled": c.replay(c._target)}
    watch = CpuWatch()
    # the script's calls warmed the compiled callable, not the eager one: both until their times settle
    number = {name: calls_per_sample(warm_up(run)[1]) for name, run in runs.items()}
    samples = alternate(runs, iterations, number)
    share = watch.share()
    eager, compiled = (Timing(samples[name]["seconds"], busy_share=share) for name in runs)
    noisy = "; ".join(f"{name}: {t.noisy}" for name, t in (("eager", eager), ("compiled", compiled)) if t.noisy)
    return CallableProfile(c._label, len(c.calls), first, eager.median_s, compiled.median_s,
                           eager.median_s / compiled.median_s if compiled.median_s else None,
                           median(samples["compiled"]["faults"]), noisy or None, number["compiled"])


def _profiler_tables(callables: list, n: int, trace_path: Optional[str]) -> tuple:
    """Profiler rows of the compiled callables (Chrome trace written to trace_path) and of eager."""
    tables = []
    for which in ("_target", "_original"):
        prof = _profile([c.replay(getattr(c, which)) for c in callables if c.last is not None], n)
        if which == "_target" and trace_path:
            prof.export_chrome_trace(trace_path)
        tables.append(_rows(prof))
    return tuple(tables)


def _profile(runs: list, n: int):
    from torch.profiler import ProfilerActivity, profile
    with _quiet_stderr_fd():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(n):
                for run in runs:
                    run()
    return prof


@contextlib.contextmanager
def _quiet_stderr_fd():
    """Kineto writes profiler_start/stop lines straight to file descriptor 2; drop them."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _rows(prof) -> list:
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    rows = [{"name": e.key, "calls": e.count, "self_cpu_us": e.self_cpu_time_total,
             "cpu_total_us": e.cpu_time_total, "self_cpu_pct": 100.0 * e.self_cpu_time_total / total}
            for e in events]
    return sorted(rows, key=lambda r: -r["self_cpu_us"])


def _stage_times(run_dirs: list) -> dict:
    """Stage -> seconds, summed over every debug.log the compiler wrote under the run folders."""
    stages: dict = {}
    logs = [log for d in run_dirs for log in glob.glob(os.path.join(d, "**", "debug.log"), recursive=True)]
    for log in sorted(logs):
        with open(log) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2:
                    try:
                        stages[parts[0]] = stages.get(parts[0], 0.0) + float(parts[1])
                    except ValueError:
                        continue
    return stages


def _report_lines(path: Optional[str]) -> list:
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _fallbacks(path: Optional[str]) -> list:
    return [{"graph": g.get("graph"), **fb} for g in _report_lines(path) for fb in g.get("fallbacks", [])]


def _kernels(path: Optional[str]) -> list:
    return [k["name"] for g in _report_lines(path) for k in g.get("kernels", [])]


# ---------------------------------------------------------------- lost-speed flags

PAGE_BYTES = resource.getpagesize()
FAULT_FLAG_BYTES = 1 << 20   # flag when a compiled call first-touches at least this much memory


def _flag_graph_breaks(r: ProfileReport) -> list:
    return [{"kind": "graph_breaks", "message": f"{fn['function']}: graph break at {b['line']}: {b['reason']}"}
            for fn in r.explain["functions"] for b in fn["breaks"]]


def _flag_recompiles(r: ProfileReport) -> list:
    return [{"kind": "recompiles", "message": f"{fn['function']}: {frame_label(rc['frame'])} recompiled because "
             f"{rc['changed']}" + (f"; {rc['suggestion']}" if rc["suggestion"] else "")}
            for fn in r.explain["functions"] for rc in fn["recompiles"]]


# aten ops whose aten call is the intended fast path (GEMM/attention libraries), not lost speed
LIBRARY_OPS = re.compile(r"\b(mm|addmm|bmm|baddbmm|convolution|_scaled_dot_product_\w+)\b")


def _flag_fallbacks(r: ProfileReport) -> list:
    targets = sorted({fb.get("target", "?") for fb in r.fallbacks})
    lost = [t for t in targets if not LIBRARY_OPS.search(t)]
    library = [t for t in targets if LIBRARY_OPS.search(t)]
    count = sum(1 for fb in r.fallbacks if fb.get("target", "?") in lost)
    return [{"kind": "fallbacks", "message": f"{count} op(s) ran through aten instead of generated kernels: "
             f"{', '.join(lost)}" + (f" (library calls by design: {', '.join(library)})" if library else "")}
            ] if lost else []


def _flag_page_faults(r: ProfileReport) -> list:
    flags = []
    for c in r.callables:
        faults = c.minor_faults_per_call or 0
        if faults * PAGE_BYTES >= FAULT_FLAG_BYTES:
            flags.append({"kind": "page_faults", "message": (
                f"{c.label}: {faults:.0f} minor page faults per call ({faults * PAGE_BYTES / 2**20:.1f} MiB "
                "first touched each call): outputs or temporaries are freshly allocated memory")})
    return flags


def _flag_subnormals(r: ProfileReport) -> list:
    lines = [subnormal_flag(c.label, c.subnormals) for c in r.callables if c.subnormals]
    return [{"kind": "subnormals", "message": line} for line in lines if line]


def _flag_slower(r: ProfileReport) -> list:
    return [{"kind": "slower", "message": f"{c.label}: compiled is {1 / c.speedup:.2f}x slower than eager"}
            for c in r.callables if c.speedup is not None and c.speedup < 1.0 and not c.noisy]


def _flag_noisy(r: ProfileReport) -> list:
    return [{"kind": "noisy", "message": f"{c.label}: timings too noisy to compare eager and compiled ({c.noisy}); "
             "rerun on a quiet machine"} for c in r.callables if c.noisy]


def _flag_overhead(r: ProfileReport) -> list:
    share = r.time_split.get("compiled-code wrappers", 0.0)
    return [{"kind": "overhead", "message": f"{share:.0%} of the compiled run's self CPU time is in the wrappers "
             "around the generated code (Dynamo guards, AOTAutograd, the graph's Python wrapper), not in "
             "kernels or aten ops: the graphs are too small for their per-call cost"}] if share >= OVERHEAD_FLAG_SHARE else []


LOST_SPEED_CHECKS = (_flag_graph_breaks, _flag_recompiles, _flag_fallbacks, _flag_page_faults, _flag_overhead,
                     _flag_subnormals, _flag_slower, _flag_noisy)


def lost_speed_flags(report: ProfileReport) -> list:
    """Every visible cause of lost speed, as {"kind", "message"} rows (one check per table entry)."""
    return [flag for check in LOST_SPEED_CHECKS for flag in check(report)]
