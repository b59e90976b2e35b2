"""Everything tdbg shows a user goes through here: consoles, exit codes, error rendering, JSON.

Exit codes are one table, documented in README and in `tdbg --help`.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, NoReturn, Optional

# cause -> (code, meaning): the one table of exit codes. Every command maps a cause to its code
# through `exit_code` / `verdict_exit_code` only, so the same problem exits the same way everywhere.
# A script's own failure unrelated to compilation keeps its own code.
EXIT_CODES = {
    "ok": (0, "success"),
    "usage": (2, "bad command line: an unknown option, a value out of range, an output path (--json, "
                 "--trace, --out) that cannot be written"),
    "bad_input": (3, "an input is unusable: the script is missing, a directory, does not parse, never calls "
                     "torch.compile or its torch.compile calls compile no graph; an unknown backend or a "
                     "backend file that fails to import; a malformed TDBG_* variable (TDBG_CONFIG, "
                     "TDBG_INJECT_BUG, ...) or an unwritable TDBG_CACHE_DIR"),
    "dynamo": (10, "Dynamo failed to capture the program"),
    "aot_autograd": (11, "AOTAutograd failed (tracing, decompositions, partitioning)"),
    "lowering": (12, "the compiler could not lower an FX node"),
    "scheduling": (13, "the compiler's scheduler or an IR check failed"),
    "cpp_build": (14, "the generated C++ did not compile"),
    "kernel_runtime": (15, "a compiled kernel failed while running"),
    "accuracy": (16, "a compiled graph's results differ from eager"),
    "crash": (17, "a process died from a signal (segfault, abort) or passed its memory limit"),
    "timeout": (18, "a run took longer than its timeout"),
    "backend": (19, "a backend failed in a way no more precise stage describes"),
    "threshold": (20, "a CI threshold was exceeded (graph breaks, recompiles, memory --max-memory-ratio, ...)"),
    "not_reproduced": (21, "the failure did not happen, or did not happen the same way twice"),
    "changed": (22, "tdbg diff: a graph's structure or outputs changed beyond tolerance between the two runs"),
    "nondeterministic": (24, "tdbg run --check-determinism: a compiled graph gave different bits on two runs of the "
                             "same inputs"),
    "internal": (70, "a bug in tdbg itself"),
    "interrupted": (130, "interrupted (Ctrl-C); child processes were stopped"),
}


def exit_code(name: str) -> int:
    """The code of a cause named in EXIT_CODES (a KeyError for a name not in the table)."""
    return EXIT_CODES[name][0]


def verdict_exit_code(verdict: dict) -> int:
    """The exit code of a run verdict ({status, stage, script_exit_code, compile_calls}), the same
    in every command: ok -> 0, but a run that never called torch.compile is bad input; stage
    `script` -> the script's own code (1 when it raised); a stage in the table -> its code;
    anything else -> internal (an unknown stage is tdbg's bug, never a silent 0)."""
    stage = verdict.get("stage")
    if verdict.get("status") == "ok":
        return exit_code("bad_input" if verdict.get("compile_calls") == 0 else "ok")
    if stage == "script":
        return verdict.get("script_exit_code") or 1
    return exit_code(stage if stage in EXIT_CODES and stage != "ok" else "internal")


def exit_codes_help() -> str:
    """Text block for --help epilogs (click keeps \\b paragraphs unwrapped)."""
    import textwrap
    rows = "\n".join(textwrap.fill(meaning, HELP_WIDTH, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7)
                     for code, meaning in EXIT_CODES.values())
    return ("\b\nExit codes:\n" + rows + "\n  other: the script's own exit code when it fails for reasons "
            "unrelated to compilation")


HELP_WIDTH = 96    # the exit-code rows are kept unwrapped by click, so they are wrapped here


_out = None
_err = None
_activity: list = []    # what the command is doing now, innermost last (named when Ctrl-C stops it)


@contextlib.contextmanager
def doing(what: str):
    """Name the step a command is in (e.g. "the compiled run of x.py"), so an interrupt can say
    what it stopped; `now_doing` renames it as the step advances."""
    depth = len(_activity)
    _activity.append(what)
    try:
        yield
    finally:
        del _activity[depth:]


def now_doing(what: str) -> None:
    """Rename the innermost `doing` step (no-op outside one)."""
    if _activity:
        _activity[-1] = what


def current_activity() -> Optional[str]:
    return _activity[-1] if _activity else None


# Width of a console that is not a terminal (a pipe, a CI log, a file): tables size to their
# contents up to this, so names (backends, kernels) stay whole on one line and can be copied;
# a terminal keeps its own width.
PIPE_WIDTH = 1000


def _console(**kwargs):
    """A rich Console that is PIPE_WIDTH wide whenever its file is not a terminal (checked at
    each print: a test's runner or a redirect may swap sys.stdout after it was made)."""
    from rich.console import Console, ConsoleDimensions

    class _Console(Console):
        @property
        def size(self):
            if self._width is None and not self.is_terminal:
                return ConsoleDimensions(PIPE_WIDTH, super().size.height)
            return super().size

        @size.setter
        def size(self, new_size):
            Console.size.fset(self, new_size)

    return _Console(highlight=False, soft_wrap=True, **kwargs)


def out():
    """The stdout console (rich), created on first use."""
    global _out
    if _out is None:
        _out = _console()
    return _out


def report_to_stderr() -> None:
    """Send what out() prints to stderr (with `--json -`, stdout carries only the JSON document)."""
    global _out
    _out = err()


def hush(on: bool = True) -> None:
    """Show nothing more (after Ctrl-C: runs killed on purpose must not be reported as crashes by
    threads still finishing); `hush(False)` lifts it."""
    out().quiet = on
    err().quiet = on


def err():
    global _err
    if _err is None:
        _err = _console(stderr=True)
    return _err


_json_target: Optional[tuple] = None   # (path, schema) of the running command's --json, until written
_last_document: Optional[dict] = None  # the running command's document, written to --json or not (--html reads it)


def last_document() -> Optional[dict]:
    """The document the running command wrote last (write_json, or fail's error document)."""
    return _last_document


def record(on: bool) -> None:
    """Start (clearing what was kept) or stop keeping what the consoles print (for --html)."""
    for console in dict.fromkeys((out(), err())):
        console.record = True      # export_text refuses a console that is not recording
        console.export_text(clear=True)
        console.record = on


def recorded() -> dict:
    """What the consoles printed since record(True): {"stdout": text, "stderr": text}."""
    o, e = out(), err()
    stderr = e.export_text(clear=False) if e.record else ""
    return {"stdout": "" if o is e or not o.record else o.export_text(clear=False), "stderr": stderr}


def json_on_failure(path: Optional[str], schema: str) -> None:
    """Make `fail` write the command's --json document (status "error", the exit code, the
    message) when it stops the command before the command wrote one itself."""
    global _json_target, _last_document
    _json_target, _last_document = (path, schema), None   # path None: the document is only kept (--html)


def fail(message: str, code: str = "bad_input") -> NoReturn:
    """Print a one-paragraph error and exit with the named code (writing the command's --json
    document first when it has none yet: --json gets a document on every path)."""
    global _json_target, _last_document
    from rich.markup import escape
    err().print(f"[bold red]error:[/] {escape(message)}")
    target, _json_target = _json_target, None
    if target is not None:
        _last_document = {"schema": target[1], "version": 1, "status": "error",
                          "exit_code": exit_code(code), "cause": code, "error": message}
        if target[0]:
            _write_quietly(target[0], _last_document)
    sys.exit(exit_code(code))


def _write_quietly(path: str, doc: dict) -> None:
    """Best effort: when --json itself is what failed, the message already says so."""
    text = json.dumps(doc, indent=2) + "\n"
    if path == "-":
        sys.stdout.write(text)
        return
    with contextlib.suppress(OSError):
        with open(path, "w") as f:
            f.write(text)


def write_json(path: Optional[str], payload: dict, schema: str, version: int = 1) -> None:
    """Write a versioned JSON document: {"schema": ..., "version": ..., ...payload}, replacing
    `path` atomically. Commands check the path up front (common.check_output_file); a write that
    still fails (disk full, folder removed meanwhile) is one error line and the `usage` code,
    never a traceback, and leaves no partial file."""
    global _json_target, _last_document
    _json_target = None
    doc = {"schema": schema, "version": version, **payload}
    _last_document = doc
    if not path:
        return
    text = json.dumps(doc, indent=2, sort_keys=False, default=str)
    if path == "-":
        sys.stdout.write(text + "\n")
        return
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        fail(f"--json {path}: the result could not be written ({e.strerror or e}); the report above "
             "is all there is of this run.", "usage")


def render_evidence(evidence: dict[str, Any], title: str) -> None:
    """A failure report: title line, then the evidence fields that are present, in a fixed order."""
    from rich.markup import escape
    c = err()
    c.print(f"[bold red]{escape(title)}[/]")
    order = ("stage", "source", "fx_node", "kernel", "target", "inputs", "command", "source_path",
             "debug_dir", "message")
    for key in order:
        value = evidence.get(key)
        if value in (None, "", [], ()):
            continue
        if isinstance(value, list):
            value = " ".join(map(str, value)) if key == "command" else ", ".join(map(str, value))
        text = str(value)
        if "\n" in text:
            c.print(f"  [bold]{key}:[/]")
            for line in text.splitlines():
                c.print(f"    {escape(line)}")
        else:
            c.print(f"  [bold]{key}:[/] {escape(text)}")
