"""Pieces shared by `tdbg run`, `bisect` and `explain`: script arguments, config, verdict words.

Torch-free at import time (these modules are imported to build `--help`).
"""
from __future__ import annotations

import shlex
from typing import Optional

import click

from tdbg.cli.console import EXIT_CODES, exit_code, fail

# verdict stage -> plain words shown to the user
STAGE_WORDS = {
    "dynamo": "Dynamo could not capture the program",
    "aot_autograd": "AOTAutograd failed (tracing to aten, decompositions, partitioning)",
    "lowering": "the compiler could not lower an FX node",
    "scheduling": "the compiler's scheduler or an IR check failed",
    "cpp_build": "the generated C++ did not compile",
    "kernel_runtime": "a compiled kernel failed while running",
    "accuracy": "a compiled graph's results differ from eager",
    "crash": "the process died from a signal (segfault, abort)",
    "timeout": "the run took longer than its timeout",
    "backend": "the backend failed",
    "script": "the script failed on its own (not while compiling or running a compiled graph)",
    "bad_input": "the input given to tdbg is not usable",
    "internal": "tdbg itself failed (a bug in tdbg)",
}


def script_arguments(fn):
    """SCRIPT and the script's own arguments (after `--`)."""
    fn = click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS]...")(fn)
    return click.argument("script", type=click.Path(dir_okay=False))(fn)


def json_option(fn):
    return click.option("--json", "json_path", metavar="PATH",
                        help="Also write the result as JSON (versioned schema; '-' for stdout).")(fn)


def timeout_option(default: Optional[float]):
    return click.option("--timeout", type=float, default=default, show_default=True, metavar="SECONDS",
                        help="Kill a run that takes longer (verdict: timeout).")


def require_script(script: str) -> None:
    from tdbg.minifier.runs.runner import check_script
    problem = check_script(script)
    if problem:
        fail(problem + " Give the path of a Python script that calls torch.compile.", "bad_input")


def check_backend(name: str) -> None:
    from tdbg.minifier.runs.backends import BackendError, check_name
    try:
        check_name(name)
    except BackendError as e:
        fail(str(e), "bad_input")


def base_config(**changes):
    """The user's tdbg config (TDBG_* environment) with the command's changes."""
    from tdbg.compiler import config
    try:
        return config.from_env().replace(**changes)
    except ValueError as e:
        fail(str(e), "usage")


def stage_exit_code(verdict: dict) -> int:
    """The exit code for a verdict: the stage's code, or the script's own code."""
    stage = verdict.get("stage")
    if verdict.get("status") == "ok":
        return exit_code("ok")
    if stage == "script":
        return verdict.get("exit_code") or 1
    return exit_code(stage if stage in EXIT_CODES else "internal")


def command_line(words) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


def script_words(script: str, args) -> list:
    return [script, *(["--", *args] if args else [])]


def never_compiled_message(script: str) -> str:
    return (f"{script} ran to completion but never called torch.compile (nor torch._dynamo.optimize), "
            "so there is nothing to debug. Wrap the model or function in torch.compile(...) and run again.")


def check_output_file(path: Optional[str], option: str) -> None:
    """Before any work: fail (usage) unless `path` (a file tdbg will write; '-' is stdout) can
    be created or replaced — its folder exists and is writable, and it is not a directory."""
    import os
    if not path or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        fail(f"{option} {path}: that is a directory; give a file path.", "usage")
    if not os.path.isdir(folder):
        fail(f"{option} {path}: the folder {folder} does not exist.", "usage")
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        fail(f"{option} {path}: not writable by this user.", "usage")


def check_output_dir(path: Optional[str], option: str, *, must_be_empty: bool = True) -> None:
    """Before any work: fail (usage) unless `path` (a folder tdbg will create or fill) can be
    made, and — with `must_be_empty` — holds nothing a user made (tdbg never overwrites)."""
    import os
    if not path:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        fail(f"{option} {path}: exists and is not a directory.", "usage")
    if os.path.isdir(path):
        if must_be_empty and os.listdir(path):
            fail(f"{option} {path}: the folder exists and is not empty; tdbg never overwrites files. "
                 "Choose another folder or remove it first.", "usage")
        if not os.access(path, os.W_OK | os.X_OK):
            fail(f"{option} {path}: not writable by this user.", "usage")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        fail(f"{option} {path}: cannot be created ({parent} is not a writable folder).", "usage")
