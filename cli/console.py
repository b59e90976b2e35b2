"""Everything tdbg shows a user goes through here: consoles, exit codes, error rendering, JSON.

Exit codes are one table, documented in README and in `tdbg --help`.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, NoReturn, Optional

# name -> (code, meaning). A script's own failure unrelated to compilation keeps its own code.
EXIT_CODES = {
    "ok": (0, "success"),
    "usage": (2, "bad command line (click's own usage errors)"),
    "bad_input": (3, "the script or file given does not exist, does not parse, or never calls torch.compile"),
    "dynamo": (10, "Dynamo failed to capture the program"),
    "aot_autograd": (11, "AOTAutograd failed (tracing, decompositions, partitioning)"),
    "lowering": (12, "the compiler could not lower an FX node"),
    "scheduling": (13, "the compiler's scheduler or an IR check failed"),
    "cpp_build": (14, "the generated C++ did not compile"),
    "kernel_runtime": (15, "a compiled kernel failed while running"),
    "accuracy": (16, "a compiled graph's results differ from eager"),
    "crash": (17, "a process died from a signal (segfault, abort)"),
    "timeout": (18, "a run took longer than its timeout"),
    "backend": (19, "a backend failed in a way no more precise stage describes"),
    "threshold": (20, "a CI threshold was exceeded (graph breaks, recompiles, ...)"),
    "not_reproduced": (21, "the failure did not happen, or did not happen the same way twice"),
    "internal": (70, "a bug in tdbg itself"),
}


def exit_code(name: str) -> int:
    return EXIT_CODES[name][0]


def exit_codes_help() -> str:
    """Text block for --help epilogs (click keeps \\b paragraphs unwrapped)."""
    rows = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_CODES.values())
    return "\b\nExit codes:\n" + rows + "\n  other: the script's own exit code when it fails for reasons unrelated to compilation"


_out = None
_err = None


def out():
    """The stdout console (rich), created on first use."""
    global _out
    if _out is None:
        from rich.console import Console
        _out = Console(highlight=False, soft_wrap=True)
    return _out


def report_to_stderr() -> None:
    """Send what out() prints to stderr (with `--json -`, stdout carries only the JSON document)."""
    global _out
    _out = err()


def err():
    global _err
    if _err is None:
        from rich.console import Console
        _err = Console(stderr=True, highlight=False, soft_wrap=True)
    return _err


def fail(message: str, code: str = "bad_input") -> NoReturn:
    """Print a one-paragraph error and exit with the named code."""
    from rich.markup import escape
    err().print(f"[bold red]error:[/] {escape(message)}")
    sys.exit(exit_code(code))


def write_json(path: Optional[str], payload: dict, schema: str, version: int = 1) -> None:
    """Write a versioned JSON document: {"schema": ..., "version": ..., ...payload}."""
    if not path:
        return
    doc = {"schema": schema, "version": version, **payload}
    text = json.dumps(doc, indent=2, sort_keys=False, default=str)
    if path == "-":
        sys.stdout.write(text + "\n")
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


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
