"""The one backend resolver every tdbg command uses.

A backend name is one of:
  own               each torch.compile call's own backend, mode and options (own_backend.py): the
                    script runs as written. The default of every command; `resolve` refuses it
                    (it names no one backend: the child resolves it per compile call).
  eager             Dynamo captures the program; PyTorch runs each FX graph as is.
  aot_eager         Dynamo + AOTAutograd with tdbg's decompositions; PyTorch runs the aten graphs.
  inductor          Dynamo + AOTAutograd + tdbg's own compiler (`tdbg.compiler.make_backend`). Also
                    spelled `tdbg` (its name in `torch.compile(backend="tdbg")`); `canonical` turns
                    that into `inductor`, the one name JSON and suggested commands use.
  torch:NAME        any backend registered with Dynamo (`torch._dynamo.list_backends()`).
  module:function   a user's backend callable, imported from an installed/importable module.
  path.py:function  a user's backend callable defined in a file. When the file is the script being
                    run, the function is looked up in the running script (so it is not executed twice).

Output names a backend through `names.backend_label` ("tdbg's compiler (inductor)"), never a bare
"inductor", which would read as PyTorch's Inductor (`torch:inductor`).

`check_name(name)` validates the spelling without importing torch (for the CLI); `resolve(name,
config)` returns a `Backend` whose `compiler_fn` is a Dynamo backend. Both raise `BackendError`
(a ValueError) with one paragraph that lists the choices, or — for a user backend whose file or
module fails while loading (a syntax error, a failing import) — names the file and line.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional

from tdbg.minifier.runs.names import BACKEND_ALIASES, canonical_backend as canonical  # noqa: F401 - re-exported

# name -> one-line description; the factories live in _FACTORIES (they import torch).
BUILTIN = {
    "eager": "Dynamo capture only; FX graphs run by PyTorch",
    "aot_eager": "Dynamo + AOTAutograd with tdbg's decompositions; run by PyTorch",
    "inductor": "Dynamo + AOTAutograd + tdbg's compiler (generated C++); also spelled tdbg",
}
OWN = "own"
# Order of the backends chain `tdbg bisect` walks: each adds one layer to the previous one.
CHAIN = ("eager", "aot_eager", "inductor")


class BackendError(ValueError):
    """A backend name that cannot be resolved; the message lists the choices."""


@dataclass(frozen=True)
class Backend:
    name: str                 # as the user spelled it
    kind: str                 # eager | aot_eager | inductor | torch | user
    description: str
    compiler_fn: Callable     # a Dynamo backend: (gm, example_inputs) -> callable


def choices_text(registered: Optional[list] = None) -> str:
    text = ("choose one of own (each torch.compile call's own backend, the default), eager, aot_eager, inductor "
            "(tdbg's compiler; also spelled tdbg), torch:NAME (a backend registered with Dynamo; torch:inductor is "
            "PyTorch's Inductor"
            + (f"; registered: {', '.join(registered)}" if registered else "")
            + "), module:function or path/to/file.py:function")
    return text


def nearest(name: str, names, prefix: str = "") -> str:
    """' (did you mean X?)' for the closest of `names` to a misspelled `name`, else ''."""
    import difflib
    close = difflib.get_close_matches(name, list(names), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(prefix + c for c in close)}?)" if close else ""


def check_name(name: str) -> None:
    """Validate the spelling of `name` without importing torch; raise BackendError if wrong."""
    if name in BUILTIN or name in BACKEND_ALIASES or name == OWN:
        return
    head, sep, func = name.rpartition(":")
    if not sep or not head or not func:
        raise BackendError(f"unknown backend {name!r}{nearest(name, [OWN, *BUILTIN, *BACKEND_ALIASES, 'torch:inductor'])}: "
                           f"{choices_text()}.")
    if head == "torch":
        return
    if head.endswith(".py"):
        if not os.path.isfile(head):
            raise BackendError(f"backend {name!r}: file {head!r} does not exist.")
        _check_syntax(head, name)
        return
    if not all(part.isidentifier() for part in head.split(".")) or not func.isidentifier():
        raise BackendError(f"backend {name!r} is not MODULE:FUNCTION or FILE.py:FUNCTION; {choices_text()}.")


def _check_syntax(path: str, name: str) -> None:
    """A backend file that does not parse is refused before anything runs (torch-free)."""
    try:
        with open(path, "rb") as f:
            ast.parse(f.read(), filename=path)
    except SyntaxError as e:
        raise _load_error(name, f"loading {path}", e) from None
    except (OSError, ValueError) as e:
        raise BackendError(f"backend {name!r}: cannot read {path} as Python source ({e}).") from None


def tdbg_decompositions(config=None) -> dict:
    """tdbg's decomposition table for `config` (None: current), as its compiler gives AOTAutograd."""
    from tdbg.compiler import config as tdbg_config
    from tdbg.compiler.decompositions import decomposition_table
    return decomposition_table(config or tdbg_config.current())


def _eager(config) -> Callable:
    def eager(gm, example_inputs):
        return gm.forward
    return eager


def _aot_eager(config) -> Callable:
    from tdbg.compiler.torch_compat import aot_autograd, make_boxed_func

    def nop(gm, example_inputs):
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=nop, bw_compiler=nop, inference_compiler=nop,
                        decompositions=tdbg_decompositions(config))


def _inductor(config) -> Callable:
    from tdbg.compiler import make_backend
    return make_backend(config)


_FACTORIES = {"eager": _eager, "aot_eager": _aot_eager, "inductor": _inductor}


def resolve(name: str, config=None, script: Optional[str] = None) -> Backend:
    """The Backend for `name`; `config` (a tdbg Config, None = current at call time) feeds inductor.

    `script` is the file being run as __main__: a `script.py:function` backend is then looked up
    in `sys.modules["__main__"]` when first called instead of executing the file again.
    """
    check_name(name)
    name = canonical(name)
    if name == OWN:
        raise BackendError("backend 'own' is each torch.compile call's own backend: it is resolved per compile "
                           "call while the script runs, not by name; give the backend to use by its name.")
    if name in BUILTIN:
        return Backend(name, name, BUILTIN[name], _FACTORIES[name](config))
    head, _, func = name.rpartition(":")
    if head == "torch":
        return Backend(name, "torch", f"Dynamo-registered backend {func!r}", _torch_backend(func))
    fn = _from_file(head, func, script) if head.endswith(".py") else _from_module(head, func)
    return Backend(name, "user", f"user backend {func} from {head}", fn)


def _torch_backend(func: str) -> Callable:
    import torch

    from tdbg.compiler.torch_compat import lookup_backend
    registered = torch.compiler.list_backends(exclude_tags=())
    if func not in registered:
        # the list a user picks from: Dynamo's own list (its testing and debug backends left out)
        usable = torch.compiler.list_backends()
        raise BackendError(f"unknown backend 'torch:{func}'{nearest(func, usable, 'torch:')}"
                           f": Dynamo has no backend named {func!r}; " + choices_text(usable) + ".")
    return lookup_backend(func)


def _from_module(module: str, func: str) -> Callable:
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and (module == e.name or module.startswith(e.name + ".")):   # the module itself, not one it imports
            raise BackendError(f"backend '{module}:{func}': cannot import module {module!r} ({e}).") from None
        raise _load_error(f"{module}:{func}", f"importing module {module!r}", e) from None
    except Exception as e:  # noqa: B902 - whatever the user's module raises is bad input, not tdbg's bug
        raise _load_error(f"{module}:{func}", f"importing module {module!r}", e) from None
    return _attribute(mod, func, f"{module}:{func}")


def _load_error(label: str, doing: str, e: BaseException) -> BackendError:
    """The BackendError for a user backend whose code fails while loading: the exception and
    the file:line where it happened (a syntax error's own position; else the innermost frame
    outside importlib)."""
    if isinstance(e, SyntaxError):
        where = f"{e.filename}:{e.lineno}"
        what = f"SyntaxError: {e.msg}"
    else:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename]
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
        first = (str(e).strip().splitlines() or [""])[0]
        what = f"{type(e).__name__}: {first}" if first else type(e).__name__
    return BackendError(f"backend {label!r}: {doing} failed at {where}: {what}. Fix the backend's code "
                        "(it runs before any graph is compiled).")


def _attribute(namespace: Any, func: str, label: str) -> Callable:
    fn = namespace.get(func) if isinstance(namespace, dict) else getattr(namespace, func, None)
    if not callable(fn):
        raise BackendError(f"backend {label!r}: no callable named {func!r} there.")
    return fn


def _from_file(path: str, func: str, script: Optional[str]) -> Callable:
    if script and os.path.realpath(script) == os.path.realpath(path):
        return _late_lookup(func, f"{path}:{func}")
    stem = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(f"tdbg_user_backend_{stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: B902 - whatever the user's file raises is bad input, not tdbg's bug
        raise _load_error(f"{path}:{func}", f"loading {path}", e) from None
    return _attribute(module, func, f"{path}:{func}")


def _late_lookup(func: str, label: str) -> Callable:
    """The script being run defines the backend; find it in the script's globals when first used."""
    def backend(gm, example_inputs):
        return _attribute(vars(sys.modules["__main__"]), func, label)(gm, example_inputs)
    backend.__name__ = func
    backend.tdbg_defined_in_script = label   # its AOT stage is unknown until the script runs (aot_capture)
    return backend
