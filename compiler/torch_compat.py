"""The one place tdbg touches torch internals (private modules and attributes), so a torch release
that moves or drops one fails loudly here, naming it, instead of deep inside a run.

Contract:
- `ENTRIES` is the table: per name, the torch module and attribute it resolves to, why tdbg needs
  it, and the torch versions it was checked on (tests/compat/test_torch_compat.py checks each one
  exists and behaves as tdbg assumes).
- `from tdbg.compiler.torch_compat import NAME` (or `torch_compat.NAME`) resolves NAME at first use
  (PEP 562 module `__getattr__`), then caches it as a module global. Importing this module imports
  no torch, so `tdbg --help` and the torch-free parents of runs stay torch-free.
- A name torch no longer has raises `TorchCompatError` ("tdbg needs torch.X.Y (why); this torch
  2.N lacks it"), an ImportError, so it reads like the failed import it replaces.
- Inductor's hooks are NOT here: tdbg's compiler never imports Inductor. They live in
  minifier/runs/inductor_hooks.py, a second `Table` built with the same machinery.
- Public torch APIs (torch.compiler.reset, torch.compiler.list_backends, torch.fx, torch.ops) are
  used directly and are not listed.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional

# the torch versions every entry below was checked on (tests/compat run on each; 2.11.0 on the
# 16-core device machine, 2026-11-26: 62 passed)
CHECKED = ("2.11.0", "2.13.0", "2.14.1")


class TorchCompatError(ImportError):
    """A torch internal tdbg relies on is missing from the installed torch."""


@dataclass(frozen=True)
class Entry:
    name: str                 # what tdbg code imports from the compat module
    module: str               # the torch module holding it
    attr: Optional[str]       # the attribute in that module; None: the module itself
    why: str                  # what tdbg uses it for (goes into the error)
    checked: tuple = CHECKED  # torch versions this entry was checked on

    @property
    def target(self) -> str:
        return self.module if self.attr is None else f"{self.module}.{self.attr}"


class Table:
    """Entries by name, resolved on first use. `resolve(name)` imports the module and reads the
    attribute, raising TorchCompatError (never a bare ImportError/AttributeError) when torch lacks it."""

    def __init__(self, entries):
        self.entries = {e.name: e for e in entries}
        if len(self.entries) != len(entries):
            raise ValueError("duplicate compat entry names")

    def resolve(self, name: str):
        e = self.entries[name]
        try:
            obj = importlib.import_module(e.module)
            return obj if e.attr is None else getattr(obj, e.attr)
        except (ImportError, AttributeError) as cause:
            raise TorchCompatError(missing_message(e)) from cause

    def module_getattr(self, namespace: dict):
        """A PEP 562 `__getattr__` for the module whose globals are `namespace`: a table name
        resolves on first use and is cached there, so later uses are a plain global read."""
        def __getattr__(name: str):
            if name not in self.entries:
                raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
            namespace[name] = value = self.resolve(name)
            return value
        return __getattr__

    def modules(self) -> tuple:
        """The torch modules behind the entries, in table order, without repeats."""
        return tuple(dict.fromkeys(e.module for e in self.entries.values()))


def missing_message(e: Entry) -> str:
    """The one wording of a missing internal: what, why, this torch, the versions checked."""
    import torch
    return (f"tdbg needs {e.target} ({e.why}); this torch {torch.__version__} lacks it. tdbg was checked on "
            f"torch {', '.join(e.checked)}: install one of those, or report this torch version to tdbg.")


E = Entry
ENTRIES = Table([
    # ---- Dynamo -----------------------------------------------------------------------------
    E("CompileContext", "torch._guards", "CompileContext", "the compile id of the graph being compiled"),
    E("TracingContext", "torch._guards", "TracingContext", "the user code Dynamo traced, to name a graph"),
    E("compile_context", "torch._guards", "compile_context",
      "TORCH_TRACE records of a graph specialized at call time carry its Dynamo compile id"),
    E("dynamo_callbacks", "torch._dynamo.callback", "callback_handler",
      "graph numbers restart after torch._dynamo.reset(), which clears Dynamo's compile callbacks"),
    E("compile_lock", "torch._dynamo.convert_frame", "compile_lock",
      "one specialization compile at a time, as Dynamo compiles"),
    E("dynamo_disable", "torch._dynamo", "disable", "hiding compiled graphs from Dynamo, with a reason"),
    E("dynamo_counters", "torch._dynamo.utils", "counters", "the aot_autograd counters Dynamo's own backends keep"),
    E("flatten_graph_inputs", "torch._dynamo.utils", "flatten_graph_inputs", "graphs with nested inputs"),
    E("dynamo", "torch._dynamo", None, "run and profile replace torch._dynamo.optimize while a script runs"),
    E("dynamo_config", "torch._dynamo.config", None, "the dumper turns off Dynamo's own repro_after"),
    E("lookup_backend", "torch._dynamo", "lookup_backend", "resolving a torch:NAME backend"),
    E("TorchCompileWrapper", "torch", "_TorchCompileWrapper",
      "a script's own backend with mode/options, built as torch.compile builds it"),
    E("list_backends", "torch._dynamo", "list_backends", "repro.py's runtime checks a torch:NAME backend exists"),
    E("BackendCompilerFailed", "torch._dynamo.exc", "BackendCompilerFailed", "unwrapping a backend's own error"),
    E("TorchDynamoException", "torch._dynamo.exc", "TorchDynamoException", "telling Dynamo's failures apart"),
    E("SkipFrame", "torch._dynamo.exc", "SkipFrame", "--function skips the frames it does not select"),
    E("InstructionTranslator", "torch._dynamo.symbolic_convert", "InstructionTranslator",
      "the name of the frame Dynamo is translating"),
    E("dynamo_cache_entries", "torch._dynamo.eval_frame", "_debug_get_cache_entry_list",
      "explain --code: a frame's compiled entries (transformed code, guard manager's code_parts)",
      checked=("2.13.0",)),
    E("AotAutograd", "torch._dynamo.backends.common", "AotAutograd", "recognizing aot_autograd(...) backends"),
    E("aot_autograd", "torch._dynamo.backends.common", "aot_autograd", "the aot_eager-style backends"),
    E("set_logs", "torch._logging", "set_logs", "a run's --torch-logs channels"),
    E("trace_structured", "torch._logging", "trace_structured", "tdbg's artifacts in the TORCH_TRACE log"),
    E("trace_log", "torch._logging._internal", "trace_log", "whether TORCH_TRACE is collecting"),
    E("dynamo_timed", "torch._dynamo.utils", "dynamo_timed", "tdbg's stage times as TORCH_TRACE events"),
    # ---- AOTAutograd / functorch ---------------------------------------------------------------
    E("aot_module_simplified", "torch._functorch.aot_autograd", "aot_module_simplified",
      "tdbg's backend runs AOTAutograd itself"),
    E("functorch_config", "torch._functorch.config", None, "AOTAutograd's cache is off while --after aot captures"),
    E("make_boxed_func", "functorch.compile", "make_boxed_func", "compiled graphs take boxed arguments"),
    E("min_cut_rematerialization_partition", "functorch.compile", "min_cut_rematerialization_partition",
      "the forward/backward partition"),
    E("is_functorch_wrapped_tensor", "torch._C._functorch", "is_functorch_wrapped_tensor",
      "the minifier never turns a tensor inside a vmap/grad transform into a graph input"),
    # ---- fake tensors and symbolic shapes -----------------------------------------------------
    E("FakeTensorMode", "torch._subclasses.fake_tensor", "FakeTensorMode", "static fake values of a graph"),
    E("FakeTensor", "torch._subclasses.fake_tensor", "FakeTensor", "telling fake inputs from real ones"),
    E("unset_fake_temporarily", "torch._subclasses.fake_tensor", "unset_fake_temporarily",
      "lowering outside AOTAutograd's fake mode"),
    E("FakeTensorProp", "torch.fx.passes.fake_tensor_prop", "FakeTensorProp", "node values of a loaded graph"),
    E("free_unbacked_symbols", "torch.fx.experimental.symbolic_shapes", "free_unbacked_symbols",
      "graphs with data-dependent shapes run unchanged"),
    E("ShapeEnv", "torch.fx.experimental.symbolic_shapes", "ShapeEnv",
      "explain's shapes: a frame's shape guards with where each was made (guards' SLoc), its specializations "
      "(replacements, replacements_slocs, specialization_stacks) and symbol sources (var_to_sources, source_to_var)"),
    E("ShapeGuard", "torch._guards", "ShapeGuard", "explain's shapes: one shape guard (expr, sloc: SLoc)"),
    # repro.py / replay / minify rebuild a graph's symbolic sizes (repro_templates/runtime.py imports
    # these itself: a repro runs without tdbg); added 2026-11-26, checked on torch 2.13 only so far
    E("DimDynamic", "torch.fx.experimental.symbolic_shapes", "DimDynamic",
      "recompiling a saved graph with its symbolic sizes (DYNAMIC / STATIC dims)", ("2.13.0",)),
    E("StatefulSymbolicContext", "torch.fx.experimental.symbolic_shapes", "StatefulSymbolicContext",
      "fake inputs whose sizes are the recorded symbols", ("2.13.0",)),
    E("ConstantSource", "torch._dynamo.source", "ConstantSource", "a recorded symbol's source", ("2.13.0",)),
    E("LocalSource", "torch._dynamo.source", "LocalSource", "a recompiled input's source", ("2.13.0",)),
    E("TensorProperty", "torch._dynamo.source", "TensorProperty", "the SIZE of an input's dim", ("2.13.0",)),
    E("TensorPropertySource", "torch._dynamo.source", "TensorPropertySource",
      "an input dim's source, the key of the symbol cache", ("2.13.0",)),
    E("tracing", "torch._guards", "tracing", "running AOTAutograd on a rebuilt symbolic graph", ("2.13.0",)),
    # ---- ops, dispatch, decompositions, pytrees -----------------------------------------------
    E("OpOverload", "torch._ops", "OpOverload", "aten op overloads in FX graphs"),
    E("OpOverloadPacket", "torch._ops", "OpOverloadPacket", "aten op packets in lowering tables"),
    E("HigherOrderOperator", "torch._ops", "HigherOrderOperator", "higher-order ops in FX graphs"),
    E("storage_use_count", "torch._C", "_storage_Use_Count", "reusing an output buffer nobody else holds"),
    E("AutoDispatchBelowADInplaceOrView", "torch._C", "_AutoDispatchBelowADInplaceOrView",
      "calling aten below autograd in the compiled wrapper"),
    E("is_alias_of", "torch._C", "_is_alias_of", "mutated inputs aliased by outputs"),
    E("RecordFunctionFast", "torch._C._profiler", "_RecordFunctionFast",
      "kernels named in torch.profiler (kernel profiling) at ~1-3 us a kernel; record_function costs 50-110 us"),
    E("has_kernel_for_dispatch_key", "torch._C", "_dispatch_has_kernel_for_dispatch_key",
      "an out= overload is used only when it has a CPU kernel of its own"),
    E("elementwise_dtypes", "torch._prims_common", "elementwise_dtypes", "type promotion of pointwise ops"),
    E("ELEMENTWISE_TYPE_PROMOTION_KIND", "torch._prims_common", "ELEMENTWISE_TYPE_PROMOTION_KIND",
      "the promotion kind of each pointwise op"),
    E("get_decompositions", "torch._decomp", "get_decompositions", "tdbg's decomposition table"),
    E("pytree", "torch.utils._pytree", None, "flattening outputs and arguments"),
    E("TorchDispatchMode", "torch.utils._python_dispatch", "TorchDispatchMode",
      "tdbg profile's count of the subnormal values each aten op reads", ("2.13.0",)),
])
del E

# torch internals the warm servers import before forking (each behind an entry above):
# RUN_WARM for run/bisect zygotes, MINIFY_WARM (a superset) for the minifier's query servers
RUN_WARM = ("torch._dynamo", "functorch.compile")
MINIFY_WARM = ("torch._dynamo", "torch._functorch.aot_autograd", "torch._subclasses.fake_tensor",
               "torch.fx.passes.fake_tensor_prop", "torch.fx.experimental.symbolic_shapes", "torch._decomp",
               "functorch.compile")


__getattr__ = ENTRIES.module_getattr(globals())


def check_all(table: Table = ENTRIES) -> list:
    """Every entry of `table` that this torch lacks, as TorchCompatError messages (empty: all there)."""
    problems = []
    for name in table.entries:
        try:
            table.resolve(name)
        except TorchCompatError as e:
            problems.append(str(e))
    return problems


# ---- symbolic sizes (ShapeEnv) ------------------------------------------------------------
# compile_aten's symbolic path reads these three things of a fake SymInt's node and its
# ShapeEnv; ir.ShapeSymbols is given them as callables (ir imports nothing of compiler/).

def sym_expr(s):
    """The sympy expression of a torch.SymInt (over the ShapeEnv's symbols)."""
    return s.node.expr


def shape_env_of(values):
    """The ShapeEnv behind the first SymInt in `values` (tensors' sizes/strides, scalars), else None."""
    import torch
    for v in values:
        sizes = (*v.shape, *v.stride()) if isinstance(v, torch.Tensor) else (v,)
        for s in sizes:
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def shape_env_functions(env):
    """(replace, hint) for `env`: replace(expr) applies its replacements (sizes the guards
    found equal), hint(symbol) is the example value or None (unbacked)."""
    values = getattr(env, "backed_var_to_val", None)   # torch >= 2.13's name
    return env.replace, (values if values is not None else env.var_to_val).get


def tensor_version(t):
    """`t._version`, the count of in-place writes autograd keeps; None for an inference tensor,
    which keeps none (a cache keyed on it must then read `t` anew every call)."""
    try:
        return t._version
    except RuntimeError:
        return None
