"""`tdbg profile SCRIPT [-- ARGS...]`: eager vs compiled time per call, profiler table, lost speed."""
from __future__ import annotations

import contextlib
import os
import sys
import time

import click

from tdbg.cli.common import (backend_label, backend_option, base_config, check_backend, check_output_dir,
                             check_output_file, frame_label, json_option, require_script, script_arguments)
from tdbg.cli.console import doing, err, exit_codes_help, fail, now_doing, out, render_evidence, write_json

JSON_SCHEMA = "tdbg.profile"
PROFILER_ROWS = 15
EAGER_PROFILER_ROWS = 8


@click.command(epilog=exit_codes_help(), context_settings={"max_content_width": 100})
@script_arguments
@backend_option()
@click.option("--iterations", default=20, show_default=True, type=click.IntRange(1),
              help="Timed samples of each compiled callable and of its eager original, alternating, after both "
                   "are warmed up until their times settle (a sample batches calls shorter than 1 ms); "
                   "timings too spread, or taken while other processes kept the CPUs busy, are marked NOISY.")
@click.option("--trace", "trace_path", metavar="PATH",
              help="Chrome trace file to write (default: <script>.trace.json in a new temporary folder, named at "
                   "the end; never in the current folder). An existing file is refused unless --force.")
@json_option
@click.option("--force", is_flag=True, help="Overwrite an existing trace file.")
@click.option("--debug", is_flag=True,
              help="Keep the compiler's debug traces (output_code.py, debug.log per graph) in TDBG_DEBUG_DIR "
                   "(default tdbg_debug/); without it they live in a temporary folder removed at the end.")
def profile(script, args, backend, iterations, trace_path, json_path, force, debug):
    """Time SCRIPT eager and compiled, and show where the compiled time goes.

    Every torch.compile in SCRIPT compiles with --backend. Each compiled callable is then called
    --iterations times with the arguments of its last call in the script, alternating with its
    eager original, and profiled with torch.profiler (tdbg's kernels appear by name). Flags graph
    breaks, recompiles, ops that fell back to aten and allocation page faults. The script's own
    output is shown once (from the compiled run).
    """
    require_script(script)
    check_backend(backend)
    check_output_file(json_path, "--json")
    chosen, trace_path = trace_path, _trace_path(script, trace_path, force)
    config = base_config()
    debug_dir = config.debug_dir if debug or config.debug else None
    check_output_dir(debug_dir, "--debug (TDBG_DEBUG_DIR)", must_be_empty=False)
    from tdbg.minifier.diagnose.profiling import ScriptFailed, profile_script
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    # with --json -, the script's own prints go to stderr so stdout stays one JSON document
    quiet = contextlib.redirect_stdout(sys.stderr) if json_path == "-" else contextlib.nullcontext()
    try:
        with quiet, doing(f"profiling {script}"):
            report = profile_script(script, list(args), backend=backend, iterations=iterations,
                                    trace_path=trace_path, config=config, debug_dir=debug_dir, on_step=now_doing)
    except ValueError as e:
        fail(str(e), "bad_input")
    except ScriptFailed as e:
        _script_failed(e)
    if json_path != "-":      # with --json -, stdout carries only the JSON document
        render(report, start, "" if chosen else " (a new temporary folder; --trace PATH writes it elsewhere)")
    write_json(json_path, dict(report.to_dict(), date=start), JSON_SCHEMA)


def _trace_path(script: str, given, force: bool) -> str:
    """Where the Chrome trace goes, checked before any work: --trace PATH (an existing file only
    with --force), else <script>.trace.json in a new temporary folder (a run must not leave files
    in the folder it was started from)."""
    if given:
        if os.path.exists(given) and not os.path.isdir(given) and not force:
            fail(f"{given} already exists; pass --force to overwrite it or --trace PATH to write elsewhere.", "usage")
        check_output_file(given, "--trace")
        return given
    import tempfile
    stem = os.path.splitext(os.path.basename(script))[0]
    return os.path.join(tempfile.mkdtemp(prefix="tdbg-profile-"), f"{stem}.trace.json")


def _script_failed(e) -> None:
    """The script's own failure keeps its exit code; a compile/runtime failure gets its stage's code."""
    from tdbg.cli.common import stage_exit_code
    if e.output:     # the eager run's output is kept, not shown; it explains this failure
        err().print(e.output, markup=False, highlight=False, end="")
    if e.info is None:
        err().print(f"[bold red]error:[/] the script exited with code {e.exit_code} in the {e.mode} run")
        raise SystemExit(e.exit_code)
    if e.info["stage"] == "script":     # the script's own error: its traceback is what helps
        err().print(e.info["traceback"], markup=False, end="")
    render_evidence(dict(e.info.get("evidence") or {}, **{k: v for k, v in e.info.items() if v}),
                    f"the {e.mode} run of the script failed: stage {e.info['stage']}")
    raise SystemExit(stage_exit_code({"status": "failed", "stage": e.info["stage"], "script_exit_code": 1}))


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _us(us) -> str:
    return f"{us / 1e3:.3f}ms" if us >= 1000 else f"{us:.1f}us"


def render(report, start: str, trace_note: str = "") -> None:
    from rich.markup import escape
    from rich.table import Table
    c = out()
    c.print(f"[bold]tdbg profile[/] {escape(report.script)}  backend: {escape(backend_label(report.backend))}  "
            f"iterations={report.iterations}  {start}")
    t = Table(title="time per call (medians after warm-up, alternating eager/compiled)")
    for col in ("callable", "calls in script", "eager ms", "compiled ms", "speedup", "first call s", "faults/call"):
        t.add_column(col, justify="left" if col == "callable" else "right")
    for cp in report.callables:
        t.add_row(escape(cp.label), str(cp.calls_in_script), _ms(cp.eager_s), _ms(cp.compiled_s),
                  "-" if cp.speedup is None else f"{cp.speedup:.2f}x" + (" NOISY" if cp.noisy else ""),
                  f"{cp.first_call_s:.3f}",
                  "-" if cp.minor_faults_per_call is None else f"{cp.minor_faults_per_call:.0f}")
    _table(t)
    c.print(f"script wall time: eager {report.eager_script_s:.3f} s, compiled {report.compiled_script_s:.3f} s "
            "(includes compilation)")
    _render_compile(report)
    _render_profile(report.profiler_rows, PROFILER_ROWS, "torch.profiler, compiled (self CPU time)")
    if report.time_split:
        c.print("compiled self CPU time: " + ", ".join(f"{name} {share:.0%}" for name, share in report.time_split.items()))
    _render_profile(report.eager_profiler_rows, EAGER_PROFILER_ROWS, "torch.profiler, eager (self CPU time)")
    c.print(f"Chrome trace: {escape(str(report.trace_path))}{trace_note}")
    if report.debug_dir and os.path.isdir(report.debug_dir):
        c.print(f"compiler debug traces (output_code.py, debug.log per graph): {escape(report.debug_dir)}")
    elif report.backend == "inductor":
        c.print("compiler debug traces: removed with the run's temporary folder (--debug keeps them)")
    _render_flags(report.flags)


def _render_compile(report) -> None:
    from rich.table import Table
    c = out()
    t = Table(title="compiled graphs")
    for col in ("compile id", "frame", "ops", "backend s", "note"):
        t.add_column(col, justify="right" if col in ("ops", "backend s") else "left")
    for g in report.graphs:
        note = "recompile" if g.recompile else ""
        t.add_row(g.compile_id, frame_label(g.frame), str(g.ops), f"{g.seconds:.3f}", (note + (" failed: " + g.error if g.error else "")).strip())
    _table(t)
    backend_s = sum(g.seconds for g in report.graphs)
    first_s = sum(cp.first_call_s for cp in report.callables)
    c.print(f"first calls {first_s:.3f}s = backend {backend_s:.3f}s + Dynamo capture, guards and first runs "
            f"{first_s - backend_s:.3f}s")
    if report.stages:
        rest = backend_s - sum(report.stages.values())
        c.print("compile stages (summed over graphs): " + ", ".join(
            f"{name} {secs:.3f}s" for name, secs in sorted(report.stages.items(), key=lambda kv: -kv[1]))
            + f"; rest of the backend time (AOTAutograd, decompositions, wrapper) {rest:.3f}s")
    else:
        c.print("compile stages: the backend reports none; total per graph is shown above")


def _render_profile(rows: list, limit: int, title: str) -> None:
    from rich.markup import escape
    from rich.table import Table
    from tdbg.minifier.diagnose.profiling import KERNEL_NAME
    t = Table(title=title)
    for col in ("name", "self CPU %", "self CPU", "CPU total", "# calls"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for r in rows[:limit]:
        name = escape(r["name"])
        t.add_row(f"[bold cyan]{name}[/]" if KERNEL_NAME.search(r["name"]) else name, f"{r['self_cpu_pct']:.2f}%",
                  _us(r["self_cpu_us"]), _us(r["cpu_total_us"]), str(r["calls"]))
    _table(t)


def _table(table) -> None:
    """Through out(): a terminal keeps its width; piped or captured output is wide enough for long
    kernel names (console.PIPE_WIDTH), and --html records it."""
    out().print(table)


def _render_flags(flags: list) -> None:
    from rich.markup import escape
    c = out()
    if not flags:
        c.print("lost speed: no graph breaks, recompiles, aten fallbacks or allocation page faults seen")
        return
    c.print("[bold yellow]lost speed:[/]")
    for f in flags:
        c.print(f"  [yellow]{f['kind']}[/]: {escape(f['message'])}")
