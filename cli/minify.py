"""`tdbg minify`: shrink a failing graph to the smallest one that fails the same way."""
from __future__ import annotations

import os

import click

from tdbg.cli import common
from tdbg.cli.console import err, exit_code, exit_codes_help, fail, out, write_json

JSON_SCHEMA, JSON_VERSION = "tdbg.minify", 1
# session status -> exit code name
STATUS_CODES = {"minified": "ok", "flaky": "not_reproduced", "no_failure": "not_reproduced",
                "different": "not_reproduced"}
# event kinds shown as plain lines (FAIL lines stay in minify.jsonl: there are many)
PLAIN_EVENTS = ("check", "signature", "started", "granularity", "strategy", "success", "done")


@click.command(epilog=exit_codes_help())
@click.argument("target", type=click.Path())
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS]...")
@click.option("--after", type=click.Choice(["dynamo", "aot"]), default="aot", show_default=True,
              help="SCRIPT mode: capture the graph Dynamo made (any backend) or the aten graph after AOTAutograd.")
@click.option("--level", type=click.IntRange(1, 4), default=2, show_default=True,
              help="SCRIPT mode: 1-2 catch compile/run errors, 3 dump every graph before compiling (segfaults), "
                   "4 also compare with eager (accuracy).")
@click.option("--backend", default="inductor", show_default=True,
              help="SCRIPT mode: eager, aot_eager, inductor, torch:NAME, module:function or file.py:function.")
@click.option("--out", "out_dir", metavar="DIR", help="Output directory (default tdbg_repro/<time>/); must be new or empty.")
@click.option("--check-str", metavar="TEXT", help="Only failures whose message contains TEXT count.")
@click.option("--tolerance", type=float, help="Accuracy: rtol = atol = this for every float dtype.")
@click.option("--ignore-non-fp", is_flag=True, help="Accuracy: skip non-floating-point outputs.")
@click.option("--timeout", type=float, default=60.0, show_default=True, metavar="SECONDS",
              help="Per query: a candidate running longer counts as a hang. SCRIPT mode: the capture run gets 10x.")
@click.option("--max-queries", type=int, metavar="N", help="Stop shrinking after N queries.")
@common.json_option
def minify(target, args, after, level, backend, out_dir, check_str, tolerance, ignore_non_fp, timeout,
           max_queries, json_path):
    """Shrink a failing graph and write standalone repro files.

    TARGET is a minifier_launcher.py / repro.py (or the directory holding one), or a SCRIPT: then
    the script runs (ARGS after --) with every torch.compile using --backend under the repro
    dumper (--after, --level), and the failing graph it captures, with its real inputs, is
    minified. Writes repro.py, minifier_launcher.py, inputs/ and minify.jsonl (every query) into
    one new directory.
    """
    from tdbg.minifier.artifacts.repro import check_out_dir, is_dump_file, new_run_dir
    out_dir = out_dir or new_run_dir()
    try:
        check_out_dir(out_dir)
    except FileExistsError as e:
        fail(str(e), "usage")
    dump_mode = os.path.isdir(target) or is_dump_file(target)
    if not dump_mode:
        common.require_script(target)
        common.check_backend(backend)
    from tdbg.minifier.reduce.workers import Pool
    pool = Pool(timeout=timeout)  # warms up while the dump loads or the script runs
    payload = {"target": target, "mode": "dump" if dump_mode else "script", "out_dir": out_dir}
    if dump_mode:
        dump = _load(target)
    else:
        dump, payload["capture"] = _capture(target, list(args), after, level, backend, out_dir, timeout)
    for key, value in (("tolerance", tolerance), ("ignore_non_fp", ignore_non_fp or None)):
        if value is not None:
            dump.spec[key] = value
    if tolerance is not None or ignore_non_fp:
        dump.spec["check_accuracy"] = True
    try:
        report = _minify(dump, out_dir, check_str, timeout, max_queries, pool)
    finally:
        pool.close()
    code = exit_code(STATUS_CODES[report.status])
    if json_path != "-":  # stdout then carries only the JSON document
        _render(report, out_dir)
    write_json(json_path, {**payload, "exit_code": code, **report.to_dict()}, JSON_SCHEMA, JSON_VERSION)
    raise SystemExit(code)


def _load(target: str):
    from tdbg.minifier.artifacts.repro import load
    try:
        return load(target)
    except (OSError, ValueError, KeyError, SyntaxError) as e:
        fail(f"cannot read the repro in {target}: {type(e).__name__}: {e}", "bad_input")


def _capture(script, args, after, level, backend, out_dir, timeout):
    """Run the script under the dumper; the Dump of the failing graph (or exit with the verdict)."""
    from tdbg.minifier.runs.runner import RunRequest, run_script
    cfg = common.base_config()
    verdict = None
    for lvl in (level, 3) if level < 3 else (level,):
        request = RunRequest(script=script, argv=args, backend=backend, config_json=cfg.to_json(),
                             repro={"after": after, "level": lvl, "out_dir": os.path.abspath(out_dir)},
                             timeout=timeout * 10, capture=True)
        with err().status(f"Running {script} with --after {after} --level {lvl} to capture the failing graph"):
            verdict = run_script(request)
        dump = _captured(out_dir, verdict)
        if dump is not None or verdict.get("stage") not in ("crash", "timeout"):
            break
    if dump is None:
        _no_dump(verdict, script, out_dir)
    return dump, {"stage": verdict.get("stage"), "status": verdict.get("status"),
                  "error": (verdict.get("error") or {}).get("message")}


def _captured(out_dir: str, verdict: dict):
    """The dump to minify: the failing graph's files, else (a crash) the last graph dumped before
    compiling that still fails."""
    from tdbg.minifier.artifacts.repro import find_file, load
    if verdict.get("status") != "failed" or not os.path.isdir(out_dir):
        return None
    try:
        return load(find_file(out_dir))
    except FileNotFoundError:
        return None


def _no_dump(verdict: dict, script: str, out_dir: str) -> None:
    _cleanup_empty(out_dir)
    if verdict.get("status") == "ok":
        fail(f"{script} ran without a compile failure, so there is nothing to minify (for accuracy "
             "problems use --level 4).", "not_reproduced")
    stage = verdict.get("stage") or "internal"
    message = ((verdict.get("error") or {}).get("message") or "").splitlines()
    detail = f": {message[0]}" if message else ""
    fail(f"{script} failed at stage {stage}{detail}, outside any compiled graph the dumper sees; "
         "nothing to minify (try `tdbg run` for the report, or another --after).",
         stage if stage in ("dynamo", "bad_input", "timeout", "crash") else "backend")


def _cleanup_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _minify(dump, out_dir, check_str, timeout, max_queries, pool):
    from tdbg.minifier.reduce.session import minify_dump
    with _Progress() as progress:
        return minify_dump(dump, out_dir, check_str=check_str, timeout=timeout,
                           on_event=progress.event, max_queries=max_queries, pool=pool)


class _Progress:
    """Event renderer: a live status line on a terminal, plain lines otherwise."""

    def __init__(self):
        self.console = err()
        self.live = self.console.is_terminal
        self.status = None

    def __enter__(self):
        if self.live:
            self.status = self.console.status("Starting the minifier")
            self.status.start()
        return self

    def __exit__(self, *exc):
        if self.status:
            self.status.stop()

    def event(self, e: dict) -> None:
        from rich.markup import escape
        kind, text = e["event"], escape(e["text"])
        if not self.live:
            if kind in PLAIN_EVENTS:
                self.console.print(text)
            return
        if kind in ("strategy", "granularity", "check"):
            self.status.update(text)
        elif kind == "success":
            self.console.print(f"[green]{text}[/]  [dim]({e['strategy']})[/]")
        elif kind in ("started", "signature", "done"):
            self.console.print(text)


def _render(report, out_dir: str) -> None:
    from rich.markup import escape
    c = out()
    if report.status == "no_failure":
        c.print(f"[bold yellow]Not reproduced:[/] the graph did not fail ({escape(report.first.summary())}).")
        return
    if report.status == "different":
        c.print(f"[bold yellow]Not reproduced:[/] the dump recorded {escape(report.signature.describe())}, "
                f"but the graph now gives {escape(report.first.summary())}.")
        return
    if report.status == "flaky":
        c.print("[bold yellow]Flaky:[/] the failure did not happen the same way twice, so it was not minified.")
        c.print(f"  first run:  {escape(report.first.summary())}")
        c.print(f"  second run: {escape(report.second.summary())}")
        return
    r = report.result
    c.print(f"[bold]Minified[/] {r.original.num_nodes} -> {r.minimized.num_nodes} nodes, "
            f"{r.original.num_inputs} -> {r.minimized.num_inputs} inputs in {report.seconds:.1f} s "
            f"({r.stats.queries} queries, {r.stats.cache_hits} cached)")
    c.print(f"Failure: {escape(report.final.report())}")
    from tdbg.minifier.artifacts.graph_io import forward_source
    c.print("\n" + escape(forward_source(r.minimized.gm.graph)))
    c.print(f"Wrote {escape(out_dir)}/: repro.py, minifier_launcher.py, inputs/, minify.jsonl")
    c.print(f"Next: python {escape(os.path.join(out_dir, 'repro.py'))}")
