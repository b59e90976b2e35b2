"""Repro files: render `repro.py` / `minifier_launcher.py` from repro_templates/ and load them back.

A dump directory holds the two files, `inputs/<sha256>.bin`, and a user backend's module files
(copied beside repro.py and imported from there, so the backend's helpers come along). Files
name their inputs relative to their own location, carry no absolute paths and no environment
variables, and record only the compiler settings that differ from the defaults (e.g. an
injected bug), so the directory can be moved or mailed. repro.py carries tdbg's repro runtime
(repro_templates/runtime.py) and accuracy check verbatim: for a `torch:*` backend it needs only
torch.
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import os
import platform
import pprint
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Optional

# graph_io (torch) is imported inside the functions: the CLI checks paths and starts its warm
# workers before paying for torch in its own process.

REPRO, LAUNCHER = "repro.py", "minifier_launcher.py"
TEMPLATES = {REPRO: "repro.py.tmpl", LAUNCHER: "minifier_launcher.py.tmpl"}


@dataclass
class Dump:
    """Everything a repro file holds."""
    case: "Case"  # noqa: F821
    store: "TensorStore"  # noqa: F821
    spec: dict                 # compile spec (oracle.evaluate)
    expected: Optional[dict] = None   # Signature.to_dict() of the failure, when known
    title: str = "a failing compiled graph"
    failure: str = "unknown"
    path: str = ""             # file it was loaded from
    extra: dict = field(default_factory=dict)


def template(name: str) -> string.Template:
    return string.Template(resources.files("tdbg.repro_templates").joinpath(TEMPLATES[name]).read_text())


def render(name: str, dump: Dump) -> str:
    """File text; a template field without a value raises KeyError (never a silent blank)."""
    from tdbg.minifier.artifacts.graph_io import dynamic_table, imports_for, module_source
    spec = dump.spec
    fields = {
        "title": dump.title, "failure": dump.failure.replace("\n", " "),
        "tdbg_version": _version("tdbg"), "torch_version": _version("torch"),
        "python_version": platform.python_version(), "cxx_version": cxx_version(spec),
        "imports": imports_for(dump.case.gm.graph),
        "module": module_source(dump.case.gm.graph).rstrip("\n"),
        "after": spec.get("after", "aot"), "after_repr": repr(spec.get("after", "aot")),
        "backend": _literal(portable_backend(spec.get("backend"))), "aot": _literal(spec.get("aot")),
        "config": _literal(spec.get("config", {})), "needs": _needs(spec),
        "accuracy_source": _source("tdbg.minifier.diagnose", "accuracy.py"),
        "runtime_source": _source("tdbg.repro_templates", "runtime.py"),
        "check": _literal(_check(spec)),
        "expected": _literal(dump.expected),
        "inputs": _inputs_literal(dump.case.inputs),
        "constants": _inputs_literal(dump.case.constants),
        "dynamic": _literal(dynamic_table(dump.case.inputs)),
    }
    return template(name).substitute(fields)


def portable_backend(backend: Optional[dict]) -> Optional[dict]:
    """The backend spec as a file records it: without the folder it was imported from here."""
    return {k: v for k, v in backend.items() if k != "root"} if backend else backend


def _needs(spec: dict) -> str:
    from tdbg.repro_templates.runtime import uses_tdbg
    backend = spec.get("backend") or {}
    if uses_tdbg(spec):
        return "torch and tdbg (tdbg's own compiler builds the graph)"
    files = backend.get("files") or []
    return "only torch" + (f" (and {', '.join(files)}, copied beside it)" if files else "")


def _source(package: str, name: str) -> str:
    """A module's text for embedding mid-file (a __future__ import is only legal at the top)."""
    text = resources.files(package).joinpath(name).read_text()
    return "\n".join(line for line in text.splitlines() if line != "from __future__ import annotations").strip("\n")


def _literal(value) -> str:
    return pprint.pformat(value, width=100, sort_dicts=True)


def _inputs_literal(specs) -> str:
    rows = [f"    ({s.name!r}, {s.sha!r}, {tuple(s.shape)!r}, {tuple(s.stride)!r}, "
            f"{s.dtype.replace('torch.', '')!r}, {s.requires_grad!r}, {s.value!r}),"
            for s in specs]
    return "[\n" + "\n".join(rows) + "\n]" if rows else "[]"


def _version(dist: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.lru_cache(maxsize=None)
def _cxx_first_line(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=10).stdout
        return out.splitlines()[0] if out else f"{cxx} (no version)"
    except (OSError, subprocess.SubprocessError):
        return f"{cxx} (not found)"


def cxx_version(spec: dict) -> str:
    cxx = spec.get("config", {}).get("cxx", "g++")
    return _cxx_first_line(os.path.basename(cxx))


def write(out_dir: str, dump: Dump, files=(REPRO, LAUNCHER)) -> list:
    """Write the chosen files and the inputs into out_dir (created if needed); their paths."""
    os.makedirs(out_dir, exist_ok=True)
    dump.store.save(dump.case.inputs + dump.case.constants, out_dir)
    copy_backend_files(dump.spec.get("backend"), out_dir)
    paths = []
    for name in files:
        path = os.path.join(out_dir, name)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(render(name, dump))
        os.replace(tmp, path)
        paths.append(path)
    return paths


def copy_backend_files(backend: Optional[dict], out_dir: str) -> None:
    """Copy a user backend's module files (relative to its import root) into out_dir."""
    if not backend or not backend.get("files") or not backend.get("root"):
        return
    for rel in backend["files"]:
        src, dst = os.path.join(backend["root"], rel), os.path.join(out_dir, rel)
        if os.path.abspath(src) == os.path.abspath(dst):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(src, dst)


def new_run_dir(parent: str = "tdbg_repro") -> str:
    """A fresh tdbg_repro/<time>/ path (not created)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path, n = os.path.join(parent, stamp), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(parent, f"{stamp}-{n}")
    return path


def check_out_dir(path: str) -> None:
    """Refuse an existing non-empty directory (we never overwrite a user's files)."""
    if os.path.isdir(path) and os.listdir(path):
        raise FileExistsError(f"output directory {path} already exists and is not empty; "
                              "choose another with --out or remove it first")
    if os.path.exists(path) and not os.path.isdir(path):
        raise FileExistsError(f"output path {path} exists and is not a directory")


# ---------------------------------------------------------------- running it as a user does

@dataclass
class UserRun:
    """What `python repro.py` did when run as a user runs it (`run_as_user`)."""
    code: Optional[int]        # exit code; None when it did not finish within the timeout
    lines: list                # its first output lines (stdout, then stderr)
    seconds: float
    cwd: str                   # the folder it ran from (removed afterwards)
    timeout: float

    def describe(self) -> str:
        if self.code is None:
            return f"did not finish within {self.timeout:g} s"
        return f"exited with code {self.code}"

    def to_dict(self) -> dict:
        return asdict(self)


FIRST_LINES = 8
# What a fresh interpreter runs to stand for `python repro.py`: it imports torch (the first
# thing every repro.py does, and most of its start-up), then reads stdin: "warm NAME" lines import
# modules the file's backend will import anyway ("module:function" also calls a once-per-process
# probe it will run anyway), while the minifier is still working; "run PATH"
# runs the file as __main__ with the argv and sys.path[0] that `python PATH` gives; anything else
# exits 0, and so does EOF, removing the folder first: EOF before "run" means the minifier is gone
# (killed: it could not remove the folder itself). Nothing of tdbg's minifier is imported
# beforehand: the file must bring what it needs. After the file, gc.freeze() spares the exit's
# cyclic collections (about a second with torch and Dynamo loaded), which the minifier waits for.
_FRESH_MAIN = """
import contextlib, gc, importlib, os, runpy, shutil, sys
import torch
for line in iter(sys.stdin.readline, ""):
    command, _, arg = line.rstrip("\\n").partition(" ")
    if command == "warm":   # "module" or "module:function" (called with no arguments)
        with contextlib.suppress(Exception):   # the file imports it again, and reports a failure itself
            module, _, function = arg.partition(":")
            value = importlib.import_module(module)
            if function:
                getattr(value, function)()
        continue
    if command != "run":
        break
    sys.argv = [arg]
    sys.path[0] = os.path.dirname(arg)
    try:
        runpy.run_path(arg, run_name="__main__")
    finally:   # as the runner's child does (runner.child_main): atexit and teardown still run
        gc.freeze()
    break
else:
    shutil.rmtree(os.getcwd(), ignore_errors=True)
"""


class FreshInterpreter:
    """A new Python process (this one's executable and environment, cwd a new empty folder
    elsewhere) that will run one file as a user runs it: `run(path)`. Started ahead of time so
    its imports (torch, and the modules the file will import anyway: `warm`, `warm_modules`)
    overlap other work; `close()` ends it if it was never used (closing twice is harmless)."""

    def __init__(self, warm=()):
        self.cwd = tempfile.mkdtemp(prefix="tdbg-repro-check-")
        # its own process group: on a timeout the repro and the child it forks are killed together
        self.proc = subprocess.Popen([sys.executable, "-c", _FRESH_MAIN], cwd=self.cwd,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)
        self.warm(warm)

    def warm(self, modules) -> None:
        """Have it import `modules` now (before `run`); a dead interpreter is left to `run`."""
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write("".join(f"warm {name}\n" for name in modules))
            self.proc.stdin.flush()

    def run(self, path: str, timeout: float) -> UserRun:
        """`python path` in this interpreter; a cold one when this one died before its turn."""
        start = time.perf_counter()
        if self.proc.poll() is not None:   # e.g. killed: not the file's doing, so never its verdict
            self.close()
            return run_as_user(path, timeout)
        try:
            stdout, stderr = self.proc.communicate(f"run {os.path.abspath(path)}\n", timeout=timeout)
            code = self.proc.returncode
        except subprocess.TimeoutExpired:
            self._kill()
            stdout, stderr = self.proc.communicate()
            code = None
        except BaseException:   # Ctrl-C: its own session never saw it
            self.close()
            raise
        lines = [line for line in ((stdout or "") + (stderr or "")).splitlines() if line.strip()][:FIRST_LINES]
        run = UserRun(code, lines, time.perf_counter() - start, self.cwd, timeout)
        self.close()
        return run

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def close(self) -> None:
        if self.proc.poll() is None:
            self._kill()
        with contextlib.suppress(OSError, ValueError):
            self.proc.communicate(timeout=10)
        shutil.rmtree(self.cwd, ignore_errors=True)


def warm_modules(spec: dict) -> tuple:
    """Modules a repro of `spec` imports while it compiles (its backend's), for FreshInterpreter."""
    from tdbg.repro_templates.runtime import aot_of, uses_tdbg
    name = (spec.get("backend") or {}).get("name", "")
    after_aot = spec.get("after", "aot") == "aot"
    inductor = name == "torch:inductor" or (after_aot and aot_of(spec)["family"] == "torch:inductor")
    # Dynamo (seconds to import) only where the repro uses it: torch:* names, fake tensors after aot
    dynamo = after_aot or name.startswith("torch:")
    from tdbg.minifier.runs.inductor_hooks import WARM_CALLS, WARM_MODULES
    return (("torch._dynamo",) * dynamo + (WARM_MODULES + WARM_CALLS) * inductor
            + ("tdbg.compiler",) * uses_tdbg(spec))


def run_as_user(path: str, timeout: float) -> UserRun:
    """Run `python path` the way its reader will: a fresh interpreter (this one's executable and
    environment), from a new empty folder elsewhere, so nothing of the minifier's process (warm
    imports, Inductor's state, the working directory, sys.path) can stand in for what the file
    itself carries. Never raises for the file's own failures; they are in the result."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tdbg-repro-check-") as cwd:
        proc = subprocess.Popen([sys.executable, os.path.abspath(path)], cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            code = None
        except BaseException:   # Ctrl-C: its own session never saw it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        text = (stdout or "") + (stderr or "")
    lines = [line for line in text.splitlines() if line.strip()][:FIRST_LINES]
    return UserRun(code, lines, time.perf_counter() - start, cwd, timeout)


# ---------------------------------------------------------------- loading

def find_file(path: str) -> str:
    """The launcher (else repro.py) in a dump directory, or the file itself."""
    if os.path.isdir(path):
        for name in (LAUNCHER, REPRO):
            if os.path.isfile(os.path.join(path, name)):
                return os.path.join(path, name)
        graphs = sorted((d for d in os.listdir(path) if d.startswith("graph_") and d[6:].isdigit()),
                        key=lambda d: int(d[6:]))
        if graphs:  # a level-3 run that died: the last graph dumped before compiling
            return find_file(os.path.join(path, graphs[-1]))
        raise FileNotFoundError(f"{path} holds neither {LAUNCHER} nor {REPRO}")
    return path


def is_dump_file(path: str) -> bool:
    try:
        with open(path) as f:
            head = f.read(200)
    except OSError:
        return False
    return "# tdbg repro:" in head or "# tdbg minifier launcher:" in head


def load(path: str) -> Dump:
    """Read a repro.py / minifier_launcher.py (or a directory holding one) back into a Dump."""
    path = find_file(path)
    namespace = {"__name__": "tdbg_loaded_repro", "__file__": os.path.abspath(path)}
    with open(path) as f:
        exec(compile(f.read(), path, "exec", dont_inherit=True), namespace)
    return from_namespace(path, namespace)


def _check(spec: dict) -> dict:
    """The file's CHECK: how results are compared, and the grad mode a Dynamo graph runs under."""
    check = {k: spec.get(k) for k in ("check_accuracy", "check_grads", "tolerance", "ignore_non_fp")}
    for key in ("grad_enabled", "call"):
        if key in spec:
            check[key] = spec[key]
    return check


def from_namespace(path: str, ns: dict) -> Dump:
    from tdbg.minifier.artifacts.graph_io import Case, TensorStore, trace_module, with_constants
    store = TensorStore()
    specs, constants = _specs(ns["INPUTS"], ns.get("DYNAMIC", {})), _specs(ns.get("CONSTANTS", []))
    store.load(specs + constants, os.path.dirname(os.path.abspath(path)))
    gm = trace_module(with_constants(ns["Repro"](), constants, store))
    check = ns.get("CHECK", {})
    backend = ns.get("BACKEND")
    if backend and backend.get("kind") == "import":   # imported from the dump's own folder
        backend = dict(backend, root=os.path.dirname(os.path.abspath(path)))
    spec = {"after": ns["AFTER"], "backend": backend, "config": ns.get("CONFIG", {}), **check}
    if ns.get("AOT"):
        spec["aot"] = ns["AOT"]
    return Dump(Case(gm, specs, constants), store, spec, ns.get("EXPECTED"), path=path)


def _specs(rows, dynamic=None) -> tuple:
    from tdbg.minifier.artifacts.graph_io import InputSpec
    dynamic = dynamic or {}
    return tuple(InputSpec(name, sha, tuple(shape), tuple(stride), f"torch.{dtype}" if dtype else "",
                           requires_grad, value, tuple(dynamic.get(name) or ()))
                 for name, sha, shape, stride, dtype, requires_grad, value in rows)
