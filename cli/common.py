"""Pieces shared by `tdbg run`, `bisect` and `explain`: script arguments, config, verdict words.

Torch-free at import time (these modules are imported to build `--help`).
"""
from __future__ import annotations

import shlex
from typing import Optional

import click

from tdbg.cli.console import fail, verdict_exit_code

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
    """SCRIPT and the script's own arguments (after `--`). SCRIPT is checked by `require_script`
    (not by click), so a missing file and a directory get the same `bad_input` answer."""
    fn = click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS]...")(fn)
    return click.argument("script", type=click.Path())(fn)


OWN = "own"   # backends.OWN, spelled here so --help imports no library module
BACKEND_HELP = ("own (the default): each torch.compile call's own backend, mode and options, as the script "
                "runs them; or one backend for every call, replacing the script's: eager, aot_eager, inductor "
                "(tdbg's compiler; also spelled tdbg, as in torch.compile(backend=\"tdbg\")), torch:NAME "
                "(torch:inductor is PyTorch's Inductor), module:function or file.py:function.")


def canonical_backend(ctx, param, value):
    """click callback of every --backend: `tdbg` becomes `inductor`, the one name of tdbg's compiler
    that the command's code, its suggestions and its JSON use (names.BACKEND_ALIASES)."""
    from tdbg.minifier.runs.names import canonical_backend as canonical
    return canonical(value)


def backend_option(extra: str = ""):
    """--backend, the same default (the script's own) and words in every command."""
    return click.option("--backend", default="own", show_default=True, metavar="NAME", callback=canonical_backend,
                        help=BACKEND_HELP + (" " + extra if extra else ""))


def backend_label(name) -> str:
    """A backend as output names it (names.backend_label: tdbg's compiler is never a bare "inductor")."""
    from tdbg.minifier.runs.names import backend_label as label
    return label(name)


def frame_label(frame) -> str:
    """A Dynamo frame as output names it: a resume function by its user function (names.frame_label)."""
    from tdbg.minifier.runs.names import frame_label as label
    return label(frame)


def json_option(fn):
    return click.option("--json", "json_path", metavar="PATH",
                        help="Also write the result as JSON (versioned schema; '-' for stdout).")(fn)


def timeout_option(default: Optional[float]):
    return click.option("--timeout", type=click.FloatRange(0, min_open=True), default=default, show_default=True,
                        metavar="SECONDS", help="Kill a run that takes longer (verdict: timeout); more than 0.")


def require_script(script: str) -> None:
    """Fail (bad_input) unless `script` is an existing Python file that parses."""
    import os
    from tdbg.minifier.runs.runner import check_script
    problem = f"{script!r} is a directory, not a script." if os.path.isdir(script) else check_script(script)
    if problem:
        fail(problem + " Give the path of a Python script that calls torch.compile.", "bad_input")


def check_backend(name: str) -> None:
    from tdbg.minifier.runs.backends import BackendError, check_name
    try:
        check_name(name)
    except BackendError as e:
        fail(str(e), "bad_input")


def base_config(**changes):
    """The user's tdbg config (TDBG_* environment) with the command's changes; a malformed
    variable fails with `bad_input`, as in every command (see check_environment)."""
    from tdbg.compiler import config
    try:
        return config.from_env().replace(**changes)
    except ValueError as e:
        fail(config_problem(e), "bad_input")


def config_problem(e: ValueError) -> str:
    return (f"tdbg's configuration from the environment is not usable: {e}. Fix or unset that variable "
            "(`env | grep ^TDBG_` lists them).")


def check_environment(backend: Optional[str]) -> None:
    """Before any work, in every command: the TDBG_* environment (TDBG_CONFIG, TDBG_INJECT_BUG,
    TDBG_REPRO_AFTER/LEVEL, ...) must parse, and when `backend` runs tdbg's compiler the compile
    cache folder must be writable (for `own`, which may or may not, only a folder the user named).
    Fails with `bad_input` naming the variable (torch-free: only the config module is imported)."""
    from tdbg.compiler import config
    try:
        cfg = config.from_env()
        config.repro_from_env()
    except ValueError as e:
        fail(config_problem(e), "bad_input")
    named = _cache_dir_named()
    if backend == "inductor" or (backend == OWN and named):
        _check_cache_dir(cfg.cache_dir, named or "the default cache folder (TDBG_CACHE_DIR unset)")


def _cache_dir_named() -> Optional[str]:
    """Where the user named tdbg's cache folder, or None (the default folder)."""
    import os
    return ("TDBG_CACHE_DIR" if os.environ.get("TDBG_CACHE_DIR") else
            "cache_dir of TDBG_CONFIG" if '"cache_dir"' in os.environ.get("TDBG_CONFIG", "") else None)


def _check_cache_dir(path: str, named: str) -> None:
    problem = _unwritable_dir(path)
    if problem:
        fail(f"{named} {path}: {problem}; tdbg's compiler keeps its built kernels there. Point TDBG_CACHE_DIR "
             "at a folder this user can write.", "bad_input")


def stage_exit_code(verdict: dict) -> int:
    """The exit code for a verdict (console.verdict_exit_code, the one mapping)."""
    return verdict_exit_code(verdict)


def command_line(words) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


# failure stage -> the repro level that captures it (see `tdbg minify --help`); other compiler stages: 2
MINIFY_LEVEL = {"accuracy": 4, "crash": 3, "timeout": 3}
# stages with nothing a minifier can capture: the script's own failure (every checked call matched
# eager), Dynamo's capture, bad input, tdbg's own bug
NOT_MINIFIABLE = ("script", "dynamo", "bad_input", "internal", None)
# a backend whose own compile after AOTAutograd is where a failure at these stages lies, so
# `--after aot` captures the failing aten graph; an accuracy failure may come from AOTAutograd
# itself (its aten graph already wrong, as in PyTorch #162151) unless bisect saw the previous layer pass
AFTER_AOT = {"inductor": ("lowering", "scheduling", "cpp_build", "kernel_runtime", "accuracy", "crash", "timeout"),
             "torch:inductor": ("lowering", "scheduling", "cpp_build", "kernel_runtime")}


def minify_command(script: str, args, backend: str, stage: Optional[str], *, layer_checked: bool = False):
    """The `tdbg minify` command line that captures a failure of `backend` at `stage`, or None when
    no minify fits the case (NOT_MINIFIABLE). `layer_checked`: bisect saw every layer below
    `backend` pass, so its failure lies in its own compile. The backend is always named: a
    suggestion must not depend on minify's default."""
    if stage in NOT_MINIFIABLE:
        return None
    aot = stage in AFTER_AOT.get(backend, ()) or (layer_checked and backend in AFTER_AOT and stage != "aot_autograd")
    words = ["tdbg", "minify", script, "--after", "aot" if aot else "dynamo", "--level",
             str(MINIFY_LEVEL.get(stage, 2)), "--backend", backend]
    return command_line(words + (["--", *args] if args else []))


def script_words(script: str, args) -> list:
    return [script, *(["--", *args] if args else [])]


def never_compiled_message(script: str) -> str:
    return (f"{script} ran to completion but never called torch.compile (nor torch._dynamo.optimize), "
            "so there is nothing to debug. Wrap the model or function in torch.compile(...) and run again.")


def compiled_nothing_message(script: str, calls: int) -> str:
    from tdbg.minifier.runs.own_backend import NO_GRAPH_REASON
    return (f"{script} called torch.compile {calls} time(s), but Dynamo compiled no graph from what it was "
            f"given, so nothing was compared with eager. {NO_GRAPH_REASON}. Compile a function or a module "
            "of your own (whose forward calls torch's modules) and run again.")


def nothing_to_check(verdict: dict, script: str) -> Optional[str]:
    """Why a run that finished without a failure checked nothing (it never called torch.compile, or
    its calls compiled no graph), or None when it compiled something. Such a run is bad input,
    never an OK: every command that reports on the script's graphs asks this first."""
    if verdict.get("status") != "ok":
        return None
    calls = verdict.get("compile_calls")
    if calls == 0:
        return never_compiled_message(script)
    if calls and verdict.get("graphs") == []:     # the runner's list of compiled graphs, empty
        return compiled_nothing_message(script, calls)
    return None


def check_output_file(path: Optional[str], option: str) -> None:
    """Before any work: fail (usage) unless `path` (a file tdbg will write; '-' is stdout) can
    be created or replaced — it is not a directory, its folder exists, and a file can really be
    made there (tried, then removed: permission bits say nothing for root or for /proc)."""
    import os
    if not path or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        fail(f"{option} {path}: that is a directory; give a file path.", "usage")
    if not os.path.isdir(folder):
        fail(f"{option} {path}: the folder {folder} does not exist.", "usage")
    problem = _probe(folder) or (_probe_append(path) if os.path.exists(path) else None)
    if problem:
        fail(f"{option} {path}: cannot be written ({problem}).", "usage")


def check_output_dir(path: Optional[str], option: str, *, must_be_empty: bool = True) -> None:
    """Before any work: fail (usage) unless `path` (a folder tdbg will create or fill) can be
    made and written, and — with `must_be_empty` — holds nothing a user made (tdbg never
    overwrites)."""
    import os
    if not path:
        return
    if os.path.isdir(path) and must_be_empty and os.listdir(path):
        fail(f"{option} {path}: the folder exists and is not empty; tdbg never overwrites files. "
             "Choose another folder or remove it first.", "usage")
    problem = _unwritable_dir(path)
    if problem:
        fail(f"{option} {path}: {problem}.", "usage")


def _unwritable_dir(path: str) -> Optional[str]:
    """Why files cannot be written in folder `path` (made if missing), or None when they can."""
    import os
    if os.path.exists(path) and not os.path.isdir(path):
        return "exists and is not a folder"
    if os.path.isdir(path):
        problem = _probe(path)
        return f"not writable ({problem})" if problem else None
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"cannot be created ({parent} is not a folder)"
    problem = _probe(parent)
    return f"cannot be created in {parent} ({problem})" if problem else None


def _probe(folder: str) -> Optional[str]:
    """None when a file can be created in `folder` (one is made and removed), else the OS's reason."""
    import os
    import tempfile
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".tdbg-probe-")
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    os.unlink(name)
    return None


def _probe_append(path: str) -> Optional[str]:
    """None when the existing file `path` can be opened for writing (its contents stay as they are)."""
    try:
        with open(path, "a"):
            return None
    except OSError as e:
        return e.strerror or str(e)


def script_or_backend_problem(script: str, backend: str) -> Optional[str]:
    """The one-paragraph problem with SCRIPT or --backend, or None (for commands that must write
    their JSON document even on bad input, so they cannot simply `fail`)."""
    from tdbg.minifier.runs.backends import BackendError, check_name
    from tdbg.minifier.runs.runner import check_script
    problem = check_script(script)
    if problem:
        return problem + " Give the path of a Python script that calls torch.compile."
    try:
        check_name(backend)
    except BackendError as e:
        return str(e)
    return None


def ran_backend(verdict: dict, backend: str):
    """The one backend that compiled: --backend's, or the script's own when all its compile calls
    asked for the same nameable one; None otherwise."""
    if backend != OWN:
        return backend
    own = verdict.get("compile_backends") or {}
    names = own.get("names") or []
    return names[0] if len(names) == 1 and not own.get("unnamed") else None


def ran_words(verdict: dict, backend: str) -> str:
    """Which backend compiled, in words that never mistake tdbg's compiler for PyTorch's Inductor."""
    if backend != OWN:
        return backend_label(backend)
    rows = (verdict.get("compile_backends") or {}).get("rows") or []
    ran = sorted({r["ran"] for r in rows if r.get("ran")})
    return (", ".join(backend_label(r) for r in ran) or "no backend") + " (the script's own)"


def replaced_lines(verdict: dict, backend: str) -> list:
    """One line per distinct torch.compile call whose own backend, mode or options --backend replaced
    (the child's `compile_backends` record), in every command's words."""
    lines = []
    for row in (verdict.get("compile_backends") or {}).get("rows") or []:
        if row.get("replaced"):
            calls = ", ".join(str(n) for n in row.get("calls") or [])
            lines.append(f"your script asked for {row['asked']} (torch.compile call {calls}); ran "
                         f"{backend_label(row['ran'])} instead (--backend {backend})")
    return lines
