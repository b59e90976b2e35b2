"""tdbg's CPU graph compiler: Dynamo graph -> AOTAutograd -> loop IR -> fused C++/OpenMP kernels.

Entry points:
- `compile_fx(gm, example_inputs, config=None)`: the Dynamo backend registered as "tdbg".
- `make_backend(config=None, inner_compile=None)`: a Dynamo backend; `inner_compile(gm, inputs,
  config, *, graph_name, kind)` replaces `compile_aten` (the minifier wraps it).
- `compile_aten(aten_gm, example_inputs, config=None, *, graph_name="graph", kind="inference")`
  -> `CompiledGraph`, the pipeline below, one named stage after another.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
from typing import Optional

from . import config as _config
from .errors import IRInvariantError, KernelRuntimeError
from .logs import configure_logging, get_logger
from .trace import DebugTrace

log = get_logger("compiler")
_compiled_counter = itertools.count()     # graphs compiled by compile_aten outside Dynamo
_graph_numbers: dict = {}                 # Dynamo compile id -> graph number n since the last reset


def _graph_number() -> int:
    """0, 1, 2, ... per Dynamo graph; restarts after torch._dynamo.reset(). Compile ids restart
    too, but repeat ids seen before it, and frame 0 may go to another backend: the reset is told
    by Dynamo's start callbacks, which it clears."""
    from .torch_compat import CompileContext, dynamo_callbacks
    if _since_reset not in dynamo_callbacks.start_callbacks:
        _graph_numbers.clear()
        dynamo_callbacks.register_start_callback(_since_reset)
    return _graph_numbers.setdefault(str(CompileContext.current_compile_id()), len(_graph_numbers))


def _since_reset(args) -> None:
    """Does nothing when Dynamo starts a compile; registered until the next reset clears it."""


def _number_of(graph_name: str):
    """n of a `<model>__<n>_<kind>_<k>` name, else None."""
    rest = graph_name.partition("__")[2]
    head = rest.split("_")[0]
    return int(head) if head.isdigit() else None


class CompiledGraph:
    """`compiled(*args)` returns what the aten graph returns; see module docstring."""

    def __init__(self, name, call, spec, *, kernels=(), lowered_nodes=(), fallback_targets=(),
                 source_code="", debug_dir=None, kind="inference", node_traces=None, kernel_nodes=None):
        self.name, self._call, self._spec, self.kind = name, call, spec, kind
        # kernel name -> the FX nodes it computes, in kernel order (a node inlined into several
        # kernels is listed under each): how `tdbg compare` names the kernel of a diverging node
        self.kernel_nodes = {k: list(v) for k, v in (kernel_nodes or {}).items()}
        self.node_traces = dict(node_traces or {})   # FX node name -> its stack trace (user lines)
        self.kernels, self.lowered_nodes = list(kernels), list(lowered_nodes)
        self.size_symbols = {}   # a symbolic compilation: kernel size symbol (ks0) -> ShapeEnv symbol
        self.hoist = None        # hoist.Hoisted: the FX nodes computed once per weight version, not per call
        self.fallback_targets, self.source_code, self.debug_dir = list(fallback_targets), source_code, debug_dir
        from .torch_compat import pytree
        self._unflatten = pytree.tree_unflatten
        self._tuple = spec.type is tuple and all(spec.child(i).is_leaf() for i in range(spec.num_children))

    def __call__(self, *args):
        try:
            outs = self._call(list(args))
        except KernelRuntimeError as e:
            # backward nodes carry their forward node's trace, so this names the user's own line
            e.node_source = e.node_source or _first_trace(self.node_traces, e.fx_nodes)
            raise
        if self._tuple:
            return outs
        return self._unflatten(list(outs), self._spec)

    def __repr__(self):
        return f"CompiledGraph({self.name}, kernels={self.kernels})"


class Compilation:
    """State passed from stage to stage."""

    def __init__(self, gm, example_inputs, config, name, kind, trace):
        self.gm, self.example_inputs, self.config = gm, example_inputs, config
        self.name, self.kind, self.trace = name, kind, trace
        self.graph = self.items = self.fusions = self.plan = self.kernels = None
        n = _number_of(name)
        self.source_code, self.call = "", None
        self.stage_times = {}     # stage -> seconds (trace.timed_stage)
        self.number = n if n is not None else next(_compiled_counter)   # profiler names graph_<n>_...


def _lower(c):
    from .bias_epilogue import split_biases
    from .layout import plan_layout
    from .linear_gelu import fuse_linear_gelu
    from .lowering import GraphLowering
    # graph passes, each on a copy of the graph where it changes something: GELU as the post-op
    # of linears of many rows, linear biases added by the kernels after them, layout planning
    # (channels_last through convolutions)
    c.gm = fuse_linear_gelu(c.gm, c.kind, c.config)
    c.gm = split_biases(c.gm, c.kind, c.config)
    c.gm = plan_layout(c.gm, c.example_inputs, c.config, c.kind)
    c.graph = GraphLowering(c.gm, c.example_inputs, c.config)
    c.graph.run(*c.example_inputs)
    if c.trace:
        from .debug_files import ir_pre_fusion
        c.trace.write("ir_pre_fusion.txt", ir_pre_fusion(c.graph))


def _check_lowered(c):
    from .ir import ComputedBuffer
    for op in c.graph.operations:
        if isinstance(op, ComputedBuffer):
            if tuple(op.data.ranges) != tuple(op.layout.size):
                raise IRInvariantError(f"ranges {op.data.ranges} != layout size {op.layout.size}",
                                       after_stage="lower", node=op.name)
    for out in c.graph.graph_outputs:
        if hasattr(out, "storage") and out.storage() is None:
            raise IRInvariantError("graph output is not realized", after_stage="lower", node=str(out))


def _schedule(c):
    from .scheduler import plan_memory, schedule
    c.items, c.fusions = schedule(c.graph.operations, c.graph.graph_outputs, c.config)
    c.plan = plan_memory(c.items, c.graph.graph_inputs, c.graph.graph_outputs)
    if c.trace:
        from .debug_files import ir_post_fusion
        c.trace.write("ir_post_fusion.txt", ir_post_fusion(c.items))


def _check_scheduled(c):
    from .scheduler import KernelGroup
    produced = {b.name for b in c.graph.graph_inputs}
    for item in c.items:
        nodes = item.nodes if isinstance(item, KernelGroup) else [item]
        for n in nodes:
            missing = [r for r in n.read_names() if r not in produced and r not in (x.name for x in nodes)]
            if missing:
                raise IRInvariantError(f"reads {missing} before they are produced", after_stage="schedule",
                                       node=n.name)
            produced.add(n.name)
            produced.update(getattr(n, "writes", []))


def _codegen(c):
    from .codegen_cpp import generate_kernels
    c.kernels = generate_kernels(c.items, c.graph.buffers, c.config)


def _wrap(c):
    from .wrapper import WrapperCodegen
    wrapper = WrapperCodegen(c.name, c.graph.graph_inputs, c.graph.graph_outputs, c.items, c.plan,
                                   c.kernels, c.config, c.number, c.graph.buffers, c.graph.placeholders, c.kind)
    wrapper.scalars = dict(zip(c.graph.placeholders, c.example_inputs))
    c.source_code = wrapper.render()
    get_logger("output_code").info("output code for %s:\n%s", c.name, c.source_code)
    if c.trace:
        c.path = c.trace.write("output_code.py", c.source_code)
        c.trace.write_json("kernel_map.json", {k.name: k.fx_nodes for k in c.kernels})


def _build(c):
    module = {"__name__": f"tdbg_output_code_{c.name}"}
    exec(compile(c.source_code, getattr(c, "path", f"<tdbg output code {c.name}>"), "exec"), module)
    from .errors import CppCompileError
    try:
        kernels = module["load"](c.config)
    except CppCompileError as e:
        failed = {k.name: k.fx_nodes for k in c.kernels}
        e.fx_nodes = tuple(fx for name in e.kernels for fx in failed.get(name, ()))
        e.node_source = _first_trace(_node_traces(c.gm), e.fx_nodes)
        raise
    constants = {b.name: b.constant for b in c.graph.graph_inputs if hasattr(b, "constant")}
    c.call = module["make_call"](kernels, constants)


def _node_traces(gm) -> dict:
    return {n.name: n.meta["stack_trace"] for n in gm.graph.nodes if n.meta.get("stack_trace")}


def _first_trace(traces: dict, names) -> str:
    """The stack trace of the earliest of `names` in graph order (`traces` is in that order)."""
    names = set(names)
    return next((trace for n, trace in traces.items() if n in names), "")


STAGES = [
    ("lower", _lower),
    ("check_lowered", _check_lowered),
    ("schedule", _schedule),
    ("check_scheduled", _check_scheduled),
    ("codegen", _codegen),
    ("wrap", _wrap),
    ("build", _build),
]


def _static(example_inputs) -> bool:
    import torch
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            if any(not isinstance(s, int) for s in (*x.shape, *x.stride())):
                return False
        else:   # a Python scalar input would be baked into the kernels as a constant
            return False
    return True


def _node_values(gm):
    import torch
    from .torch_compat import pytree
    vals = [n.meta.get("val") for n in gm.graph.nodes if n.op == "call_function"]
    return [v for v in pytree.tree_leaves(vals) if isinstance(v, (torch.Tensor, torch.SymInt))]


def compile_aten(aten_gm, example_inputs, config=None, *, graph_name="graph", kind="inference",
                 trace: Optional[DebugTrace] = None, static_inputs=None) -> CompiledGraph:
    """Compile an aten-level FX graph into C++ kernels plus a Python wrapper. A graph with
    symbolic shapes compiles once, its kernels taking the sizes as arguments (`_compile_symbolic`),
    else (config.dynamic == "specialize", or it cannot) once per concrete call signature.
    `static_inputs`: the names of the placeholders that are parameters or buffers (default: what
    AOTAutograd's metadata says, when called by it); an inference graph's work on them alone runs
    once per weight version (hoist.py)."""
    config = config or _config.current()
    configure_logging(config)
    from . import build
    build.prepare(config)
    trace = trace or _start_trace(config, graph_name)
    get_logger("graph").info("aten graph %s (%s):%s", graph_name, kind, aten_gm.code.rstrip())
    if kind == "inference" and static_inputs is None:
        static_inputs = static_input_names(aten_gm)
    from .concat_linears import concat_linears
    aten_gm = concat_linears(aten_gm, example_inputs, config, kind, static_inputs)
    hoisted = _hoist(aten_gm, example_inputs, config, kind, static_inputs, trace)
    if hoisted is None:
        return _compile_any(aten_gm, example_inputs, config, graph_name, kind, trace)
    compiled = _compile_any(hoisted.main, list(example_inputs) + hoisted.examples, config, graph_name, kind, trace)
    compiled._call, compiled.hoist = hoisted.wrap(compiled._call), hoisted
    log.info("%s: %d value(s) computed from weights alone, once per weight version (%.1f MiB held): %s",
             graph_name, len(hoisted.names), hoisted.hoisted_bytes / 2**20, ", ".join(hoisted.names))
    return compiled


def _hoist(aten_gm, example_inputs, config, kind, static_inputs, trace):
    """hoist.plan's split of an inference graph, its frontier's example values real or fake as
    the example inputs are; None when off, not inference, or nothing to hoist."""
    if kind != "inference" or not config.hoist_weights:
        return None
    from . import hoist
    from .torch_compat import FakeTensor
    if static_inputs is None:
        static_inputs = static_input_names(aten_gm)
    hoisted = hoist.plan(aten_gm, set(static_inputs))
    if hoisted is None:
        return None
    if not any(isinstance(x, FakeTensor) for x in example_inputs):
        hoisted.examples = hoisted.run_pre([example_inputs[i] for i in hoisted.pre_inputs])
    if trace:
        trace.write("fx_graph_hoisted.py", hoisted.pre.code)
    return hoisted


def static_input_names(aten_gm) -> list:
    """The names of `aten_gm`'s placeholders that are parameters or buffers, as AOTAutograd's
    metadata says while it compiles `aten_gm`; [] outside AOTAutograd. Repro files record them
    (compile_aten's `static_inputs`), so a graph replayed outside Dynamo is compiled the same way."""
    from .torch_compat import TracingContext
    tc = TracingContext.try_get()
    indices = getattr(getattr(tc, "fw_metadata", None), "static_input_indices", None) or ()
    names = [n.name for n in aten_gm.graph.nodes if n.op == "placeholder"]
    return [names[i] for i in indices if i < len(names)]


def _compile_any(aten_gm, example_inputs, config, graph_name, kind, trace) -> CompiledGraph:
    """compile_aten after hoisting: static, symbolic, per-signature or data-dependent paths."""
    spec = _output_spec(aten_gm)
    if not (_static(example_inputs) and _static(_node_values(aten_gm))):
        targets = [str(n.target) for n in aten_gm.graph.nodes if n.op == "call_function"]
        reason = "config.dynamic is 'specialize'"
        if _data_dependent(aten_gm):   # no signature pins these sizes: symbolic, or aten as it is
            compiled = None
            if config.dynamic == "symbolic":
                compiled, reason = _compile_symbolic(aten_gm, example_inputs, config, graph_name, kind, trace, spec)
            if compiled is not None:
                return compiled
            log.info("%s: data-dependent shapes; running the aten graph unchanged (%s)", graph_name, reason)
            return CompiledGraph(graph_name, lambda args: _flat(aten_gm(*args)), spec, kind=kind,
                                 fallback_targets=targets)
        if config.dynamic == "symbolic":
            compiled, reason = _compile_symbolic(aten_gm, example_inputs, config, graph_name, kind, trace, spec)
            if compiled is not None:
                return compiled
        log.info("%s: symbolic shapes or scalar inputs; compiling per concrete signature (%s)", graph_name, reason)
        return CompiledGraph(graph_name, _Specializer(aten_gm, config, graph_name, kind), spec, kind=kind)
    return _compile(aten_gm, example_inputs, config, graph_name, kind, trace, spec)


def _compile_symbolic(aten_gm, example_inputs, config, graph_name, kind, trace, spec):
    """(CompiledGraph, None): `aten_gm` compiled once, its kernels taking the size symbols as
    arguments (ir.ShapeSymbols), valid for every call Dynamo's guards let through; or (None,
    reason) when some step cannot work on symbolic sizes (ir.SymbolicUnsupported, or any other
    failure of this path): the caller falls back to per-signature compilation, so no graph that
    compiled before fails now. Counted in dynamo_counters["tdbg"] ("symbolic_compilations",
    "symbolic_fallbacks") and, per reason, dynamo_counters["tdbg_symbolic_fallbacks"]."""
    from .ir import ShapeSymbols, shape_scope
    from .lowering import COUNTERS
    from .torch_compat import dynamo_counters, shape_env_functions, shape_env_of, sym_expr
    env = shape_env_of(list(example_inputs) + _node_values(aten_gm))
    replace, hint_of = shape_env_functions(env) if env is not None else (None, None)
    shapes = ShapeSymbols(sym_expr, replace, hint_of)
    counted = dict(COUNTERS)   # bisect's counted applications: a failed attempt leaves no trace there
    try:
        with shape_scope(shapes):
            compiled = _compile(aten_gm, example_inputs, config, graph_name, kind, trace, spec)
    except Exception as e:   # noqa: BLE001 -- any failure here has the per-signature path behind it
        COUNTERS.update(counted)
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        log.info("%s: symbolic compilation failed (%s)", graph_name, reason)
        log.debug("%s: where the symbolic compilation failed", graph_name, exc_info=True)
        dynamo_counters["tdbg"]["symbolic_fallbacks"] += 1
        dynamo_counters["tdbg_symbolic_fallbacks"][reason] += 1
        return None, reason
    dynamo_counters["tdbg"]["symbolic_compilations"] += 1
    compiled.size_symbols = {str(ks): str(s) for s, ks in shapes.symbols.items()}
    log.info("%s: compiled once for symbolic sizes %s", graph_name, compiled.size_symbols)
    return compiled, None


def _compile(aten_gm, example_inputs, config, graph_name, kind, trace, spec) -> CompiledGraph:
    """The stages, on a graph with static shapes (Python scalar inputs are baked in), or inside
    an ir.shape_scope on one with symbolic shapes."""
    c = Compilation(aten_gm, example_inputs, config, graph_name, kind, trace)
    if trace:
        from .debug_files import write_graph_files
        write_graph_files(trace, aten_gm, example_inputs)
    from .trace import record_compilation, timed_stage
    from .torch_compat import unset_fake_temporarily
    # AOTAutograd calls us inside its FakeTensorMode; under it every meta tensor lowering makes
    # (view strides, dtype promotion) costs ~1 ms instead of ~50 us. Nothing here needs fakes.
    stage = None
    with unset_fake_temporarily():
        try:
            for stage, fn in STAGES:
                with (trace.stage(stage) if trace else contextlib.nullcontext()), timed_stage(c, stage):
                    fn(c)
            stage = None
        finally:   # also when a stage raised: the debug folder and TORCH_TRACE get what exists
            record_compilation(c, failed_stage=stage)
    lowered = [r["fx_node"] for r in c.graph.lowered]
    fallback_targets = [r["target"] for r in c.graph.fallbacks]
    if config.report_path:
        _report(c)
    log.info("%s: %d kernel(s), %d lowered node(s), %d fallback(s)", graph_name, len(c.kernels), len(lowered),
             len(fallback_targets))
    return CompiledGraph(graph_name, c.call, spec, kernels=[k.name for k in c.kernels], lowered_nodes=lowered,
                         fallback_targets=fallback_targets, source_code=c.source_code,
                         debug_dir=trace.path if trace else None, kind=kind, node_traces=_node_traces(c.gm),
                         kernel_nodes={k.name: k.fx_nodes for k in c.kernels})


def _data_dependent(gm) -> bool:
    from .torch_compat import free_unbacked_symbols
    return any(free_unbacked_symbols(n.meta.get("val")) for n in gm.graph.nodes if "val" in n.meta)


class _Specializer:
    """For graphs with symbolic shapes or Python scalar inputs: one static compilation per
    concrete call signature (shapes, strides, dtypes, scalar values), at most MAX of them;
    after that the aten graph runs unchanged. Thread-safe: a new signature compiles under
    Dynamo's compile lock (one compilation at a time, as Dynamo's own), and the static graph is
    made by `specialize`, not by FX tracing, whose process-wide "tracing" flag made every other
    thread's call of a compiled function raise."""
    MAX = 8

    def __init__(self, gm, config, name, kind):
        self.gm, self.config, self.name, self.kind, self.cache = gm, config, name, kind, {}
        from .trace import current_compile_id
        self.compile_id = current_compile_id()   # TORCH_TRACE files call-time compiles under it

    def __call__(self, args):
        import torch
        key = tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else (type(a), a)
                    for a in args)
        call = self.cache.get(key)
        if call is None:
            call = self._compile(key, args)
        return call(list(args))

    def _compile(self, key, args):
        from .torch_compat import compile_lock
        with compile_lock:
            if key in self.cache:
                return self.cache[key]
            if len(self.cache) >= self.MAX:
                return lambda a: _flat(self.gm(*a))
            static = specialize(self.gm, args)
            from .torch_compat import dynamo_counters   # benchmarks/models.py --dynamic counts them
            dynamo_counters["tdbg"]["static_specializations"] += 1
            name = f"{self.name}_s{len(self.cache)}"
            from .trace import compile_scope
            with compile_scope(self.compile_id):
                compiled = _compile(static, list(args), self.config, name, self.kind,
                                    _start_trace(self.config, name), _output_spec(static))
            self.cache[key] = compiled._call
            return compiled._call


def specialize(gm, args):
    """A copy of `gm` for these concrete `args`: every symbolic size and scalar input replaced by
    its value, every node's meta["val"] a fake tensor of static shape. Runs the graph's ops once
    on fake tensors (no FX tracing, no real computation)."""
    import torch
    from .torch_compat import FakeTensorMode
    from torch.fx.node import map_arg
    graph = torch.fx.Graph()
    remap = {}
    out = graph.graph_copy(gm.graph, remap)
    graph.output(out)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    env, inputs = {}, iter(args)
    value = (lambda a: env.get(a, a) if isinstance(a, torch.fx.Node) else a)
    with mode:
        for node in list(graph.nodes):
            if node.op == "placeholder":
                arg = next(inputs)
                result = mode.from_tensor(arg, static_shapes=True) if isinstance(arg, torch.Tensor) else arg
            elif node.op == "call_function":
                result = node.target(*map_arg(node.args, value), **map_arg(node.kwargs, value))
            elif node.op == "get_attr":
                result = functools.reduce(getattr, node.target.split("."), gm)
                result = mode.from_tensor(result, static_shapes=True) if isinstance(result, torch.Tensor) else result
            else:
                continue
            env[node] = result
            node.meta["val"] = result
            if isinstance(result, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
                concrete = _concrete(result)
                env[node] = node.meta["val"] = concrete
                for user in list(node.users):
                    user.args = map_arg(user.args, lambda n: concrete if n is node else n)
                    user.kwargs = map_arg(user.kwargs, lambda n: concrete if n is node else n)
                if node.op != "placeholder":
                    graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph)


def _concrete(x):
    """An int/float/bool for a value that may be a (backed) symbolic one."""
    import torch
    for kind, cast in ((torch.SymInt, int), (torch.SymFloat, float), (torch.SymBool, bool)):
        if isinstance(x, kind):
            return cast(x)
    return x


def _flat(out):
    from .torch_compat import pytree
    return pytree.tree_flatten(out)[0]


def _output_spec(gm):
    from .torch_compat import pytree
    out = [n for n in gm.graph.nodes if n.op == "output"][0]
    return pytree.tree_flatten(out.args[0])[1]


def _start_trace(config, graph_name):
    if not config.debug:
        return None
    model, _, rest = graph_name.partition("__")
    parts = rest.split("_")
    try:
        n, kind, k = int(parts[0]), parts[1], int(parts[2])
    except (IndexError, ValueError):
        n, kind, k = 0, "inference", 0
    return DebugTrace.start(config, model or graph_name, n, kind, k)


def _report(c):
    kernel_of = {}
    for k in c.kernels:
        for fx in k.fx_nodes:
            kernel_of.setdefault(fx, k.name)
    groups = {k.group_index: k.name for k in c.kernels}
    fusions = [{"index": f["index"], "nodes": f["nodes"], "kernel": kernel_of.get(f["node"])} for f in c.graph.fusions]
    fusions += [{"index": f["index"], "nodes": f["nodes"], "kernel": groups.get(f["group"])} for f in c.fusions]
    line = {"graph": c.name, "kind": c.kind,
            "lowered": [dict(r, kernel=kernel_of.get(r["fx_node"])) for r in c.graph.lowered],
            "fallbacks": c.graph.fallbacks,
            "fusions": sorted(fusions, key=lambda f: f["index"]),
            "kernels": [{"name": k.name, "fx_nodes": k.fx_nodes} for k in c.kernels]}
    # each lowered or fused node's stack trace: bisect names a culprit's own user line from it
    named = {r["fx_node"] for r in c.graph.lowered} | {n for f in fusions for n in f["nodes"]}
    line["traces"] = {n: t for n, t in _node_traces(c.gm).items() if n in named}
    with open(c.config.report_path, "a") as f:
        f.write(json.dumps(line) + "\n")


# ---- Dynamo / AOTAutograd ----------------------------------------------------------------

def _model_name(gm) -> str:
    """The compiled module's class name, else the compiled function's name, else "model"."""
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            return getattr(next(iter(stack.values()))[1], "__name__", "model")
    from .torch_compat import TracingContext
    tc = TracingContext.try_get()
    for code in getattr(tc, "traced_code", None) or []:
        if f"{os.sep}torch{os.sep}" not in code.co_filename:
            return _RESUME.sub(r"\1_at_\2", code.co_name)
    return "model"


# Dynamo's name for the code after a graph break: its graph is named by the user's function and
# the break's line (`train_step_at_12`), as every other output shows frames
_RESUME = re.compile(r"^torch_dynamo_resume_in_(\w+?)_at_(\d+)$")


def make_backend(config=None, inner_compile=None):
    """A Dynamo backend: AOTAutograd with tdbg's decompositions, then `inner_compile` per graph."""
    def backend(gm, example_inputs):
        from .torch_compat import make_boxed_func, min_cut_rematerialization_partition
        from . import build
        from .decompositions import decomposition_table
        cfg = config or _config.current()
        build.prepare(cfg)   # the precompiled prelude builds while AOTAutograd traces
        model, n = _model_name(gm), _graph_number()
        aot_ids = itertools.count()
        compile_one = inner_compile or compile_aten

        def compiler(kind):
            def compile_graph(aten_gm, inputs):
                name = f"{model}__{n}_{kind}_{next(aot_ids)}"
                compiled = compile_one(aten_gm, inputs, cfg, graph_name=name, kind=kind)
                return make_boxed_func(compiled)
            return compile_graph

        return aot(gm, example_inputs, fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                   inference_compiler=compiler("inference"), decompositions=decomposition_table(cfg),
                   partition_fn=min_cut_rematerialization_partition)
    return backend


def aot(gm, example_inputs, **kwargs):
    """What torch._dynamo.backends.common.aot_autograd(**kwargs)(gm, example_inputs) does, without
    its import of Inductor's debug module (0.3-0.5 s once per process, for AOT debug logging):
    nested inputs flattened, the backward compiler and the compiled graph hidden from Dynamo."""
    from .torch_compat import aot_module_simplified, flatten_graph_inputs
    from .torch_compat import dynamo_counters as counters
    from .torch_compat import dynamo_disable as disable
    if any(isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return flatten_graph_inputs(gm, example_inputs, lambda g, inputs: aot(g, inputs, **kwargs))
    bw_compiler = kwargs["bw_compiler"]

    def hidden_bw_compiler(*args, **kw):
        return disable(disable(bw_compiler, reason="do not trace backward compiler function")(*args, **kw),
                       reason="do not trace generated backwards pass")
    counters["aot_autograd"]["total"] += 1
    compiled = aot_module_simplified(gm, example_inputs, **dict(kwargs, bw_compiler=hidden_bw_compiler))
    counters["aot_autograd"]["ok"] += 1
    return disable(compiled, reason="do not trace AOT-compiled graph")


def compile_fx(gm, example_inputs, config=None):
    """The Dynamo backend "tdbg"."""
    return make_backend(config)(gm, example_inputs)


__all__ = ["compile_fx", "make_backend", "compile_aten", "static_input_names", "CompiledGraph", "STAGES"]
