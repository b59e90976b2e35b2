"""Repro files: render `repro.py` / `minifier_launcher.py` from repro_templates/, load them back,
and `reproduce` (what a repro.py runs).

A dump directory holds the two files and `inputs/<sha256>.bin`. Files name their inputs relative
to their own location, carry no absolute paths and no environment variables, and record only
the compiler settings that differ from the defaults (e.g. an injected bug), so the directory
can be moved or mailed.
"""
from __future__ import annotations

import datetime
import functools
import os
import platform
import pprint
import string
import subprocess
from dataclasses import dataclass, field
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
    from tdbg.minifier.artifacts.graph_io import imports_for, module_source
    spec = dump.spec
    fields = {
        "title": dump.title, "failure": dump.failure.replace("\n", " "),
        "tdbg_version": _version("tdbg"), "torch_version": _version("torch"),
        "python_version": platform.python_version(), "cxx_version": cxx_version(spec),
        "imports": imports_for(dump.case.gm.graph),
        "module": module_source(dump.case.gm.graph).rstrip("\n"),
        "after": spec.get("after", "aot"), "after_repr": repr(spec.get("after", "aot")),
        "backend": _literal(spec.get("backend")), "config": _literal(spec.get("config", {})),
        "check": _literal({k: spec.get(k) for k in ("check_accuracy", "tolerance", "ignore_non_fp")}),
        "expected": _literal(dump.expected),
        "inputs": _inputs_literal(dump.case.inputs),
    }
    return template(name).substitute(fields)


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
    dump.store.save(dump.case.inputs, out_dir)
    paths = []
    for name in files:
        path = os.path.join(out_dir, name)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(render(name, dump))
        os.replace(tmp, path)
        paths.append(path)
    return paths


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
        exec(compile(f.read(), path, "exec"), namespace)
    return from_namespace(path, namespace)


def from_namespace(path: str, ns: dict) -> Dump:
    from tdbg.minifier.artifacts.graph_io import Case, InputSpec, TensorStore, trace_module
    store = TensorStore()
    specs = tuple(InputSpec(name, sha, tuple(shape), tuple(stride), f"torch.{dtype}" if dtype else "",
                            requires_grad, value)
                  for name, sha, shape, stride, dtype, requires_grad, value in ns["INPUTS"])
    store.load(specs, os.path.dirname(os.path.abspath(path)))
    gm = trace_module(ns["Repro"]())
    check = ns.get("CHECK", {})
    spec = {"after": ns["AFTER"], "backend": ns.get("BACKEND"), "config": ns.get("CONFIG", {}), **check}
    return Dump(Case(gm, specs), store, spec, ns.get("EXPECTED"), path=path)


def reproduce(file: str, namespace: dict) -> tuple:
    """(Outcome, exit code) of running a repro file's graph in this process, as it failed."""
    from tdbg.cli.console import exit_code
    from tdbg.minifier.reduce.oracle import Signature, evaluate
    dump = from_namespace(file, namespace)
    outcome = evaluate(dump.case.gm, dump.store.values(dump.case.inputs), dump.spec)
    if not outcome.failed:
        return outcome, 0
    if dump.expected and not Signature(**dump.expected).matches(outcome):
        outcome.message = (f"(this is not the recorded failure: "
                           f"{Signature(**dump.expected).describe()})\n" + outcome.message)
    return outcome, exit_code(failure_code(outcome))


# outcome kind -> exit code name when the error carries no stage of its own
_KIND_CODES = {"accuracy": "accuracy", "crash": "crash", "hang": "timeout",
               "compile_error": "backend", "runtime_error": "backend", "invalid": "bad_input"}


def failure_code(outcome) -> str:
    from tdbg.cli.console import EXIT_CODES
    if outcome.stage in EXIT_CODES and outcome.kind in ("compile_error", "runtime_error"):
        return outcome.stage
    return _KIND_CODES.get(outcome.kind, "internal")

