"""`tdbg minify`: shrink a failing graph to the smallest one that fails the same way."""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import NoReturn, Optional

import click
from rich.markup import escape

from tdbg.cli import common
from tdbg.cli.console import err, exit_code, exit_codes_help, out, verdict_exit_code, write_json

JSON_SCHEMA, JSON_VERSION = "tdbg.minify", 1
# session status -> exit code name
STATUS_CODES = {"minified": "ok", "flaky": "not_reproduced", "no_failure": "not_reproduced",
                "different": "not_reproduced", "cannot_run": "bad_input",
                # Every query reproduced the failure, but the repro.py tdbg wrote does not (run as a
                # user runs it): the failure is real, tdbg's file is wrong, so it is tdbg's bug
                # (internal, 70). Not 21: "not reproduced" would tell the user there is no bug to
                # chase; not 0: a success would hand over a file that lies.
                "repro_failed": "internal"}
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
@common.backend_option("SCRIPT mode only.")
@click.option("--out", "out_dir", metavar="DIR", help="Output directory (default tdbg_repro/<time>/); must be new or empty.")
@click.option("--check-str", metavar="TEXT", help="Only failures whose message contains TEXT count.")
@click.option("--tolerance", type=click.FloatRange(min=0, min_open=True), help="Accuracy: rtol = atol = this for every float dtype.")
@click.option("--ignore-non-fp", is_flag=True, help="Accuracy: skip non-floating-point outputs.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=60.0, show_default=True, metavar="SECONDS",
              help="Per query: a candidate running longer counts as a hang. SCRIPT mode: the capture run gets 10x.")
@click.option("--max-queries", type=click.IntRange(min=1), metavar="N", help="Stop shrinking after N queries.")
@click.option("--memory-limit", metavar="SIZE", callback=lambda ctx, param, value: _memory_limit(value),
              help="Per query: memory a candidate may allocate beyond the warm worker (4G, 512M, 25%, "
                   "none); past it the query is out_of_memory. Default: half the RAM.")
@common.json_option
def minify(target, args, after, level, backend, out_dir, check_str, tolerance, ignore_non_fp, timeout,
           max_queries, memory_limit, json_path):
    """Shrink a failing graph and write standalone repro files.

    TARGET is a minifier_launcher.py / repro.py (or the directory holding one), or a SCRIPT: then
    the script runs (ARGS after --) with every torch.compile using --backend under the repro
    dumper (--after, --level), and the failing graph it captures, with its real inputs, is
    minified. Writes repro.py, minifier_launcher.py, inputs/ and minify.jsonl (every query) into
    one new directory.
    """
    from tdbg.minifier.artifacts.repro import is_dump_file, new_run_dir
    from tdbg.minifier.runs.backends import BackendError, check_name
    from tdbg.minifier.runs.runner import check_script
    out_dir = out_dir or new_run_dir()
    common.check_output_file(json_path, "--json")
    dump_mode = os.path.isdir(target) or is_dump_file(target)
    doc = _Document(json_path, {"target": target, "mode": "dump" if dump_mode else "script", "out_dir": out_dir})
    try:
        common.check_output_dir(out_dir, "--out")
    except SystemExit as e:   # the reason is printed; the document records the verdict too
        doc.write(e.code, status="error", error=f"--out {out_dir} cannot be used: it must be a new or empty, "
                                                  "writable folder")
        raise
    if not dump_mode:
        problem = check_script(target)
        if problem:
            doc.fail(problem + " Give the path of a Python script that calls torch.compile.", "bad_input")
        try:
            check_name(backend)
        except BackendError as e:
            doc.fail(str(e), "bad_input")
    made_parent = not os.path.isdir(os.path.dirname(os.path.abspath(out_dir)))
    work = _work_dir(out_dir)
    try:
        code = _run(target, list(args), after, level, backend, work, check_str, tolerance, ignore_non_fp,
                    timeout, max_queries, memory_limit, doc, dump_mode)
        _move_into_place(work, out_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)   # only left when interrupted or failed
        if made_parent:   # e.g. the tdbg_repro/ made for a run that wrote nothing
            _remove_if_empty(os.path.dirname(work))
    raise SystemExit(code)


class _Document:
    """The --json document, written on every path (failures included)."""

    def __init__(self, path, payload: dict):
        self.path, self.payload = path, payload

    def write(self, code: int, **more) -> None:
        write_json(self.path, {**self.payload, "exit_code": code, **more}, JSON_SCHEMA, JSON_VERSION)

    def fail(self, message: str, code_name: str, code: Optional[int] = None) -> NoReturn:
        code = exit_code(code_name) if code is None else code
        self.write(code, status="error", error=message)
        err().print(f"[bold red]error:[/] {escape(message)}")
        raise SystemExit(code)


def _work_dir(out_dir: str) -> str:
    """A hidden folder beside out_dir that becomes out_dir when the minify is done, so an
    interrupted run never leaves a half-written out_dir behind."""
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out_dir))}.partial-", dir=parent)


def _remove_if_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:   # not empty (or not ours to remove): keep it
        pass


def _move_into_place(work: str, out_dir: str) -> None:
    if not os.listdir(work):
        return
    if os.path.isdir(out_dir):
        os.rmdir(out_dir)   # checked empty before any work
    os.rename(work, out_dir)


def _memory_limit(text):
    """--memory-limit: None when not given (the pool's default), else bytes or "none" (no limit)."""
    if text is None:
        return None
    from tdbg.minifier.runs.forkserver import parse_memory_limit
    try:
        return parse_memory_limit(text) or "none"
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _run(target, args, after, level, backend, work, check_str, tolerance, ignore_non_fp, timeout,
         max_queries, memory_limit, doc, dump_mode) -> int:
    from tdbg.minifier.artifacts.repro import FreshInterpreter
    from tdbg.minifier.reduce.workers import Pool
    limit = {} if memory_limit is None else {"memory_limit": None if memory_limit == "none" else memory_limit}
    pool = Pool(timeout=timeout, **limit)  # warms up while the dump loads or the script runs
    fresh = FreshInterpreter()   # the repro.py check's interpreter: imports torch meanwhile too
    try:
        if dump_mode:
            dump = _load(target, doc)
        else:
            dump, doc.payload["capture"] = _capture(target, args, after, level, backend, work, timeout, doc, pool)
        for key, value in (("tolerance", tolerance), ("ignore_non_fp", ignore_non_fp or None)):
            if value is not None:
                dump.spec[key] = value
        if tolerance is not None or ignore_non_fp:
            dump.spec["check_accuracy"] = True
        report = _minify(dump, work, check_str, timeout, max_queries, pool, fresh)
    finally:
        fresh.close()
        pool.close()
    code = exit_code(STATUS_CODES[report.status])
    if doc.path != "-":  # stdout then carries only the JSON document
        _render(report, doc.payload["out_dir"])
    result = report.to_dict()
    # the files are written into the work folder, which becomes out_dir once this returns
    result["files"] = [os.path.join(doc.payload["out_dir"], os.path.relpath(f, work)) for f in report.files]
    doc.write(code, **result)
    return code


def _load(target: str, doc: _Document):
    from tdbg.minifier.artifacts.repro import load
    try:
        return load(target)
    except (OSError, ValueError, KeyError, SyntaxError, ImportError) as e:
        doc.fail(f"cannot read the repro in {target}: {type(e).__name__}: {e}", "bad_input")


def _capture(script, args, after, level, backend, out_dir, timeout, doc, pool):
    """Run the script under the dumper (forked from the query pool's warm server, so torch is
    imported once); the Dump of the failing graph (or exit with the verdict)."""
    from tdbg.minifier.runs.runner import RunRequest, run_script
    cfg = common.base_config()
    # e.g. Inductor imported once in the server the capture forks from (own: torch.compile's default is it)
    pool.prepare("torch:inductor" if backend == common.OWN else backend)
    verdict = None
    for lvl in (level, 3) if level < 3 else (level,):
        request = RunRequest(script=script, argv=args, backend=backend, config_json=cfg.to_json(),
                             repro={"after": after, "level": lvl, "out_dir": os.path.abspath(out_dir)},
                             timeout=timeout * 10, capture=True)
        with err().status(f"Running {script} with --after {after} --level {lvl} to capture the failing graph"):
            verdict = run_script(request, pool=pool.servers)
        dump = _captured(out_dir, verdict, after, doc)
        if dump is not None or verdict.get("stage") not in ("crash", "timeout"):
            break
    capture = {"stage": verdict.get("stage"), "status": verdict.get("status"),
               "error": (verdict.get("error") or {}).get("message"),
               "compile_backends": verdict.get("compile_backends"), "replaced": common.replaced_lines(verdict, backend)}
    for line in capture["replaced"]:
        err().print(f"[bold yellow]replaced:[/] {escape(line)}")
    if dump is None:
        doc.payload["capture"] = capture
        _no_dump(verdict, script, doc, level)
    return dump, capture


def _captured(out_dir: str, verdict: dict, after: str, doc: _Document):
    """The dump to minify: the failing graph's files, else (a crash) the last graph dumped before
    compiling that still fails. A graph whose written source does not read back into the same
    graph is tdbg's limit: exit 70 naming the statement, and the --after that avoids it."""
    from tdbg.minifier.artifacts.repro import find_file, load
    from tdbg.repro_templates.runtime import GraphSourceError
    if verdict.get("status") != "failed" or not os.path.isdir(out_dir):
        return None
    try:
        return load(find_file(out_dir))
    except FileNotFoundError:
        return None
    except (GraphSourceError, ImportError, NameError, AttributeError) as e:
        doc.fail(unreadable_graph_message(e, after), "internal")


def unreadable_graph_message(e: BaseException, after: str) -> str:
    """One paragraph: which statement of the captured graph's source could not be read back and
    what to try instead."""
    detail = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    instead = ("try `--after aot`: the aten graph AOTAutograd makes from it has only aten ops, which "
               "always read back" if after == "dynamo" else "try `--after dynamo`")
    return (f"tdbg captured the failing graph after {after} but cannot read its source back into the "
            f"same graph ({type(e).__name__}: {detail}); this is a limit of tdbg's graph files, not "
            f"a problem of your program: {instead}, and please report the graph to tdbg.")


# error types of the capture run that mean the command line cannot work: the exit code's name
_SETUP_ERRORS = {"NoAotStage": "bad_input", "BackendError": "bad_input"}


# what a capture that found nothing suggests: never the level that was given (level 4 -> its own words)
_NOTHING_CAUGHT = {4: "every checked call of each compiled graph matched eager (the first calls and each new "
                      "input signature; `tdbg run --check-accuracy --check-calls N` checks more)"}
_SCRIPT_FAILED = {4: "every checked call of each compiled graph matched eager (the first calls and each new input "
                     "signature); a later call may differ: `tdbg run --check-accuracy --check-calls N` checks more"}


def _no_dump(verdict: dict, script: str, doc: _Document, level: int = 2) -> NoReturn:
    """No graph was captured: say why, with the code `tdbg run` gives the same verdict."""
    if verdict.get("status") == "ok":
        nothing = common.nothing_to_check(verdict, script)
        if nothing:
            doc.fail(nothing, "bad_input")
        why = _NOTHING_CAUGHT.get(level, "for accuracy problems use --level 4, which compares each graph with eager")
        doc.fail(f"{script} ran without a compile failure, so there is nothing to minify ({why}).", "not_reproduced")
    error = verdict.get("error") or {}
    lines = (error.get("message") or "").splitlines()
    if error.get("type") in _SETUP_ERRORS or verdict.get("stage") == "bad_input":
        doc.fail(" ".join(line.strip() for line in lines), _SETUP_ERRORS.get(error.get("type"), "bad_input"))
    stage = verdict.get("stage") or "internal"
    detail = f": {lines[0]}" if lines else ""
    hint = (_SCRIPT_FAILED.get(level, "when the script failed on a compiled graph's wrong result, use --level 4, "
                                      "which compares each graph with eager") if stage == "script"
            else "try `tdbg run` for the report, or another --after")
    doc.fail(f"{script} failed at stage {stage}{detail}, outside any compiled graph the dumper sees; "
             f"nothing to minify ({hint}).", "internal",
             code=verdict_exit_code(verdict))


def _minify(dump, out_dir, check_str, timeout, max_queries, pool, fresh):
    from tdbg.minifier.reduce.session import minify_dump
    with _Progress() as progress:
        return minify_dump(dump, out_dir, check_str=check_str, timeout=timeout,
                           on_event=progress.event, max_queries=max_queries, pool=pool, fresh=fresh)


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
    if report.status == "cannot_run":
        err().print(f"[bold red]error:[/] the graph cannot be compiled here: {escape(report.first.message)}")
        return
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
    if report.status == "repro_failed":
        _render_repro_failed(report, out_dir)
        return
    r = report.result
    c.print(f"[bold]Minified[/] {r.original.num_nodes} -> {r.minimized.num_nodes} nodes, "
            f"{r.original.num_inputs} -> {r.minimized.num_inputs} inputs in {report.seconds:.1f} s "
            f"({r.stats.queries} queries, {r.stats.cache_hits} cached)")
    c.print(f"Failure: {escape(report.final.report())}")
    from tdbg.minifier.artifacts.graph_io import forward_source, symbolic_text
    c.print("\n" + escape(forward_source(r.minimized.gm.graph)))
    if symbolic_text(r.minimized.inputs):   # repro.py recompiles with these symbols (its DYNAMIC)
        c.print(f"Symbolic sizes (compiled symbolic, as when it failed): {escape(symbolic_text(r.minimized.inputs))}")
    c.print(f"Wrote {escape(out_dir)}/: repro.py, minifier_launcher.py, inputs/, minify.jsonl")
    c.print(f"Checked: repro.py reproduces it in a fresh process from another folder "
            f"(exit {report.repro_run.code}, {report.repro_run.seconds:.1f} s)")
    c.print(f"Next: python {escape(os.path.join(out_dir, 'repro.py'))}")


def _render_repro_failed(report, out_dir: str) -> None:
    """Minified, but the written repro.py does not reproduce from another folder: say what it did."""
    from rich.markup import escape
    r, run = report.result, report.repro_run
    repro = os.path.join(out_dir, "repro.py")
    err().print(f"[bold red]error:[/] minified {r.original.num_nodes} -> {r.minimized.num_nodes} nodes "
                f"({escape(report.final.summary())} in every query), but the written repro.py does not "
                f"reproduce it: `python repro.py` in a fresh process from another folder {escape(run.describe())} "
                f"(expected {report.repro_expected}: the failure reproduced). This is a bug in tdbg's repro files; "
                f"the graph and both files are kept in {escape(out_dir)}/ for a bug report.")
    for line in run.lines:
        err().print(f"  | {escape(line)}")
    err().print(f"  Run it yourself: python {escape(repro)}")
