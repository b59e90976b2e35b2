"""The failure oracle: run a graph the way it failed, say how it failed, and whether that is the
same way as the failure being minified.

`evaluate(gm, inputs, spec)` runs in-process (the workers and `repro.py` call it): eager first
(a candidate that fails eagerly is `invalid`, not a compiler failure), then compile, run, and
compare with eager when the spec checks accuracy. A crash or hang cannot be caught in-process;
the worker pool turns those into `crash` (with the signal) and `hang` outcomes.

A `Signature` is fixed from the first failure: the kind, and for exceptions the type and a
normalized key line of the message (paths, addresses and numbers blurred, since they change
as the graph shrinks), for crashes the signal. `--check-str` adds a required substring.
"""
from __future__ import annotations

import importlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

KINDS = ("pass", "invalid", "compile_error", "runtime_error", "accuracy", "crash", "hang", "out_of_memory")
FAILURES = KINDS[2:]
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
        if self.kind == "hang":
            return f"hang: {self.message}"
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
        if o.kind != self.kind:
            return False
        if self.check_str and self.check_str not in o.message:
            return False
        if self.kind in ("compile_error", "runtime_error"):
            return o.exc_type == self.exc_type and o.pattern == self.pattern
        if self.kind == "crash":
            return o.signal == self.signal
        return True

    def describe(self) -> str:
        text = Outcome(self.kind, self.exc_type, pattern=self.pattern, signal=self.signal,
                       outputs=("an output",)).summary()
        return text + (f" (containing {self.check_str!r})" if self.check_str else "")

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- exception -> key line

def _cpp_key(e) -> str:
    lines = [l for l in getattr(e, "full_stderr", getattr(e, "stderr", "")).splitlines() if "error:" in l]
    return lines[0][lines[0].index("error:"):] if lines else ""


# exception class name -> the line that identifies the failure (default: first line of str(e))
KEY_LINE = {
    "CppCompileError": _cpp_key,
    "LoweringError": lambda e: getattr(e, "short", ""),
    "KernelRuntimeError": lambda e: getattr(e, "short", ""),
    "BackendCompilerFailed": lambda e: key_line(getattr(e, "inner_exception", None) or e.__cause__),
}


def key_line(e: BaseException) -> str:
    if e is None:
        return ""
    custom = KEY_LINE.get(type(e).__name__)
    line = custom(e) if custom else ""
    if not line:
        line = next((l.strip() for l in str(e).splitlines() if l.strip()), "")
    return normalize(line)


def normalize(line: str) -> str:
    line = re.sub(r"(?:[A-Za-z]:)?(?:/[^\s:'\"()]+)+", "<path>", line)
    line = re.sub(r"0x[0-9a-fA-F]+", "<addr>", line)
    return re.sub(r"\d+", "N", line)[:300]


def exception_outcome(kind: str, e: BaseException) -> Outcome:
    inner = getattr(e, "inner_exception", None) if type(e).__name__ == "BackendCompilerFailed" else None
    e = inner or e
    return Outcome(kind, type(e).__name__, _trim(str(e)), key_line(e), getattr(e, "stage", ""))


def _trim(text: str, max_lines: int = 40) -> str:
    lines = text.splitlines()
    return "\n".join(lines[:max_lines] + ([f"... ({len(lines) - max_lines} more lines)"] if len(lines) > max_lines else []))


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


_BACKENDS: dict = {}


def resolve_backend(spec: dict, cfg):
    """A Dynamo backend callable from a backend spec (see `backend_spec`)."""
    key = json.dumps(spec, sort_keys=True) + cfg.to_json()
    if key not in _BACKENDS:
        _BACKENDS[key] = _RESOLVERS[spec["kind"]](spec, cfg)
    return _BACKENDS[key]


def _named(spec, cfg):
    from tdbg.minifier.runs.backends import resolve
    return resolve(spec["name"], cfg).compiler_fn


def _imported(spec, cfg):
    module, _, attr = spec["ref"].partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _from_source(spec, cfg):
    import torch
    namespace = {"torch": torch, "__name__": "tdbg_repro_backend"}
    exec(compile(spec["source"], f"<backend {spec['name']}>", "exec"), namespace)
    return namespace[spec["name"]]


def _unavailable(spec, cfg):
    raise RuntimeError(f"the backend {spec.get('repr', '?')} could not be saved with the repro "
                       "(no importable name, no source); pass it to `tdbg minify --backend`")


_RESOLVERS = {"named": _named, "import": _imported, "source": _from_source, "unavailable": _unavailable}


def backend_spec(backend: Any, name: Optional[str] = None) -> dict:
    """How a repro file names `backend`: a tdbg backend name, an import, or its source."""
    import inspect
    import textwrap
    if name and (":" not in name or name.startswith("torch:")):
        return {"kind": "named", "name": name}
    fn = getattr(backend, "compiler_fn", backend)
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    module, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__" and "<" not in qual:
        try:
            if _imported({"ref": f"{module}:{qual}"}, None) is fn:
                return {"kind": "import", "ref": f"{module}:{qual}"}
        except Exception:
            pass
    try:
        source = textwrap.dedent(inspect.getsource(fn))
        if "<" not in qual and "." not in qual:
            return {"kind": "source", "name": qual, "source": source}
    except (OSError, TypeError):
        pass
    return {"kind": "unavailable", "repr": repr(fn)[:200]}


# ---------------------------------------------------------------- evaluation

def evaluate(gm, inputs: list, spec: dict, *, graph_name: str = "repro") -> Outcome:
    """Run `gm` eagerly and compiled per `spec`; the outcome (never raises for graph failures).

    spec: {"after": "aot"|"dynamo", "backend": backend spec (dynamo), "config": config fields,
           "check_accuracy": bool, "tolerance": float|None, "ignore_non_fp": bool}
    """
    from tdbg.compiler import config as tconfig
    start = time.perf_counter()
    cfg = make_config(spec.get("config", {}))
    try:
        expected = gm(*_fresh(inputs))
    except Exception as e:
        return _timed(exception_outcome("invalid", e), start)
    try:
        with tconfig.use(cfg):
            compiled = _compile(gm, inputs, spec, cfg, graph_name)
    except Exception as e:
        return _timed(exception_outcome("compile_error", e), start)
    try:
        with tconfig.use(cfg):
            actual = compiled(*_fresh(inputs))
    except Exception as e:
        return _timed(exception_outcome("runtime_error", e), start)
    if spec.get("check_accuracy"):
        outcome = _accuracy(gm, inputs, expected, actual, spec)
        if outcome is not None:
            return _timed(outcome, start)
    return _timed(Outcome("pass"), start)


def _compile(gm, inputs, spec, cfg, graph_name):
    if spec.get("after", "aot") == "aot":
        from tdbg.compiler import compile_aten
        _propagate_meta(gm, inputs)
        return compile_aten(gm, _fresh(inputs), cfg, graph_name=graph_name, kind="inference")
    backend = resolve_backend(spec["backend"], cfg)
    return backend(gm, _fresh(inputs))


def _propagate_meta(gm, inputs) -> None:
    """node.meta["val"] (fake tensors), as AOTAutograd's graphs carry them for the compiler."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(x) if hasattr(x, "dtype") else x
                                         for x in _fresh(inputs)])


def _accuracy(gm, inputs, expected, actual, spec) -> Optional[Outcome]:
    from tdbg.minifier.diagnose.accuracy import compare, fp64_reference
    opts = {"tolerance": spec.get("tolerance"), "ignore_non_fp": bool(spec.get("ignore_non_fp"))}
    if not compare(expected, actual, **opts):
        return None
    found = compare(expected, actual, fp64_reference(gm, _fresh(inputs)), **opts)
    if not found:
        return None
    message = "\n".join(f"{m.output}: {m.message}" for m in found)
    return Outcome("accuracy", "", message, "", "accuracy", tuple(m.output for m in found),
                   mismatches=[m.to_dict() for m in found])


def _fresh(inputs: list) -> list:
    import torch
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            out.append(y.requires_grad_(True) if x.requires_grad else y)
        else:
            out.append(x)
    return out


def _timed(outcome: Outcome, start: float) -> Outcome:
    outcome.seconds = time.perf_counter() - start
    return outcome
