"""The one place tdbg touches Inductor's internals, all of them for debugging the
`torch:inductor` backend (its inner compile for --after aot, torch's compiler bisector, warming a
query server, naming a C++ kernel that does not compile and the user lines of its ops). It lives
outside compiler/ because tdbg's compiler never imports torch._inductor.

Same contract and machinery as compiler/torch_compat.py (a `Table` of entries resolved at first
use, a missing one raising TorchCompatError naming it); tests/compat/test_torch_compat.py checks
each entry. Importing this module imports no torch.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
import traceback
from typing import Optional

from tdbg.compiler.torch_compat import Entry as E
from tdbg.compiler.torch_compat import Table, TorchCompatError, missing_message

ENTRIES = Table([
    E("compile_fx", "torch._inductor.compile_fx", "compile_fx",
      "torch:inductor with its inner compile hooked (--after aot, bisect probes)"),
    E("compile_fx_inner", "torch._inductor.compile_fx", "compile_fx_inner",
      "compiling one aten graph with Inductor (--after aot, compare, bisect probes)"),
    E("TorchCompileInductorWrapper", "torch", "_TorchCompileInductorWrapper",
      "a script's own torch.compile(mode=/options=) with Inductor, built as torch.compile builds it"),
    E("inductor_config", "torch._inductor.config", None, "the compiler bisector's config changes"),
    E("compiler_bisector", "torch._inductor.compiler_bisector", None,
      "torch's compiler bisector, driven by tdbg bisect's probes"),
    E("cpu_vec_isa", "torch._inductor.cpu_vec_isa", None, "Inductor's CPU vector-ISA probe, run once per server"),
    E("inductor_exc", "torch._inductor.exc", None, "recognizing Inductor's C++ compile errors (stage cpp_build)"),
    E("autograd_cache_log", "torch._functorch._aot_autograd.autograd_cache", "log",
      "explain --caches: AOTAutograd computes its cache key's components only when this logger is at DEBUG"),
    E("inductor_cache_dir", "torch._inductor.runtime.cache_dir_utils", "cache_dir",
      "explain --caches names the cache directory Inductor's FX graph and AOTAutograd caches used"),
    E("cpp_codegen", "torch._inductor.codegen.cpp", None,
      "the FX nodes of each C++ kernel Inductor generates (a kernel that does not compile names its user lines)"),
])

# the Inductor modules a first compile loads (~400 with their imports), imported by `warm`
WARM_MODULES = ("torch._inductor.codegen.cpp", "torch._inductor.codegen.cpp_wrapper_cpu", "torch._inductor.compile_fx",
                "torch._inductor.fx_passes.post_grad", "torch._inductor.scheduler")


def warm() -> None:
    """Pay Inductor's once-per-process costs: import WARM_MODULES and run its CPU vector-ISA probe
    (it builds a library and loads it in a fresh interpreter: seconds). Runs no tensor op, so a
    process may fork afterwards. A module torch no longer has raises TorchCompatError."""
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as cause:
            raise TorchCompatError(missing_message(E(name, name, None, "warming Inductor before forking"))) from cause
    ENTRIES.resolve("cpu_vec_isa").valid_vec_isa_list()


# `warm`'s probe as a "module:function" a fresh interpreter can call (FreshInterpreter.warm)
WARM_CALLS = (f"{ENTRIES.entries['cpu_vec_isa'].module}:valid_vec_isa_list",)


# -- failures in Inductor's generated code ---------------------------------------------------------
BACKENDS = ("torch:inductor",)   # backend names whose runs record each kernel's FX nodes (record_kernel_origins)
# (entry, exception class, stage): an Inductor exception of that class anywhere in a failure's chain
# puts the failure at that stage (errors.STAGES); looked for only once Inductor loaded its module.
STAGES = (("inductor_exc", "CppCompileError", "cpp_build"),)
# the hook Inductor's C++ codegen calls once per kernel with the scheduler nodes it holds (its
# provenance tracing: called whatever the provenance level, it returns at once when that is off)
_KERNEL_HOOK = "set_kernel_post_grad_provenance_tracing"
KERNEL_ORIGINS: dict = {}   # kernel name -> {"graph": id of its FX graph, "nodes": [(FX node name, stack trace)]}
_ORDER: dict = {}           # id(FX graph) -> {node: index}: origins are sets, kept in graph order
# `NAME = async_compile.cpp_pybinding([...], r'''SOURCE''')`: one C++ kernel of a generated module
_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.cpp_pybinding\(\[[^\]]*\], r'''\n(.*?)'''\)", re.M | re.S)


def stage_of(chain: list) -> Optional[str]:
    """The stage an Inductor exception in `chain` (a failure and what it wraps, outermost first:
    instrument.exception_chain) puts the failure at (STAGES), or None. Imports nothing: a module
    Inductor never loaded cannot have raised."""
    for name, cls_name, stage in STAGES:
        if ENTRIES.entries[name].module in sys.modules:
            cls = getattr(ENTRIES.resolve(name), cls_name)
            if any(isinstance(e, cls) for e in chain):
                return stage
    return _phase_of(chain)


# Inductor's phases as its own frames show them, outermost first: GraphLowering.run lowers each FX
# node, then GraphLowering.codegen builds the Scheduler. The OUTERMOST matching frame names the
# phase: the scheduler re-runs lowering.py's inner functions while it traces loop bodies, so a
# lowering.py frame alone says nothing. (file under torch/_inductor, functions or None = any) -> stage
PHASES = (
    ("graph.py", ("run", "run_node", "call_function", "placeholder", "output"), "lowering"),
    ("scheduler.py", None, "scheduling"),
)


def _phase_of(chain: list) -> Optional[str]:
    """The Inductor phase (PHASES) an exception was raised in, by its traceback, or None."""
    marker = os.path.join("torch", "_inductor") + os.sep
    for e in chain:
        for frame in traceback.extract_tb(e.__traceback__):
            if marker not in frame.filename:
                continue
            rel = frame.filename.split(marker, 1)[1]
            for file, functions, stage in PHASES:
                if rel == file and (functions is None or frame.name in functions):
                    return stage
    return None


def record_kernel_origins() -> None:
    """From now on every C++ kernel Inductor generates in this process is recorded in
    KERNEL_ORIGINS with its FX nodes (the aten graph's, each with the stack trace Dynamo gave it),
    so a kernel g++ rejects names its ops and their user lines. Idempotent; what Inductor
    generates does not change (its own hook runs unchanged after the recording)."""
    mod = ENTRIES.resolve("cpp_codegen")
    original = getattr(mod, _KERNEL_HOOK)
    if getattr(original, "tdbg_recording", False):
        return

    def recording(node_schedule, kernel_name, *args, **kwargs):
        try:
            _record(node_schedule, kernel_name)
        except Exception:  # noqa: B902 - recording must never break the user's compile
            pass
        return original(node_schedule, kernel_name, *args, **kwargs)
    recording.tdbg_recording = True
    setattr(mod, _KERNEL_HOOK, recording)


def _record(node_schedule, kernel_name: str) -> None:
    origins = []
    for snode in node_schedule if isinstance(node_schedule, (list, tuple)) else ():
        for fx_node in getattr(getattr(snode, "node", None), "origins", None) or ():
            if fx_node not in origins:
                origins.append(fx_node)
    if not origins:
        return
    graph = origins[0].graph
    if id(graph) not in _ORDER:
        _ORDER.clear()   # graphs are compiled one at a time: only the current one's order is needed
        _ORDER[id(graph)] = {n.name: i for i, n in enumerate(graph.nodes)}
    order = _ORDER[id(graph)]
    entry = KERNEL_ORIGINS.get(kernel_name)
    if entry is None or entry["graph"] != id(graph):   # kernel names restart at _0 in every graph
        entry = KERNEL_ORIGINS[kernel_name] = {"graph": id(graph), "nodes": []}
    known = {name for name, _ in entry["nodes"]}
    entry["nodes"] += [(n.name, n.meta.get("stack_trace") or "") for n in origins if n.name not in known]
    entry["nodes"].sort(key=lambda item: order.get(item[0], -1))


def kernel_origins(graph) -> dict:
    """kernel name -> [(FX node name, stack trace)] of the C++ kernels Inductor generated for
    `graph` (the fx.Graph it lowered) since record_kernel_origins ran. Read it right after that
    graph's compile: kernel names restart in every graph, so a later graph's kernels replace them."""
    return {name: list(entry["nodes"]) for name, entry in KERNEL_ORIGINS.items() if entry["graph"] == id(graph)}


def cpp_compile_evidence(chain: list) -> Optional[dict]:
    """The evidence of an Inductor C++ compile error in `chain` (as for stage_of), else None: the kernel g++
    rejected (found by its source in the generated module being loaded), its FX nodes in graph
    order with their stack traces (when record_kernel_origins ran) and the first compiler error
    with the lines after it. The keys of tdbg's own CppCompileError.evidence(), plus
    `node_traces` (one per FX node)."""
    if stage_of(chain) != "cpp_build":
        return None
    cls = ENTRIES.resolve("inductor_exc").CppCompileError
    error = next(e for e in chain if isinstance(e, cls))
    command = [str(a) for a in getattr(error, "cmd", None) or []]
    cpp = next((a for a in command if a.endswith((".cpp", ".cc", ".cxx"))), "")
    kernel = _failing_kernel(cpp, _generated_modules(chain))
    nodes = ((KERNEL_ORIGINS.get(kernel) or {}).get("nodes") or []) if kernel else []
    return {"stage": "cpp_build", "message": _compiler_message(kernel, str(getattr(error, "output", "") or "")),
            "command": command, "source_path": cpp, "kernel": kernel or "",
            "fx_nodes": [name for name, _ in nodes], "node_source": next((t for _, t in nodes if t), ""),
            "node_traces": [trace for _, trace in nodes]}


def _generated_modules(chain: list) -> list:
    """The files of the modules being executed when the failure was raised, innermost first (Inductor
    loads its generated wrapper module, whose top level compiles the kernels)."""
    files = []
    for e in chain:
        for frame in reversed(traceback.extract_tb(e.__traceback__)):
            if frame.name == "<module>" and frame.filename not in files and os.path.isfile(frame.filename):
                files.append(frame.filename)
    return files


def _failing_kernel(cpp_path: str, modules: list) -> Optional[str]:
    """The name of the kernel whose C++ source is in `cpp_path` (the file g++ rejected), from the
    kernel definitions of the generated modules."""
    try:
        with open(cpp_path, errors="replace") as f:
            cpp = f.read()
    except OSError:
        return None
    for path in modules:
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        found = [m.group(1) for m in _KERNEL_DEF.finditer(text) if m.group(2).strip() and m.group(2).strip() in cpp]
        if found:
            return found[0]
    return None


def _compiler_message(kernel: Optional[str], output: str, context: int = 6) -> str:
    """'CppCompileError: g++ rejected Inductor's kernel K: FIRST ERROR' and the `context` lines
    after that error (paths shortened to file names: they are Inductor's temporary files)."""
    lines = [re.sub(r"[^\s'‘]*/([^/\s:]+\.(?:cpp|cc|cxx|h)):", r"\1:", ln) for ln in output.splitlines()]
    first = next((i for i, ln in enumerate(lines) if "error:" in ln), None)
    what = f"Inductor's kernel {kernel}" if kernel else "Inductor's generated C++"
    if first is None:
        return "\n".join([f"CppCompileError: g++ rejected {what}", *lines[:context]])
    return "\n".join([f"CppCompileError: g++ rejected {what}: {lines[first].strip()}",
                      *lines[first + 1:first + 1 + context]])


__getattr__ = ENTRIES.module_getattr(globals())
