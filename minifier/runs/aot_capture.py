"""Hook a backend's own AOT stage: the aten graphs the chosen backend itself compiles after
AOTAutograd, forward, backward and inference (what `--after aot` captures).

`capture(backend, hook, config)` -> (family, Dynamo backend). The returned backend runs the
user's backend unchanged except that each aten graph goes through
`hook(gm, example_inputs, graph, compile_one)`, where graph is forward|backward|inference and
`compile_one(gm, inputs)` is the backend's own per-graph compile returning a callable(*args);
the hook returns the callable to run instead. One row per backend family:

  tdbg            tdbg's compiler (`inductor`, `torch:tdbg`): make_backend(inner_compile=...)
  torch:inductor  PyTorch's Inductor: compile_fx(inner_compile=...) around compile_fx_inner
  aot_autograd    backends made with aot_autograd(fw_compiler=, bw_compiler=, ...) (also
                  aot_eager): the same AOTAutograd call with each compiler wrapped
  torch:aot_eager (WITH_TORCH_AOT_EAGER only) torch's registered `aot_eager`, a function taking fw_compiler=/bw_compiler=
                  (its default, boxed_nop, wrapped; it has no inference compiler of its own: a
                  graph is `inference` when AOTAutograd will not trace a backward, by its rule)

Any other backend has no AOT stage tdbg can reach: `NoAotStage` (use `--after dynamo`). A
backend is never swapped for another one.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from tdbg.minifier.runs.backends import BackendError


class NoAotStage(BackendError):
    """The backend has no AOT stage tdbg can hook; the message names `--after dynamo`."""


def _is_tdbg(fn, name: str, kind: str) -> bool:
    import tdbg.compiler
    made = (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)) == (
        "tdbg.compiler", "make_backend.<locals>.backend")
    return kind == "inductor" or name == "torch:tdbg" or fn is tdbg.compiler.compile_fx or made


def _is_torch_inductor(fn, name: str, kind: str) -> bool:
    if name == "torch:inductor":
        return True
    from tdbg.compiler.torch_compat import lookup_backend
    return fn is lookup_backend("inductor")


def _is_aot_autograd(fn, name: str, kind: str) -> bool:
    from tdbg.compiler.torch_compat import AotAutograd
    return isinstance(fn, AotAutograd)


def _is_torch_aot_eager(fn, name: str, kind: str) -> bool:
    if name == "torch:aot_eager":
        return True
    from tdbg.compiler.torch_compat import lookup_backend
    return fn is lookup_backend("aot_eager")


def _torch_aot_eager_capture(fn, hook, config):
    # the compiler aot_eager uses when given none (`fw_compiler or boxed_nop`), from its own module
    nop = getattr(fn, "__globals__", {}).get("boxed_nop")
    if nop is None:
        raise NoAotStage("torch:aot_eager no longer names its compiler boxed_nop: its AOT stage cannot be "
                         "hooked; use --after dynamo")

    def backend(gm, example_inputs):
        import torch
        # AOTAutograd traces a backward exactly when grad is on and an input requires grad
        first = "forward" if torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in example_inputs) else "inference"

        def wrapped(graph: str):
            def compile_graph(g, inputs):
                return boxed(hook(g, inputs, graph, lambda g2, i: unboxed(nop(g2, i))))
            return compile_graph
        return fn(gm, example_inputs, fw_compiler=wrapped(first), bw_compiler=wrapped("backward"))
    return backend


def _tdbg_capture(fn, hook, config):
    from tdbg.compiler import compile_aten, make_backend

    def inner(gm, inputs, cfg, *, graph_name, kind):
        return hook(gm, inputs, kind,
                    lambda g, i: compile_aten(g, i, cfg, graph_name=graph_name, kind=kind))
    return make_backend(config, inner_compile=inner)


def _graph_kind(kwargs: dict) -> str:
    if kwargs.get("is_backward"):
        return "backward"
    return "inference" if kwargs.get("is_inference") else "forward"


def _inductor_capture(fn, hook, config):
    def inner(gm, inputs, **kwargs):
        from tdbg.minifier.runs.inductor_hooks import compile_fx_inner
        return boxed(hook(gm, inputs, _graph_kind(kwargs),
                          lambda g, i: unboxed(compile_fx_inner(g, i, **kwargs))))

    def backend(gm, example_inputs):
        from tdbg.compiler.torch_compat import functorch_config
        from tdbg.minifier.runs.inductor_hooks import compile_fx
        # a hit in AOTAutograd's cache would skip the inner compile, and with it the check
        with functorch_config.patch(enable_autograd_cache=False):
            return compile_fx(gm, example_inputs, inner_compile=inner)
    return backend


def _aot_autograd_capture(fn, hook, config):
    from tdbg.compiler.torch_compat import AotAutograd
    kwargs = dict(fn.kwargs)
    fw = kwargs["fw_compiler"]

    def wrapped(graph: str, compiler: Callable):
        def compile_graph(gm, inputs):
            return boxed(hook(gm, inputs, graph, lambda g, i: unboxed(compiler(g, i))))
        return compile_graph

    kwargs.update(fw_compiler=wrapped("forward", fw),
                  bw_compiler=wrapped("backward", kwargs.get("bw_compiler") or fw),
                  inference_compiler=wrapped("inference", kwargs.get("inference_compiler") or fw))
    return AotAutograd(**kwargs)


# family -> (is this backend of the family?, the capturing backend)
FAMILIES = {
    "tdbg": (_is_tdbg, _tdbg_capture),
    "torch:inductor": (_is_torch_inductor, _inductor_capture),
    "aot_autograd": (_is_aot_autograd, _aot_autograd_capture),
}
# Hooked only by the commands that ask (tdbg memory measures aot_eager's backward graph); the others
# keep torch:aot_eager's saved graph the Dynamo graph itself (tests/scenarios/test_compare_real.py)
WITH_TORCH_AOT_EAGER = {**FAMILIES, "torch:aot_eager": (_is_torch_aot_eager, _torch_aot_eager_capture)}


def family_of(backend: Any, families: dict = FAMILIES) -> Optional[str]:
    """The family (a `families` key) of a resolved Backend or a backend callable; None if none."""
    fn = getattr(backend, "compiler_fn", backend)
    name, kind = getattr(backend, "name", ""), getattr(backend, "kind", "")
    for family, (belongs, _) in families.items():
        if belongs(fn, name, kind):
            return family
    return None


def capture(backend: Any, hook: Callable, config, families: dict = FAMILIES) -> tuple:
    """(family, a Dynamo backend that is `backend` with `hook` around each per-graph compile)."""
    family = family_of(backend, families)
    fn = getattr(backend, "compiler_fn", backend)
    if family is None and getattr(fn, "tdbg_defined_in_script", None):
        raise NoAotStage(
            f"--after aot hooks a backend's own AOT stage, known before the script runs; "
            f"{fn.tdbg_defined_in_script} is defined in the script being run, so what it is becomes known only "
            "when the script runs. Move it to a file of its own and name that (--backend FILE.py:FUNCTION), "
            "or use --after dynamo (tdbg run: --repro-after dynamo).")
    if family is None:
        label = getattr(backend, "name", None) or getattr(backend, "__name__", repr(backend))
        raise NoAotStage(
            f"--after aot hooks a backend's own AOT stage: tdbg's compiler (inductor), torch:inductor, or an "
            f"aot_autograd(...) backend; {label} is none of these (it compiles Dynamo's graph its own way). "
            "Use --after dynamo (tdbg run: --repro-after dynamo).")
    return family, families[family][1](fn, hook, config)


def unboxed(compiled):
    """A callable(*args) for a compiled graph (AOT compilers may return ones taking one list)."""
    if getattr(compiled, "_boxed_call", False):
        def run(*args):
            return compiled(list(args))
        run.tdbg_compiled = compiled   # stays reachable: memory names its buffers by its code (not __wrapped__: inspect follows that)
        return run
    return compiled


def boxed(fn):
    """The calling convention AOTAutograd prefers: one list of arguments."""
    def run(args):
        return fn(*args)
    run._boxed_call = True
    return run
