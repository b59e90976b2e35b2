"""The script's own backend: what each `torch.compile` call asked for, resolved as torch.compile
would resolve it and named as tdbg's command line names backends.

Every tdbg command runs a script as written unless `--backend` says otherwise (the name `own`,
the default). Each compile call's `backend`, `mode` and `options` then decide what compiles its
graphs:

  torch.compile(f)                        torch:inductor (torch.compile's default)
  torch.compile(f, backend="tdbg")        inductor (tdbg's compiler)
  torch.compile(f, backend="NAME")        torch:NAME
  torch.compile(f, backend=my_fn)         SCRIPT.py:my_fn when the running script holds it at
                                          module level, module:function when its module does,
                                          else an unnamed user backend (run, but not nameable)

`mode` and `options` stay with the call: a named backend with either runs through torch's own
wrapper (`torch._TorchCompileWrapper`, for Inductor `_TorchCompileInductorWrapper`), exactly
as `torch.compile` would build it. `CallRecord` is what a run reports per compile call: what
was asked, and what ran (`replaced` when `--backend` overrode it).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional

from tdbg.minifier.runs.backends import OWN, Backend, resolve
MAX_RECORDS = 20          # compile calls reported one by one; a script compiling in a loop is summed up
# why torch.compile calls can compile no graph (a run's verdict with compile_calls > 0 and graphs == [])
NO_GRAPH_REASON = ("Dynamo skips frames of torch's own code (an nn.Linear given to Module.compile by itself "
                   "compiles nothing) and runs frames it cannot trace eagerly")
_DEFAULT_MODES = (None, "default")


@dataclass(frozen=True)
class Asked:
    """One torch.compile call's own choice (backend None: torch.compile's default, Inductor)."""
    backend: Any = None
    mode: Optional[str] = None
    options: Optional[dict] = None

    @property
    def extras(self) -> dict:
        """The mode/options that make this call differ from its backend's defaults."""
        extra = {} if self.mode in _DEFAULT_MODES else {"mode": self.mode}
        if self.options:
            extra["options"] = dict(self.options)
        return extra

    def text(self) -> str:
        """As the user wrote it, `toy_compiler, mode=reduce-overhead`, except that PyTorch's Inductor
        is always `torch:inductor` (`torch:inductor (torch.compile's default)` when none was named):
        a bare "inductor" is tdbg's compiler on the command line."""
        if self.backend is None:
            head = "torch:inductor (torch.compile's default)"
        elif isinstance(self.backend, str):
            head = "torch:inductor" if self.backend == "inductor" else self.backend
        else:
            head = (_main_key(self.backend) or getattr(self.backend, "__name__", None)
                    or type(self.backend).__name__)
        return ", ".join([head] + [f"{k}={v!r}" if k == "options" else f"{k}={v}" for k, v in self.extras.items()])


@dataclass
class CallRecord:
    """What one torch.compile call asked for and what tdbg ran instead (JSON-safe via to_dict)."""
    call: int
    asked: Asked
    name: Optional[str]           # the asked backend as a --backend name (None: cannot be named)
    ran: Optional[str]            # the backend that compiled (None: the run was uncompiled)
    replaced: bool = False
    text: str = ""                # the asked backend in the script's words, taken while the script runs

    def __post_init__(self):
        # the script's module-level names are only reachable while it runs (see _main_key)
        self.text = self.text or self.asked.text()

    def to_dict(self) -> dict:
        return {"call": self.call, "asked": self.text, "asked_name": self.name,
                "mode": self.asked.mode, "options": _json_safe(self.asked.options), "ran": self.ran,
                "replaced": self.replaced}


def _json_safe(value):
    if value is None:
        return None
    return {str(k): (v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)) for k, v in value.items()}


def name_of(asked: Asked, script: Optional[str]) -> Optional[str]:
    """The --backend name of the asked backend, or None when no name reaches it (a lambda, a
    closure, an object made inside a function)."""
    b = asked.backend
    if b is None or b == "inductor":
        return "torch:inductor"
    if isinstance(b, str):
        return "inductor" if b == "tdbg" else f"torch:{b}"
    key = _main_key(b)
    if script and key:
        return f"{script}:{key}"
    module, attr = getattr(b, "__module__", None), getattr(b, "__name__", None)
    if module and attr and module != "__main__" and getattr(sys.modules.get(module), attr, None) is b:
        return f"{module}:{attr}"
    return None


def _main_key(obj) -> Optional[str]:
    """The module-level name the running script (__main__) holds `obj` under, if any."""
    main = sys.modules.get("__main__")
    for key, value in list(vars(main).items()) if main is not None else ():
        if value is obj and key.isidentifier() and not key.startswith("__"):
            return key
    return None


def resolve_call(asked: Asked, dynamic, config, script: Optional[str]) -> tuple:
    """(Backend that compiles this call as torch.compile would, its --backend name or None).

    A named backend with no extras is exactly `backends.resolve(name)`, the backend `--backend
    name` runs; extras go through torch's own wrappers."""
    name = name_of(asked, script)
    extras = asked.extras
    if name is not None and not extras:
        return resolve(name, config, script=script), name
    fn = _torch_wrapper(asked, dynamic) if extras else asked.backend
    label = name or asked.text()
    kind = "inductor" if name == "inductor" else ("torch" if name and name.startswith("torch:") else "user")
    return Backend(label, kind, f"the script's own backend {asked.text()}", fn), name


def _torch_wrapper(asked: Asked, dynamic):
    """torch.compile's own wrapper for a backend with mode/options."""
    mode = asked.mode if asked.extras.get("mode") else None
    options = dict(asked.options) if asked.options else None
    if asked.backend in (None, "inductor"):
        from tdbg.minifier.runs.inductor_hooks import TorchCompileInductorWrapper
        return TorchCompileInductorWrapper(mode, options, dynamic)
    from tdbg.compiler.torch_compat import TorchCompileWrapper
    return TorchCompileWrapper("tdbg" if asked.backend == "tdbg" else asked.backend, mode, options, dynamic)


def summary(records: list) -> dict:
    """The run's `compile_backends` entry: one row per distinct (asked, ran), with its calls."""
    rows: dict = {}
    for r in records:
        d = r.to_dict()
        key = (d["asked"], d["ran"], d["replaced"])
        row = rows.setdefault(key, dict(d, calls=[]))
        if len(row["calls"]) < MAX_RECORDS:
            row["calls"].append(d["call"])
    out = []
    for row in rows.values():
        row.pop("call", None)
        out.append(row)
    return {"rows": out, "names": sorted({r.name for r in records if r.name}),
            "unnamed": sorted({r.text for r in records if r.name is None})}
