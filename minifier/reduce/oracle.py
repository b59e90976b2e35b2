"""The failure oracle: run a graph the way it failed, say how it failed, and whether that is the
same way as the failure being minified.

`evaluate(gm, inputs, spec)` runs in-process (the workers call it; repro.py runs the same code,
repro_templates/runtime.py): eager first
(a candidate that fails eagerly is `invalid`, not a compiler failure), then compile, run, and
compare with eager when the spec checks accuracy. A crash or hang cannot be caught in-process;
the worker pool turns those into `crash` (with the signal) and `hang` outcomes.

A `Signature` is fixed from the first failure: the kind, and for exceptions the type and a
normalized key line of the message (paths, addresses and numbers blurred, since they change
as the graph shrinks), for crashes the signal. `--check-str` adds a required substring.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

KINDS = ("pass", "invalid", "cannot_run", "compile_error", "runtime_error", "accuracy", "crash", "hang", "out_of_memory")
FAILURES = KINDS[3:]
# config fields that describe this machine, not the bug: never written into repro files
_MACHINE_FIELDS = ("cache_dir", "debug_dir", "report_path", "debug", "logs", "verbose_logs")


@dataclass
class Outcome:
    kind: str
    exc_type: str = ""
    message: str = ""
    pattern: str = ""
    stage: str = ""
    outputs: tuple = ()
    signal: int = 0
    seconds: float = 0.0
    mismatches: list = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.kind in FAILURES

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Outcome":
        return cls(**{**d, "outputs": tuple(d.get("outputs", ()))})

    def summary(self) -> str:
        """One line: what happened."""
        if self.kind == "accuracy":
            return f"accuracy mismatch in {', '.join(self.outputs)}"
        if self.kind == "crash":
            return f"crash ({_signal_name(self.signal)})" if self.signal else f"crash: {self.message}"
        if self.kind in ("hang", "cannot_run"):
            return f"{self.kind.replace('_', ' ')}: {self.message}"
        if self.kind == "out_of_memory":
            return f"out of memory: {self.message}"
        if self.kind in ("compile_error", "runtime_error", "invalid"):
            return f"{self.kind.replace('_', ' ')}: {self.exc_type}: {self.pattern}"
        return "passed: compiled results match eager" if self.kind == "pass" else self.kind

    def report(self) -> str:
        """The summary and the evidence (first lines of the error, or each mismatch)."""
        lines = [self.summary()]
        if self.kind == "accuracy":
            lines += [f"  {m['output']}: {m['message']}" for m in self.mismatches]
        elif self.message and self.kind not in ("pass",):
            lines += ["  " + line for line in self.message.splitlines()[:20]]
        return "\n".join(lines)


def _signal_name(sig: int) -> str:
    import signal as _signal
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


@dataclass(frozen=True)
class Signature:
    """How the original graph failed; candidates must fail the same way."""
    kind: str
    exc_type: str = ""
    pattern: str = ""
    signal: int = 0
    check_str: str = ""

    @classmethod
    def of(cls, outcome: Outcome, check_str: Optional[str] = None) -> "Signature":
        return cls(outcome.kind, outcome.exc_type, outcome.pattern, outcome.signal, check_str or "")

    def matches(self, o: Outcome) -> bool:
        return _runtime().matches(asdict(self), asdict(o))

    def describe(self) -> str:
        text = Outcome(self.kind, self.exc_type, pattern=self.pattern, signal=self.signal,
                       outputs=("an output",)).summary()
        return text + (f" (containing {self.check_str!r})" if self.check_str else "")

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- exception -> key line
# repro.py carries the same code (repro_templates/runtime.py), so both judge a failure alike.
# It imports torch: loaded on first use, so the CLI can start its workers first.

def _runtime():
    from tdbg.repro_templates import runtime
    return runtime


def key_line(e: BaseException) -> str:
    return _runtime().key_line(e)


def normalize(line: str) -> str:
    return _runtime().normalize(line)


def exception_outcome(kind: str, e: BaseException) -> Outcome:
    return Outcome.from_dict(_runtime().exception_outcome(kind, e))


# ---------------------------------------------------------------- config and backends

def config_fields(cfg) -> dict:
    """The fields of a tdbg Config that differ from the defaults and describe the bug (JSON)."""
    from tdbg.compiler.config import Config
    mine, default = json.loads(cfg.to_json()), json.loads(Config().to_json())
    fields = {k: v for k, v in mine.items() if v != default.get(k) and k not in _MACHINE_FIELDS}
    if "cxx" in fields and "/" in str(fields["cxx"]):
        del fields["cxx"]  # an absolute compiler path is this machine's, not the bug's
    return fields


def make_config(fields: dict):
    from tdbg.compiler import config as tconfig
    return tconfig.from_env().replace(**fields)


def backend_spec(backend: Any, name: Optional[str] = None) -> dict:
    """How a repro file names `backend` (a resolved Backend or a callable; see
    repro_templates/runtime.py): a tdbg or Dynamo backend name; a user backend's module, whose
    files are copied beside repro.py and imported from there (so its helpers come along); or,
    for a function defined in the script being run (importing the script would run it again),
    the function's source."""
    fn = getattr(backend, "compiler_fn", backend)
    if name and (":" not in name or name.startswith("torch:")):
        return {"kind": "named", "name": name}
    head, _, attr = (name or "").rpartition(":")
    if "_late_lookup" in getattr(fn, "__qualname__", ""):
        return _script_spec(fn.__name__) or _function_spec(_script_function(fn))
    if head.endswith(".py") and os.path.isfile(head):
        return _module_spec(os.path.splitext(os.path.basename(head))[0], attr,
                            os.path.dirname(os.path.abspath(head)), [os.path.basename(head)])
    if head:
        found = _module_files(head)
        if found:
            return _module_spec(head, attr, *found)
    return _function_spec(fn)


def _script_spec(name: str) -> Optional[dict]:
    """A backend defined in the running script, saved with the script's definitions (imports,
    functions, classes, assignments that build no data: literals, aot_autograd(...),
    functools.partial(...), and the assignments of the names the backend reads: _needed_names),
    so its module-level helpers come along; None if `name` is not among them."""
    import ast
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        with open(path) as f:
            text = f.read()
        tree = ast.parse(text)
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    needed = _needed_names(tree, name)
    kept, names = [], set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kept.append(node)
            names |= {a.asname or a.name.split(".")[0] for a in getattr(node, "names", [])} | {getattr(node, "name", "")}
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets) \
                and (_builds_no_data(node.value) or {t.id for t in node.targets} & needed):
            kept.append(node)
            names |= {t.id for t in node.targets}
    if name not in names:
        return None
    source = "\n\n\n".join(ast.get_source_segment(text, n) for n in kept) + "\n"
    return {"kind": "source", "name": name, "source": source}


def _needed_names(tree, name: str) -> set:
    """The module-level names the backend `name` reads, through the statements that define them
    (a logger, a setting read from the environment, the instance of a backend class): their
    assignments are kept whatever they call, since the backend cannot run without them."""
    import ast
    defines: dict = {}
    for node in tree.body:
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)] \
            if isinstance(node, ast.Assign) else [getattr(node, "name", None)]
        for target in targets:
            if target:
                defines.setdefault(target, []).append(node)
    needed, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current in needed:
            continue
        needed.add(current)
        for node in defines.get(current, ()):
            todo += [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in defines]
    return needed


# calls an assignment may make and still be kept in a saved script backend: they build backends
_BACKEND_BUILDERS = ("aot_autograd", "partial")


def _builds_no_data(value) -> bool:
    import ast
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called not in _BACKEND_BUILDERS:
                return False
    return True


def _script_function(fn: Any) -> Any:
    """A backend defined in the running script (backends._late_lookup): the function itself."""
    found = getattr(sys.modules.get("__main__"), fn.__name__, None)
    return found if callable(found) else fn


def _module_spec(module: str, attr: str, root: str, files: list) -> dict:
    return {"kind": "import", "module": module, "attr": attr, "files": files, "root": root}


def _module_files(module: str) -> Optional[tuple]:
    """(import root, files relative to it) of a module and the packages above it; None when it
    has no source file (builtins, extensions)."""
    import importlib.util
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin or not found.origin.endswith(".py"):
        return None
    parts = module.split(".")
    depth = len(parts) + (1 if os.path.basename(found.origin) == "__init__.py" else 0)
    root = os.path.abspath(found.origin)
    for _ in range(depth):
        root = os.path.dirname(root)
    files = [os.path.join(*parts[:i], "__init__.py") for i in range(1, len(parts))]
    files.append(os.path.relpath(os.path.abspath(found.origin), root))
    return root, files


def _function_spec(fn: Any) -> dict:
    import inspect
    import textwrap
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module not in ("__main__",) and "<" not in qual and "." not in qual:
        found = _module_files(module)
        if found and getattr(sys.modules.get(module), qual, None) is fn:
            return _module_spec(module, qual, *found)
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        if "<" not in qual and "." not in qual:
            return {"kind": "source", "name": qual, "source": source}
    except (OSError, TypeError):
        pass
    return {"kind": "unavailable", "repr": repr(fn)[:200]}


# ---------------------------------------------------------------- evaluation

def evaluate(gm, inputs: list, spec: dict, *, graph_name: str = "repro") -> Outcome:
    """Run `gm` eagerly and compiled per `spec` (runtime.evaluate, what repro.py runs): the
    outcome; never raises for graph failures. A backend that cannot be loaded is `cannot_run`."""
    from tdbg.minifier.diagnose import accuracy
    folder = (spec.get("backend") or {}).get("root") or os.getcwd()
    return Outcome.from_dict(_runtime().evaluate(gm, inputs, spec, folder, accuracy))
