"""Benchmark harness: every workload under eager, torch's Inductor and tdbg, in one process.

    python benchmarks/harness.py [--only NAME] [--repeat N] [--json PATH] [--quick]
                                 [--backends eager,torch:inductor,tdbg] [--threads 2]

Per workload: each backend's first call (cold compile = first call minus a warm call) is checked
against eager with `tdbg.minifier.diagnose.accuracy.compare` (float64 reference where one can be made); a
backend that fails or mismatches is reported as such in its cell and is not timed. The others
are warmed up, then timed run by run in alternation (eager, inductor, tdbg, eager, ...); each
run makes the same number of calls per backend, and the figure is the median time per call.
Memory-bound rows also get the achieved bandwidth against a measured `torch.add(a, b, out=c)`
figure. Before the workloads, each compiling backend's one-off start-up is measured: the
compile time of a first trivial graph minus that of a second one. Caches (tdbg's and
Inductor's) are fresh temporary directories for every harness run.

Backends: `eager` (the function itself), `tdbg`, `torch:NAME` (torch.compile(backend=NAME)),
`path/to/file.py:function` or `module:function` (a Dynamo backend callable).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workloads import BY_NAME, WORKLOADS  # noqa: E402

DEFAULT_BACKENDS = ("eager", "torch:inductor", "tdbg")
INDUCTOR = "torch:inductor"
GOAL_BACKEND = "tdbg"
# issue 5's goals for tdbg beyond the per-row time limit
GOAL_BANDWIDTH_FRACTION = 0.8
GOAL_COLD_COMPILE_S = 0.3
GOAL_STARTUP_S = 2.0
JSON_SCHEMA = "tdbg.benchmark"


@dataclass(frozen=True)
class Settings:
    repeat: int = 15
    warmup: int = 3
    run_seconds: float = 0.05     # least wall time of one run (calls per run are calibrated on eager)
    copy_elements: int = 1 << 26  # the a+b bandwidth figure
    threads: int = 2
    quick: bool = False
    dtype: str = "float32"        # models.py --dtype: the floating dtype of weights and inputs
    flush_subnormals: bool = False  # models.py --flush-subnormals: FTZ/DAZ in every thread while timing


QUICK = dict(repeat=3, warmup=1, run_seconds=0.002, copy_elements=1 << 20, quick=True)


@dataclass
class Cell:
    """One backend on one workload."""
    workload: str
    backend: str
    status: str = "ok"             # ok | failed | mismatch
    median_s: Optional[float] = None
    min_s: Optional[float] = None
    runs_s: list = field(default_factory=list)
    first_call_s: Optional[float] = None
    compile_s: Optional[float] = None
    minor_faults_per_call: Optional[float] = None
    fault_share: Optional[float] = None   # estimated fraction of the time spent in page faults
    speedup_vs_eager: Optional[float] = None
    time_vs_inductor: Optional[float] = None
    gbps: Optional[float] = None
    bandwidth_fraction: Optional[float] = None
    error: Optional[str] = None
    mismatches: list = field(default_factory=list)
    # checks passed only within eager's own spread on one-ulp perturbed problems (models.py)
    within_spread: list = field(default_factory=list)
    # models.py --dynamic: the sizes fed before this one, and what compiling them took
    dynamic: Optional[dict] = None
    # NOISY: why this cell's time cannot be compared (a busy machine, widely spread runs), or None
    # (tdbg.minifier.diagnose.timing.noisy_reason, as tdbg profile and tdbg diff judge timings)
    noisy: Optional[str] = None


# ---------------------------------------------------------------- backends

def make_runner(spec: str, fn):
    """What `spec` runs for `fn`: eager is `fn` itself, everything else goes through torch.compile."""
    import torch
    return fn if spec == "eager" else torch.compile(fn, backend=backend_of(spec))


def backend_of(spec: str):
    """What torch.compile's `backend=` takes for a compiled spec: "tdbg", "torch:NAME"'s NAME, or
    a user backend's function."""
    if spec == "tdbg":
        return "tdbg"
    if spec.startswith("torch:"):
        return spec[len("torch:"):]
    from tdbg.minifier.runs.backends import resolve
    return resolve(spec).compiler_fn


def describe(e: BaseException) -> str:
    inner = getattr(e, "inner_exception", None) or e
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0] if lines else ''}"


# ---------------------------------------------------------------- measurements

def copy_bandwidth(n: int, repeat: int) -> dict:
    """GB/s of torch.add(a, b, out=c) on n float32 elements (reads 2n, writes n; no allocation)."""
    import torch
    from tdbg.minifier.diagnose.timing import alternate, median
    a, b, c = torch.rand(n), torch.rand(n), torch.empty(n)
    for _ in range(3):
        torch.add(a, b, out=c)
    seconds = median(alternate({"copy": lambda: torch.add(a, b, out=c)}, max(repeat, 5))["copy"]["seconds"])
    return {"elements": n, "bytes": 12 * n, "seconds": seconds, "gbps": 12 * n / seconds / 1e9}


def fault_cost(n: int, repeat: int = 5) -> dict:
    """Seconds per minor page fault: filling fresh (just mapped) memory minus filling touched memory."""
    import torch
    from tdbg.minifier.diagnose.timing import median, timed
    touched = torch.empty(n)
    touched.fill_(1.0)
    fresh, warm, faults = [], [], []
    for _ in range(repeat):
        buf = torch.empty(n)
        seconds, count, _ = timed(buf.fill_, 1.0)
        fresh.append(seconds)
        faults.append(count)
        del buf
        warm.append(timed(touched.fill_, 1.0)[0])
    per_fault = max(0.0, median(fresh) - median(warm)) / max(median(faults), 1)
    return {"elements": n, "faults": median(faults), "seconds_per_fault": per_fault}


def startup_cost(spec: str) -> dict:
    """One-off start-up of a compiling backend: first trivial compile minus a second trivial compile."""
    import torch
    from tdbg.minifier.diagnose.timing import timed
    x = torch.randn(8)
    compiles = []
    try:
        for fn in (lambda t: t + 1, lambda t: t * 2 - 1):
            runner = make_runner(spec, fn)
            first = timed(runner, x)[0]
            compiles.append(first - timed(runner, x)[0])
    except Exception as e:
        return {"backend": spec, "error": describe(e)}
    finally:
        torch.compiler.reset()
    return {"backend": spec, "first_compile_s": compiles[0], "second_compile_s": compiles[1],
            "startup_s": compiles[0] - compiles[1]}


def check_cell(cell: Cell, runner, inputs, expected, reference):
    """First (cold) call, then a warm one; compare with eager. Returns the runner when it passed."""
    from tdbg.minifier.diagnose.accuracy import compare
    from tdbg.minifier.diagnose.timing import timed
    try:
        cell.first_call_s, _, result = timed(runner, *inputs)
        warm = timed(runner, *inputs)[0]
    except Exception as e:
        cell.status, cell.error = "failed", describe(e)
        return None
    cell.compile_s = max(0.0, cell.first_call_s - warm) if cell.backend != "eager" else 0.0
    mismatches = compare(expected, result, reference)
    if mismatches:
        cell.status, cell.mismatches = "mismatch", [m.to_dict() for m in mismatches]
        cell.error = f"{mismatches[0].output}: {mismatches[0].message}"
        return None
    return runner


def run_workload(w, backends: list, settings: Settings, runner_for=make_runner) -> list:
    """Each backend's `runner_for(spec, fn)` checked against eager and a float64 reference, then
    timed interleaved with the others: one Cell per backend."""
    import torch
    from tdbg.minifier.diagnose.accuracy import fp64_reference
    from tdbg.minifier.diagnose.timing import CpuWatch, alternate, timed
    fn, inputs = w.build(settings.quick)
    expected = fn(*inputs)
    reference = fp64_reference(fn, inputs)
    cells, runners = [], {}
    for spec in backends:
        cell = Cell(w.name, spec)
        cells.append(cell)
        try:
            runner = runner_for(spec, fn)
        except Exception as e:
            cell.status, cell.error = "failed", describe(e)
            continue
        runner = check_cell(cell, runner, inputs, expected, reference)
        if runner is not None:
            runners[spec] = _guarded(cell, lambda r=runner: r(*inputs))
    watch = CpuWatch()
    for run in runners.values():
        for _ in range(settings.warmup):
            run()
    calibrate = runners.get("eager") or (lambda: fn(*inputs))
    number = max(1, math.ceil(settings.run_seconds / max(timed(calibrate)[0], 1e-7)))
    samples = alternate(runners, settings.repeat, number)
    fill_timed(cells, samples, watch.share())
    _ratios(cells, w, inputs, expected)
    torch.compiler.reset()
    return cells


def fill_timed(cells: list, samples: dict, busy_share: Optional[float]) -> None:
    """Each timed cell's runs, median, faults and NOISY verdict (the one rule tdbg's commands use)."""
    from tdbg.minifier.diagnose.timing import median, noisy_reason
    for cell in cells:
        if cell.backend in samples and cell.status == "ok":
            cell.runs_s = samples[cell.backend]["seconds"]
            cell.median_s, cell.min_s = median(cell.runs_s), min(cell.runs_s)
            cell.minor_faults_per_call = median(samples[cell.backend]["faults"])
            cell.noisy = noisy_reason(cell.runs_s, busy_share)


def _guarded(cell: Cell, run):
    """`run`, except that an error while timing marks the cell failed and later calls do nothing."""
    def call():
        if cell.status != "ok":
            return
        try:
            run()
        except Exception as e:
            cell.status, cell.error = "failed", f"while timing: {describe(e)}"
    return call


def _ratios(cells: list, w, inputs, expected) -> None:
    base = {c.backend: c.median_s for c in cells if c.median_s}
    nbytes = w.bytes_moved(inputs, expected) if w.bytes_moved else None
    for c in cells:
        if not c.median_s:
            continue
        if "eager" in base:
            c.speedup_vs_eager = base["eager"] / c.median_s
        if INDUCTOR in base:
            c.time_vs_inductor = c.median_s / base[INDUCTOR]
        if nbytes:
            c.gbps = nbytes / c.median_s / 1e9


def goals(workloads: list, cells: list, startup: list, backend: str = GOAL_BACKEND) -> list:
    """Issue 5's goals for `backend`: one row each {goal, workload, target, measured, met, note};
    an unmet goal's note gives the numbers that bound it."""
    mine = {c.workload: c for c in cells if c.backend == backend}
    inductor = {c.workload: c for c in cells if c.backend == INDUCTOR}
    rows = []
    for w in workloads:
        c = mine.get(w.name)
        if c is None:
            continue
        rows.append(_goal("time / inductor", w.name, w.max_time_vs_inductor, c.time_vs_inductor, c,
                          _time_note(c, inductor.get(w.name))))
        rows.append(_goal("cold compile s", w.name, GOAL_COLD_COMPILE_S, c.compile_s, c))
        if w.bandwidth_goal:
            rows.append(_goal("fraction of copy bandwidth", w.name, GOAL_BANDWIDTH_FRACTION,
                              c.bandwidth_fraction, c, _faults_note(c), at_least=True))
    for s in startup:
        if s["backend"] == backend:
            rows.append({"goal": "start-up s", "workload": "", "target": GOAL_STARTUP_S,
                         "measured": s.get("startup_s"), "met": s.get("startup_s") is not None
                         and s["startup_s"] <= GOAL_STARTUP_S, "note": s.get("error", "")})
    return rows


def _faults_note(c: Cell) -> str:
    if c.minor_faults_per_call is None or c.fault_share is None:
        return ""
    return f"page faults ~{c.fault_share:.0%} of the time ({c.minor_faults_per_call:.0f}/call)"


def _time_note(c: Cell, ref: Optional[Cell]) -> str:
    if ref is None or not ref.median_s or not c.median_s:
        return ""
    return (f"{c.median_s * 1e3:.3f} ms vs {ref.median_s * 1e3:.3f} ms; {_faults_note(c)}; "
            f"inductor's {_faults_note(ref)}")


def _goal(goal: str, workload: str, target: float, measured, cell: Cell, note: str = "",
          at_least: bool = False) -> dict:
    met = measured is not None and (measured >= target if at_least else measured <= target)
    if cell.status != "ok":
        note = f"{cell.status}: {cell.error}"
    return {"goal": goal, "workload": workload, "target": target, "measured": measured, "met": met,
            "note": "" if met else note}


def machine() -> dict:
    import torch
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


@contextlib.contextmanager
def benchmark_state(settings: Settings):
    """Threads, MHA fast path off, fresh tdbg and Inductor caches, no-grad, subnormals flushed in
    every thread when `settings.flush_subnormals`; all restored afterwards."""
    import torch
    from tdbg.compiler import config as tdbg_config
    saved = (torch.get_num_threads(), torch.backends.mha.get_fastpath_enabled(),
             os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    cache = tempfile.mkdtemp(prefix="tdbg-bench-")
    torch.set_num_threads(settings.threads)
    torch.backends.mha.set_fastpath_enabled(False)
    # torch's Inductor takes its cache location from the environment when it compiles
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache, "inductor")
    cfg = tdbg_config.current().replace(cache_dir=os.path.join(cache, "tdbg"), num_threads=settings.threads)
    flushing = None
    try:
        with tdbg_config.use(cfg), torch.no_grad():
            if settings.flush_subnormals:
                from tdbg.minifier.diagnose.subnormals import set_flush
                flushing = set_flush(True)
            yield
    finally:
        if flushing is not None:
            set_flush(flushing)
        torch.set_num_threads(saved[0])
        torch.backends.mha.set_fastpath_enabled(saved[1])
        if saved[2] is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved[2]
        shutil.rmtree(cache, ignore_errors=True)


def run(workloads: list, backends: list, settings: Settings) -> dict:
    """The whole benchmark under `benchmark_state`; returns the JSON payload."""
    with benchmark_state(settings):
        startup_cost("torch:eager")     # Dynamo's own first-use cost, so no backend is charged for it
        startup = [startup_cost(b) for b in backends if b != "eager"]
        bandwidth = copy_bandwidth(settings.copy_elements, settings.repeat)
        faults = fault_cost(settings.copy_elements)
        cells = [c for w in workloads for c in run_workload(w, backends, settings)]
    for c in cells:
        if c.gbps:
            c.bandwidth_fraction = c.gbps / bandwidth["gbps"]
        if c.median_s and c.minor_faults_per_call is not None:
            c.fault_share = min(1.0, c.minor_faults_per_call * faults["seconds_per_fault"] / c.median_s)
    return {"goals": goals(workloads, cells, startup), "machine": machine(), "settings": dataclasses.asdict(settings), "backends": backends,
            "bandwidth": bandwidth, "page_fault": faults, "startup": startup,
            "workloads": {w.name: w.description for w in workloads},
            "cells": [dataclasses.asdict(c) for c in cells]}


# ---------------------------------------------------------------- output

def _fmt(value, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _label(backend: str) -> str:
    return os.path.basename(backend) if ".py:" in backend else backend


def cell_row(c: dict) -> list:
    if c["status"] != "ok":
        return [c["workload"], _label(c["backend"])] + [""] * 6 + [f"{c['status'].upper()}: {c['error']}"]
    frac = c["bandwidth_fraction"]
    return [c["workload"], _label(c["backend"]), _fmt(c["median_s"] * 1e3, ".3f"), _fmt(c["speedup_vs_eager"], ".2f", "x"),
            _fmt(c["time_vs_inductor"], ".2f", "x"), _fmt(c["compile_s"], ".3f"),
            _fmt(c["gbps"], ".1f") + ("" if frac is None else f" ({frac:.0%})"),
            _fmt(c["minor_faults_per_call"], ".0f") + ("" if not c["fault_share"] else f" ({c['fault_share']:.0%})"),
            "ok" if not c.get("noisy") else f"ok; NOISY: {c['noisy']}"]


COLUMNS = ("workload", "backend", "ms/call", "speedup vs eager", "time / inductor", "cold compile s",
           "GB/s (% of copy)", "faults/call (% of time)", "check")


def render(payload: dict, console=None) -> None:
    from rich.console import Console
    from rich.table import Table
    console = console or Console(width=180, highlight=False)
    m, bw = payload["machine"], payload["bandwidth"]
    console.print(f"{m['date']}  {m['cpu']}  {m['cores']} cores  torch {m['torch']}  "
                  f"threads={payload['settings']['threads']}  repeat={payload['settings']['repeat']}")
    console.print(f"copy bandwidth (torch.add out=, {bw['elements']} fp32): {bw['gbps']:.1f} GB/s; "
                  f"a minor page fault costs {payload['page_fault']['seconds_per_fault'] * 1e6:.2f} us")
    for s in payload["startup"]:
        text = f"error {s['error']}" if "error" in s else (
            f"{s['startup_s']:.3f} s (first trivial compile {s['first_compile_s']:.3f} s, "
            f"second {s['second_compile_s']:.3f} s)")
        console.print(f"start-up {s['backend']}: {text}")
    table = Table(*COLUMNS[:-1])
    table.add_column(COLUMNS[-1], max_width=60, overflow="ellipsis", no_wrap=True)
    for c in payload["cells"]:
        table.add_row(*cell_row(c))
    console.print(table)
    if payload["goals"]:
        console.print(goal_table(payload["goals"]))


def goal_table(rows: list):
    from rich.table import Table
    table = Table("goal (tdbg)", "workload", "target", "measured", "met", title="issue 5 goals")
    table.add_column("note (what bounds it)", overflow="fold")
    for g in rows:
        table.add_row(g["goal"], g["workload"], f"{g['target']:g}", _fmt(g["measured"], ".3f"),
                      "yes" if g["met"] else "NO", g["note"])
    return table


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", choices=sorted(BY_NAME), help="run only this workload (repeatable)")
    p.add_argument("--repeat", type=int, help="timed runs per backend")
    p.add_argument("--json", dest="json_path", help="write the results as JSON")
    p.add_argument("--quick", action="store_true", help="small shapes and few repeats (tests)")
    p.add_argument("--backends", default=",".join(DEFAULT_BACKENDS), help="comma-separated backend specs")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads and tdbg's num_threads")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    changes = dict(QUICK) if args.quick else {}
    changes.update({k: v for k, v in (("repeat", args.repeat), ("threads", args.threads)) if v is not None})
    settings = Settings(**changes)
    workloads = [BY_NAME[n] for n in args.only] if args.only else list(WORKLOADS)
    payload = run(workloads, [b.strip() for b in args.backends.split(",") if b.strip()], settings)
    render(payload)
    if args.json_path:
        from tdbg.cli.console import write_json
        write_json(args.json_path, payload, JSON_SCHEMA)
    return payload


if __name__ == "__main__":
    main()
