"""The HTML report: `--html DIR` on the commands of HTML_COMMANDS (added to each by
main.guarded), and `tdbg report FOLDER` on an existing debug, run or minify folder.

One mechanism for every command: while it runs, the consoles record what they print and
console.py keeps the command's --json document (written or not); when the command ends — with
any exit code, failures included — `HtmlReport.finish` renders that document into DIR/index.html
with minifier/artifacts/report. The compiler's artifacts (FX, IR, C++, provenance, stage times)
come from DIR/debug/: run, explain and profile compile with the debug traces on, written there;
bisect, whose many runs are not worth tracing, gets one more run of the failing configuration
with traces on once it has found the culprit.
"""
from __future__ import annotations

import os
import sys
import time

import click

from tdbg.cli import common, console
from tdbg.cli.console import doing, err, exit_codes_help, fail

# commands with --html -> how the debug traces are obtained ("env": the command's own compiles
# write them; "rerun": one run of the failing configuration after the command)
# (compare's own compiles realize every node: not the graph the user runs, so none are traced)
HTML_COMMANDS = {"run": "env", "bisect": "rerun", "minify": None, "explain": "env", "profile": "env", "compare": None,
                 "memory": None, "replay": None}
# command -> prefixes of the line the command prints as its verdict (the page's headline);
# None: the first line it printed; a function: the prefixes from the command's document
HEADLINES = {"run": ("FAILED ", "OK "), "bisect": ("Verdict: ",),
             "minify": ("Minified ", "Not reproduced: ", "Flaky: ", "error: "), "explain": None, "profile": None,
             "compare": lambda doc: (doc.get("message") or "",), "memory": ("OVER ", "within "),
             # replay: the first failing graph's line, else the first OK one
             "replay": lambda doc: ("FAILED ",) if any(g.get("status") != "ok" for g in doc.get("graphs") or [])
             else ("OK ",)}
DEBUG_SUBDIR = "debug"
TRACE_ENV = ("TDBG_COMPILE_DEBUG", "TDBG_DEBUG_DIR")   # set while an "env" command runs
_tracing = False    # an "env" command's report is running: the traces are on for the page only


def traces_for_page_only() -> bool:
    """True while --html switched the compiler's debug traces on for its page (the user did not
    set TDBG_COMPILE_DEBUG): the runs keep the compiler's log channel quiet
    (RunRequest.quiet_compiler_log), so --html adds the page and nothing else."""
    return _tracing


def html_option() -> click.Option:
    return click.Option(["--html", "html_dir"], metavar="DIR",
                        help="Also write an HTML report (DIR/index.html: one static page, opens from disk; the "
                             "compiler's debug traces it shows go to DIR/debug/); DIR must be new or empty.")


class HtmlReport:
    """One command's report, started before the command's work and finished after it."""

    def __init__(self, command: str, html_dir: str, params: dict):
        self.command, self.html_dir, self.params = command, html_dir, params
        self.saved_env: dict = {}
        self.debug_dir = os.path.abspath(os.path.join(html_dir, DEBUG_SUBDIR))
        words = [params.get("script") or params.get("target") or "", *(params.get("args") or ())]
        self.command_line = common.command_line(["tdbg", command, *[w for w in words if w]])

    @classmethod
    def start(cls, command: str, html_dir: str, params: dict) -> "HtmlReport":
        """Check DIR (new or empty, writable: before any work), record the consoles and switch
        the compiler's debug traces on for commands whose compiles are traced."""
        common.check_output_dir(html_dir, "--html")
        report = cls(command, html_dir, params)
        console.record(True)
        if HTML_COMMANDS.get(command) == "env":
            # the command's children build their config from the environment (config.from_env);
            # the caller's values come back in finish (a test's CliRunner shares this process)
            report.saved_env = {k: os.environ.get(k) for k in TRACE_ENV}
            global _tracing
            # off as compiler/config.py's _flag reads it (importing the config here would import torch)
            _tracing = (os.environ.get("TDBG_COMPILE_DEBUG") or "").strip().lower() in ("", "0", "false", "no", "off")
            os.environ.update(TDBG_COMPILE_DEBUG="1", TDBG_DEBUG_DIR=report.debug_dir)
        return report

    def finish(self, code) -> None:
        """Render the page from the command's document; a page that cannot be written is one
        error line (the command's own exit code stands)."""
        transcript = console.recorded()
        console.record(False)
        global _tracing
        _tracing = False
        for key, value in self.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        doc = console.last_document() or {"schema": f"tdbg.{self.command}", "version": 1, "status": "error",
                                          "exit_code": code, "error": _last_error(transcript)}
        try:
            verdict, extra_dirs = self._artifacts(doc)
            from tdbg.minifier.artifacts import report
            html = report.build(doc, command=self.command, command_line=self.command_line,
                                headline=headline(self.command, transcript, doc), transcript=transcript,
                                debug_dirs=(*_named_debug_dirs(doc), *extra_dirs, self.debug_dir), verdict=verdict)
            path = report.write(self.html_dir, html)
        except OSError as e:
            err().print(f"[bold red]error:[/] --html {self.html_dir}: the report could not be written "
                        f"({e.strerror or e}).", markup=True, highlight=False)
            return
        err().print(f"HTML report: {path}", markup=False, highlight=False)

    def _artifacts(self, doc: dict):
        """(run verdict, debug folders) from one more run of the failing configuration, for
        commands whose own runs are not traced (bisect); (None, ()) otherwise."""
        if HTML_COMMANDS.get(self.command) != "rerun" or doc.get("first_failing_backend") != "inductor" \
                or not doc.get("script"):
            return None, ()
        from tdbg.minifier.runs.runner import RunRequest, run_script
        env = dict((doc.get("reproduce") or {}).get("env") or {})
        request = RunRequest(script=doc["script"], argv=list(doc.get("argv") or []), backend="inductor",
                             check_accuracy=True, env=env, capture=True, timeout=self.params.get("timeout"),
                             config_changes={"debug": True, "debug_dir": self.debug_dir})
        err().print("HTML report: one more run of the failing configuration, with the compiler's debug traces on",
                    markup=False, highlight=False)
        with doing(f"the traced run of {doc['script']} for the HTML report"):
            verdict = run_script(request)
        return verdict, tuple(d for d in [verdict.get("debug_dir")] if d)


def _named_debug_dirs(doc: dict) -> list:
    return [d for d in ((doc.get("verdict") or {}).get("debug_dir"), doc.get("debug_dir")) if d and os.path.isdir(d)]


def _last_error(transcript: dict) -> str:
    lines = [ln for ln in (transcript.get("stderr") or "").splitlines() if ln.startswith("error:")]
    return lines[-1][len("error:"):].strip() if lines else ""


def headline(command: str, transcript: dict, doc: dict) -> str:
    """The verdict line exactly as the command printed it (stdout first, then stderr)."""
    prefixes = HEADLINES.get(command)
    if callable(prefixes):
        prefixes = tuple(p for p in prefixes(doc) if p) or None
    for stream in ("stdout", "stderr"):     # with --json -, the report went to stderr
        lines = [ln for ln in (transcript.get(stream) or "").splitlines() if ln.strip()]
        if prefixes is None and lines:
            return lines[0]
        for line in lines:
            if prefixes and line.startswith(prefixes):
                return line
    errors = [ln for ln in (transcript.get("stderr") or "").splitlines() if ln.startswith("error:")]
    return errors[-1] if errors else ""


@click.command(epilog=exit_codes_help())
@click.argument("folder", type=click.Path())
@click.option("--html", "html_dir", metavar="DIR",
              help="Where to write index.html (default tdbg_report/<time>/); must be new or empty.")
def report(folder, html_dir):
    """Write the HTML report of an existing FOLDER: a compiler debug folder (tdbg_debug/, one
    run_*/ in it, or one graph's folder), a folder holding a tdbg --json document (with the debug
    folder it names), a `tdbg run --save-io` folder, or a `tdbg minify` output folder.
    """
    if not os.path.isdir(folder):
        fail(f"{folder!r} is not a folder; give a debug folder (tdbg_debug/...), a run --save-io or minify "
             "output folder, or a folder holding a tdbg --json document.", "bad_input")
    html_dir = html_dir or _new_report_dir()
    common.check_output_dir(html_dir, "--html")
    from tdbg.minifier.artifacts import report as pages
    try:
        doc, debug_dirs = pages.folder_document(folder)
    except ValueError as e:
        fail(f"{e}; nothing to report.", "bad_input")
    summary = doc.get("summary") or ""
    command = doc.get("schema", "tdbg.folder").split(".", 1)[1]
    html = pages.build(doc, command=command, command_line=common.command_line(["tdbg", "report", folder]),
                       headline=summary, debug_dirs=debug_dirs)
    try:
        path = pages.write(html_dir, html)
    except OSError as e:
        fail(f"--html {html_dir}: the report could not be written ({e.strerror or e}).", "usage")
    console.out().print(f"HTML report: {path}", markup=False, highlight=False)
    if summary:
        console.out().print(summary, markup=False, highlight=False)
    sys.stdout.flush()


def _new_report_dir() -> str:
    stamp, n = time.strftime("%Y%m%d-%H%M%S"), 1
    path = os.path.join("tdbg_report", stamp)
    while os.path.exists(path):
        n += 1
        path = os.path.join("tdbg_report", f"{stamp}-{n}")
    return path
