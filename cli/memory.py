"""`tdbg memory SCRIPT [-- ARGS...]`: eager vs compiled peak memory per graph and call, measured."""
from __future__ import annotations

import contextlib
import sys
import time

import click

from tdbg.cli.common import (backend_option, base_config, check_backend, check_output_file, json_option,
                             require_script, script_arguments)
from tdbg.cli.console import doing, exit_code, exit_codes_help, fail, now_doing, out, write_json

JSON_SCHEMA = "tdbg.memory"
DIFFERENCE_WORDS = {"peak": "peak", "saved_for_backward": "saved for backward",
                    "held_after_call": "left alive besides outputs and saved tensors (a pool, a cache)"}


@click.command(epilog=exit_codes_help(), context_settings={"max_content_width": 100})
@script_arguments
@backend_option()
@click.option("--calls", default=3, show_default=True, type=click.IntRange(1),
              help="Measured calls of each graph (forward, inference and backward counted apart); later calls "
                   "run unmeasured.")
@click.option("--max-memory-ratio", "max_ratio", type=click.FloatRange(0, min_open=True), metavar="R",
              help="CI check: exit with the threshold code (20) when a measured call's compiled peak exceeds R "
                   "times eager's (calls whose compiled peak is under 4 KiB are not judged).")
@json_option
def memory(script, args, backend, calls, max_ratio, json_path):
    """Measure each compiled graph's peak memory against eager's, per call.

    SCRIPT runs once, every torch.compile compiling with --backend. Each graph's first --calls
    calls (forward or inference, and with a backend that has an AOT stage, the backward graph)
    run twice: the graph as Dynamo captured it run by PyTorch eager on clones of the inputs, then
    the compiled graph; PyTorch's CPU allocator reports every allocation and free of both
    (torch.profiler's memory events): peak bytes above what was live before the call, bytes left
    alive, and for training the bytes autograd saved for backward.
    """
    require_script(script)
    check_backend(backend)
    check_output_file(json_path, "--json")
    config = base_config()
    from tdbg.minifier.diagnose.memory import memory_script
    from tdbg.minifier.diagnose.profiling import ScriptFailed
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    quiet = contextlib.redirect_stdout(sys.stderr) if json_path == "-" else contextlib.nullcontext()
    try:
        with quiet, doing(f"measuring {script}"):
            report = memory_script(script, list(args), backend=backend, calls=calls, config=config,
                                   on_step=now_doing)
    except ValueError as e:
        fail(str(e), "bad_input")
    except ScriptFailed as e:
        from tdbg.cli.profile import _script_failed
        _script_failed(e)
    over = report.over_ratio(max_ratio) if max_ratio else []
    code = exit_code("threshold" if over else "ok")
    if json_path != "-":
        render(report, start, max_ratio, over)
    write_json(json_path, dict(report.to_dict(), date=start, max_memory_ratio=max_ratio,
                               over_ratio=[{"graph": c.graph, "kind": c.kind, "call": c.call, "ratio": c.ratio} for c in over], exit_code=code), JSON_SCHEMA)
    if code:
        raise SystemExit(code)


def mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def _ratio(c) -> str:
    return "-" if c.ratio is None else f"{c.ratio:.2f}x"


def render(report, start: str, max_ratio, over: list) -> None:
    from rich.markup import escape
    from rich.table import Table

    from tdbg.cli.profile import _table
    c = out()
    c.print(f"[bold]tdbg memory[/] {escape(report.script)}  backend={escape(report.backend)}  {start}")
    t = Table(title="peak bytes above what was live before the call (MiB)")
    for col in ("graph", "kind", "call", "eager peak", "compiled peak", "ratio", "eager left", "compiled left",
                "eager saved", "compiled saved"):
        t.add_column(col, justify="left" if col in ("graph", "kind") else "right")
    for call in report.all_calls():
        t.add_row(str(call.graph), call.kind, str(call.call), mib(call.eager_peak_bytes),
                  mib(call.compiled_peak_bytes), _ratio(call), mib(call.eager_end_bytes), mib(call.compiled_end_bytes),
                  mib(call.eager_saved_bytes), mib(call.compiled_saved_bytes))
    _table(t)
    for g in report.graphs:
        if g.source:
            c.print(f"graph {g.graph} ({escape(g.frame)}) starts at {escape(g.source)}")
    for call in report.first_calls():
        _render_buffers(call)
    diffs = report.differences()
    if diffs:
        c.print("[bold]largest differences (compiled - eager), first calls:[/]")
        for d in diffs:
            what = DIFFERENCE_WORDS[d["what"]]
            c.print(f"  graph {d['graph']} {d['kind']} call {d['call']}: {what} {d['bytes']:+,} bytes "
                    f"({d['bytes'] / 2**20:+.2f} MiB)")
    for note in report.notes:
        c.print(f"note: {escape(note)}")
    c.print(f"method: {escape(report.method)}")
    if max_ratio:
        if over:
            worst = max(over, key=lambda x: x.ratio or float("inf"))
            c.print(f"[bold red]OVER --max-memory-ratio {max_ratio:g}:[/] {len(over)} call(s); worst graph "
                    f"{worst.graph} {worst.kind} call {worst.call}: {mib(worst.compiled_peak_bytes)} MiB compiled vs "
                    f"{mib(worst.eager_peak_bytes)} MiB eager ({_ratio(worst)})")
        else:
            c.print(f"within --max-memory-ratio {max_ratio:g}: no measured call's compiled peak exceeds "
                    f"{max_ratio:g}x eager's")


BUFFER_ROWS = 5      # buffers shown per side; the JSON keeps memory_buffers.TOP_BUFFERS
SMALL_BUFFER = 1024  # scalars and shape tensors are left out of the terminal's list


def _render_buffers(call) -> None:
    from rich.markup import escape
    c = out()
    for side, peak, rows in (("compiled", call.compiled_peak_bytes, call.compiled_peak_buffers),
                             ("eager", call.eager_peak_bytes, call.eager_peak_buffers)):
        rows = [r for r in rows if r["bytes"] >= SMALL_BUFFER][:BUFFER_ROWS]
        if not rows:
            continue
        c.print(f"graph {call.graph} {call.kind} call {call.call}, alive at the {side} peak ({mib(peak)} MiB):")
        for r in rows:
            made = ", ".join(r["made_by"]) or "-"
            c.print(f"  {mib(r['bytes']):>8} MiB  {escape(r['name'] or '(no local)'):<10} {escape(r['op'] or '-'):<20} "
                    f"made by {escape(made)}" + (f"  <- {escape(r['source'])}" if r["source"] else ""))
