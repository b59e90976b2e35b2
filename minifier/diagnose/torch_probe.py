"""The backend of `tdbg bisect`'s probes into torch's own layers, run in the probe's child process
(bisect.py's `_torch_probe` starts it as the module:function backend PROBE_BACKEND, with its spec
in $PROBE_ENV). Kept apart from bisect.py: this side runs inside the script's process, next to
torch's compiler bisector; that side only reads what it writes.
"""
from __future__ import annotations

import json
import os
import re
import tempfile

PROBE_ENV = "TDBG_TORCH_BISECT"

_PROBE: dict = {}   # this child's probe: spec, bisector module, FX node targets; set up on the first graph


def torch_probe(gm, example_inputs):
    """A Dynamo backend for bisect's probes, run in the child: Dynamo's backend spec["backend"]
    with torch's CompilerBisector driving one subsystem, set up on the first call from the JSON
    spec in $TDBG_TORCH_BISECT. mode "disable": the subsystem off; "count": every application on
    and counted; "upto": applications 0..spec["at"] on, the rest off, the bisector's debug info
    of application `at` recorded. After each compile {"count", "debug", "nodes" (node name ->
    target of the graphs Inductor compiled), "traces" (node name -> its stack trace: the
    culprit's own user line), "kernels"} is written to spec["out"]."""
    if not _PROBE:
        _PROBE.update(_setup_probe(json.loads(os.environ[PROBE_ENV])))
    spec = _PROBE["spec"]
    try:
        if spec["backend"] == "inductor":
            from tdbg.minifier.runs.inductor_hooks import compile_fx
            return compile_fx(gm, example_inputs, inner_compile=_recording_inner)
        from tdbg.compiler.torch_compat import lookup_backend
        return lookup_backend(spec["backend"])(gm, example_inputs)
    finally:
        _write_probe()


def _setup_probe(spec: dict) -> dict:
    from tdbg.minifier.runs.inductor_hooks import compiler_bisector, inductor_config
    bisector = compiler_bisector.CompilerBisector
    # Own state directory and explicit switches: the module may have been imported (and its
    # environment lookups cached) before this child's environment was set. bisection_enabled
    # also makes Inductor bypass its FX-graph and AOTAutograd caches, so every probe lowers
    # afresh (a cached graph would skip the subsystem) while compiled kernels stay cached.
    bisector.in_process_cache = tempfile.mkdtemp(prefix="state-", dir=os.path.dirname(spec["out"]))
    bisector.bisection_enabled = True
    compiler_bisector.get_env_val.cache_clear()
    backend, name = spec["backend"], spec["subsystem"]
    subsystem = bisector.get_subsystem_object(backend, name)
    bisector.update_bisect_status(backend, name)
    state = {"disable": "test_disable", "count": "find_max_bounds", "upto": "bisect"}[spec["mode"]]
    bisector.update_run_state(backend, subsystem, state)
    if state == "bisect":
        bisector.update_bisect_range(backend, name, spec["at"], spec["at"])
    if backend == "inductor":   # torch.compile's Inductor wrapper applies these; compile_fx does not
        for key, value in (bisector.get_config_change("inductor") or {}).items():
            setattr(inductor_config, key, value)
    return {"spec": spec, "module": compiler_bisector, "nodes": {}, "traces": {}, "kernels": []}


def _recording_inner(gm, *args, **kwargs):
    from tdbg.minifier.runs.inductor_hooks import compile_fx_inner
    for node in gm.graph.nodes:
        if node.op == "call_function":
            _PROBE["nodes"].setdefault(node.name, str(node.target))
            if node.meta.get("stack_trace"):    # the culprit's own user line
                _PROBE["traces"].setdefault(node.name, node.meta["stack_trace"])
    compiled = None
    try:
        compiled = compile_fx_inner(gm, *args, **kwargs)
        return compiled
    finally:
        source = getattr(compiled, "source_code", None) or ""
        _PROBE["kernels"] += re.findall(r"^(\w+) = async_compile\.", source, re.M)
        _write_probe()


def _write_probe() -> None:
    module, spec = _PROBE["module"], _PROBE["spec"]
    at = spec.get("at")
    # torch 2.11's bisector records no per-application debug info: the culprit then reads
    # "(not recorded by the bisector)" (bisect.py) instead of failing the probe
    debug_info = getattr(module.CompilerBisector, "get_call_counter_debug_info", None)
    debug = None if at is None or debug_info is None else debug_info(spec["backend"], spec["subsystem"], at)
    doc = {"count": module.subsystem_call_counter[spec["subsystem"]], "debug": debug, "nodes": _PROBE["nodes"],
           "traces": _PROBE["traces"], "kernels": _PROBE["kernels"]}
    tmp = spec["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, spec["out"])
