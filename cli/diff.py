"""`tdbg diff DIR_A DIR_B`: what changed between two `tdbg run --save-io` folders."""
from __future__ import annotations

import click

from tdbg.cli import common
from tdbg.cli.console import exit_code, exit_codes_help, fail, out, report_to_stderr, write_json

JSON_SCHEMA, JSON_VERSION = "tdbg.diff", 1


@click.command(epilog=exit_codes_help())
@click.argument("dir_a", type=click.Path())
@click.argument("dir_b", type=click.Path())
@click.option("--slower", "slower_ratio", type=click.FloatRange(1.0, min_open=True), default=1.25, show_default=True,
              metavar="RATIO", help="Call a graph slower (or faster) when B's median call time is RATIO times "
                                    "A's (or 1/RATIO) and the runs' spreads do not overlap; never when either "
                                    "run's timings are NOISY (needs timings: `tdbg run --save-io DIR --profile`).")
@common.json_option
def diff(dir_a, dir_b, slower_ratio, json_path):
    """Which graphs changed structure, which outputs changed beyond tolerance, which got slower.

    Graphs are matched by name. Outputs are compared where both runs gave the graph the same
    inputs (B's compiled outputs vs A's), and each run's compiled outputs vs its own eager
    outputs. Exit code 0 when nothing changed, 22 (changed) when a graph's structure or outputs
    changed (slower graphs and kernels are reported, not counted). Timings taken on a busy
    machine, or spread too widely to tell, are reported as too noisy to compare.
    """
    if json_path == "-":
        report_to_stderr()
    common.check_output_file(json_path, "--json")
    from tdbg.minifier.artifacts.saved_io import SavedIOError
    from tdbg.minifier.diagnose.diff import diff_saved
    try:
        result = diff_saved(dir_a, dir_b, slower_ratio=slower_ratio)
    except SavedIOError as e:
        fail(str(e), "bad_input")
    code = exit_code("changed" if result.changed else "ok")
    render(result)
    write_json(json_path, {**result.to_dict(), "exit_code": code}, JSON_SCHEMA, JSON_VERSION)
    raise SystemExit(code)


def render(result) -> None:
    from rich.markup import escape
    c = out()
    for note in result.notes:
        c.print(f"[bold]runs differ in[/] {escape(note)}")
    for g in result.graphs:
        label = f"{escape(g.name)} ({g.kind})"
        if g.status == "same":
            same = "same structure, outputs within tolerance" + (
                "" if g.inputs_match else " of each run's own eager (inputs differ, so A and B were not compared directly)")
            c.print(f"[green]same[/]    {label}: {same}")
        else:
            c.print(f"[bold red]changed[/] {label}: {escape('; '.join(g.reasons))}")
            for op, n in g.ops_added.items():
                c.print(f"    + {n} x {escape(op)}")
            for op, n in g.ops_removed.items():
                c.print(f"    - {n} x {escape(op)}")
            for m in g.a_vs_b or (g.b_vs_eager if not g.a_vs_eager else None) or []:
                c.print(f"    {escape(m['output'])}: {escape(m['message'])}")
        if g.timing:
            _render_timing(c, g.timing)
    if result.timings != "both":
        c.print("no timings saved" + ("" if result.timings == "none" else f" in both folders ({result.timings})")
                + ": rerun with `tdbg run --save-io DIR --profile` to compare speed")
    changed = sum(1 for g in result.graphs if g.status != "same")
    c.print(f"{len(result.graphs)} graph(s): {changed} changed" if changed else
            f"{len(result.graphs)} graph(s): nothing changed")


# verdict (timing.compare_times) -> the word that starts a graph's or kernel's time line
TIME_WORDS = {"slower": "[bold yellow]slower[/]", "faster": "[bold green]faster[/]", "same": "time", "noisy": "time"}


def _render_timing(c, t: dict) -> None:
    from rich.markup import escape
    line = f"    {TIME_WORDS[t['verdict']]}: {t['a_s'] * 1e3:.3f} ms -> {t['b_s'] * 1e3:.3f} ms median per call"
    if t["verdict"] == "noisy":
        c.print(f"{line}: [yellow]timings too noisy to compare[/] ({escape(t['why'])})")
    else:
        c.print(f"{line} ({t['ratio']:.2f}x" + (f"; {escape(t['why'])})" if t.get("why") else ")"))
    kernels = t.get("kernels")
    if kernels is None:
        return
    if t["verdict"] == "noisy":
        c.print(f"      kernels: {len(kernels)} timed in both runs, too noisy to compare")
        return
    count = {v: sum(k["verdict"] == v for k in kernels) for v in ("slower", "faster", "noisy")}
    c.print(f"      kernels: {len(kernels)} timed in both runs, {count['slower']} slower, {count['faster']} faster"
            + (f", {count['noisy']} too noisy to compare" if count["noisy"] else ""))
    for k in kernels:
        if k["verdict"] in ("slower", "faster"):
            c.print(f"      {TIME_WORDS[k['verdict']]} kernel {escape(k['kernel'])}: {k['a_s'] * 1e6:.1f} us -> "
                    f"{k['b_s'] * 1e6:.1f} us ({k['ratio']:.2f}x)")
