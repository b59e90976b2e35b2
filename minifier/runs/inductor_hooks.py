"""The one place tdbg touches Inductor's internals, all of them for debugging the
`torch:inductor` backend (its inner compile for --after aot, torch's compiler bisector, warming a
query server). It lives outside compiler/ because tdbg's compiler never imports torch._inductor.

Same contract and machinery as compiler/torch_compat.py (a `Table` of entries resolved at first
use, a missing one raising TorchCompatError naming it); tests/compat/test_torch_compat.py checks
each entry. Importing this module imports no torch.
"""
from __future__ import annotations

import importlib

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


__getattr__ = ENTRIES.module_getattr(globals())
