"""Every torch internal tdbg touches: one check per compat entry (compiler/torch_compat.py and
minifier/runs/inductor_hooks.py) that it exists and behaves as tdbg assumes, and a scan of the
sources proving no other module touches torch internals. A new torch release that moves an
internal fails here, naming it. Run on another torch: see docs/compatibility.md."""
import ast
import collections
import importlib
import inspect
import os
import re

import pytest
import torch

from tdbg.compiler import torch_compat
from tdbg.compiler.torch_compat import Entry, Table, TorchCompatError
from tdbg.minifier.runs import inductor_hooks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLES = {"torch_compat": torch_compat.ENTRIES, "inductor_hooks": inductor_hooks.ENTRIES}


def params(fn) -> set:
    return set(inspect.signature(fn).parameters)


# ---- what tdbg assumes of each entry: name -> check(resolved object) ------------------------

@pytest.fixture(scope="module")
def dynamo_seen():
    """What a Dynamo backend sees while it compiles `scaled` (one graph)."""
    seen = {}

    def backend(gm, example_inputs):
        seen["compile_id_object"] = torch_compat.CompileContext.current_compile_id()
        seen["compile_id"] = str(seen["compile_id_object"])
        tc = torch_compat.TracingContext.try_get()
        seen["traced"] = [c.co_name for c in getattr(tc, "traced_code", None) or []]
        seen["frame"] = torch_compat.InstructionTranslator.current_tx().f_code.co_name
        return gm.forward

    def scaled(x):
        return x * 3

    torch.compiler.reset()
    try:
        out = torch.compile(scaled, backend=backend)(torch.ones(2))
    finally:
        torch.compiler.reset()
    assert out.tolist() == [3.0, 3.0]
    return seen


def _check_compile_context(obj, seen):
    assert obj.current_compile_id() is None        # outside a compile
    assert seen["compile_id"] == "0/0"             # first frame, first compile after a reset


def _check_compile_context_manager(fn, seen):
    cid = seen["compile_id_object"]     # outside Dynamo's compile, as trace.compile_scope uses it
    with fn(torch_compat.CompileContext(cid)):
        assert torch_compat.CompileContext.current_compile_id() is cid
    assert torch_compat.CompileContext.current_compile_id() is None


def _check_tracing_context(obj, seen):
    assert obj.try_get() is None
    assert "scaled" in seen["traced"]


def _check_instruction_translator(obj, seen):
    assert seen["frame"] == "scaled"


def _check_compile_lock(lock):
    with lock:          # re-entrant: _Specializer takes it inside a compile that may hold it
        with lock:
            pass


def _check_dynamo_callbacks(handler):
    # tdbg's graph numbers tell a reset by a start callback it registered being gone
    def probe(args):
        pass
    handler.register_start_callback(probe)
    assert probe in handler.start_callbacks
    torch.compiler.reset()
    assert probe not in handler.start_callbacks


def _check_dynamo_disable(disable):
    assert "reason" in params(disable)
    assert disable(lambda x: x + 1, reason="tdbg compat test")(1) == 2


def _check_counters(counters):
    assert isinstance(counters["tdbg_compat_test"], collections.Counter)


def _check_flatten_graph_inputs(fn):
    class M(torch.nn.Module):
        def forward(self, xs):
            return (xs[0] + xs[1],)
    seen = []

    def compile_gm(g, flat_inputs):   # gets the flattened inputs, returns a boxed callable
        seen.append(len(flat_inputs))
        return lambda flat: g(*flat)
    call = fn(torch.fx.symbolic_trace(M()), [[torch.ones(2), torch.ones(2)]], compile_gm)
    assert seen == [2]
    assert call([[torch.ones(2), torch.full((2,), 2.0)]])[0].tolist() == [3.0, 3.0]


def _check_dynamo(mod):
    assert callable(mod.optimize) and callable(mod.reset)


def _check_dynamo_config(cfg):
    assert cfg.repro_after in (None, "dynamo", "aot")


def _check_lookup_backend(fn):
    assert callable(fn("eager")) and callable(fn("inductor"))


def _check_torch_compile_wrapper(cls):
    # own_backend builds a script's torch.compile(backend=..., mode=/options=) as torch.compile does
    seen = []
    wrapper = cls(lambda gm, inputs, **kw: seen.append(kw) or gm, "default", {"x": 1}, None)
    assert wrapper("gm", []) == "gm" and seen == [{"options": {"x": 1}}]


def _check_torch_compile_inductor_wrapper(cls):
    wrapper = cls("reduce-overhead", None, None)
    assert callable(wrapper) and wrapper.config.get("triton.cudagraphs") is True


def _check_list_backends(fn):
    assert {"inductor", "aot_eager", "eager"} <= set(fn(exclude_tags=()))


def _check_backend_compiler_failed(cls):
    assert issubclass(cls, torch_compat.TorchDynamoException)
    inner = ValueError("x")
    try:        # how Dynamo raises it; the runner reads inner_exception
        e = cls(lambda gm, i: None, inner)
    except TypeError:   # newer signature: (backend_fn, inner_exception, traceback)
        e = cls(lambda gm, i: None, inner, None)
    assert e.inner_exception is inner


def _check_dynamo_exception(cls):
    assert issubclass(cls, RuntimeError)


def _check_skip_frame(cls):
    calls = []

    def backend(gm, example_inputs):
        calls.append(1)
        raise cls("tdbg compat test")

    def f(x):
        return x - 1
    torch.compiler.reset()
    try:   # the frame runs eagerly, no error reaches the caller
        assert torch.compile(f, backend=backend)(torch.ones(2)).tolist() == [0.0, 0.0]
    finally:
        torch.compiler.reset()
    assert calls == [1]


def _check_aot_autograd_class(cls):
    fw = object()
    backend = torch_compat.aot_autograd(fw_compiler=fw)
    assert isinstance(backend, cls) and backend.kwargs["fw_compiler"] is fw


def _check_aot_autograd(fn):
    _check_aot_autograd_class(torch_compat.AotAutograd)


def _check_set_logs(fn):
    from tdbg.minifier.runs.runner import TORCH_LOG_CHANNELS
    assert set(TORCH_LOG_CHANNELS) <= params(fn)


def _check_trace_structured(fn):
    assert {"name", "metadata_fn", "payload_fn"} <= params(fn)


def _check_trace_log(log):
    import logging
    assert isinstance(log, logging.Logger) and isinstance(log.handlers, list)


def _check_dynamo_timed(fn):
    assert {"key", "log_pt2_compile_event"} <= params(fn)


def _check_aot_module_simplified(fn):
    kinds = []

    def compiler(kind):
        def compile_graph(gm, inputs):
            kinds.append(kind)
            return torch_compat.make_boxed_func(gm.forward)
        return compile_graph

    class M(torch.nn.Module):
        def forward(self, x):
            return (x.sin() * 2,)
    gm = torch.fx.symbolic_trace(M())
    x = torch.linspace(-1, 1, 5, requires_grad=True)
    compiled = fn(gm, [x], fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                  inference_compiler=compiler("inference"),
                  partition_fn=torch_compat.min_cut_rematerialization_partition,
                  decompositions=torch_compat.get_decompositions([torch.ops.aten.sin]))
    (out,) = compiled(x)
    out.sum().backward()
    assert kinds == ["forward", "backward"]
    torch.testing.assert_close(out, x.detach().sin() * 2)
    torch.testing.assert_close(x.grad, x.detach().cos() * 2)


def _check_functorch_config(cfg):
    with cfg.patch(enable_autograd_cache=False):
        assert cfg.enable_autograd_cache is False


def _check_make_boxed_func(fn):
    f = fn(lambda a, b: a + b)
    assert f._boxed_call is True and f([2, 3]) == 5


def _check_min_cut(fn):
    assert {"joint_module", "num_fwd_outputs"} <= params(fn)


def _check_fake_mode(cls):
    mode = cls(allow_non_fake_inputs=True)
    with mode:
        fake = mode.from_tensor(torch.ones(2, 3), static_shapes=True)
        out = fake + torch.ones(3)       # a real tensor mixed in, as `specialize` does
    assert isinstance(out, torch_compat.FakeTensor) and out.shape == (2, 3)


def _check_fake_tensor(cls):
    assert issubclass(cls, torch.Tensor) and not isinstance(torch.ones(1), cls)


def _check_unset_fake(fn):
    mode = torch_compat.FakeTensorMode()
    with mode:
        with fn():
            real = torch.ones(2) * 2
    assert not isinstance(real, torch_compat.FakeTensor) and real.tolist() == [2.0, 2.0]


def _check_fake_tensor_prop(cls):
    gm = torch.fx.symbolic_trace(lambda x: x.sum(0))
    mode = torch_compat.FakeTensorMode(allow_non_fake_inputs=True)
    cls(gm, mode).propagate(mode.from_tensor(torch.ones(4, 5)))
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "call_method"]
    assert len(vals) == 1 and vals[0].shape == (5,)


def _check_free_unbacked_symbols(fn):
    assert not fn(torch.ones(2))


@pytest.fixture(scope="module")
def shapes_seen():
    """What explain's shapes read from a frame's ShapeEnv (shapes.capture at the backend call,
    shapes.describe after it): a branch on a dynamic size, then a view that specializes it."""
    from tdbg.minifier.diagnose import shapes
    captured = []

    def backend(gm, example_inputs):
        captured.append(shapes.capture(gm, example_inputs))
        return gm.forward

    def branch_then_view(x):
        if x.size(0) > 4:
            return (x * 2).view(4, 6)
        return x

    x = torch.ones(8, 3)
    torch._dynamo.maybe_mark_dynamic(x, 0)
    torch.compiler.reset()
    try:
        torch.compile(branch_then_view, backend=backend)(x)
    finally:
        torch.compiler.reset()
    (one,) = captured
    line = branch_then_view.__code__.co_firstlineno
    return {"captured": one, "described": shapes.describe(one), "if_line": line + 1, "view_line": line + 2}


def _check_shape_env(cls, seen):
    # the attributes describe() reads: guards (with SLoc), replacements and where each was made
    env = seen["captured"]["env"]
    assert isinstance(env, cls)
    assert {"L['x'].size()[0]"} <= set(env.source_to_var)          # keyed by source name
    d = seen["described"]
    assert d["inputs"] == [{"name": "x", "dims": [
        {"dim": 0, "size": 8, "state": "specialized", "symbol": d["inputs"][0]["dims"][0]["symbol"]},
        {"dim": 1, "size": 3, "state": "static", "symbol": None}]}]
    assert [(s["source"], s["value"], s["file"], s["line"], s["code"]) for s in d["specializations"]] == [
        ("x.size()[0]", "8", __file__, seen["view_line"], "return (x * 2).view(4, 6)")]


def _check_shape_guard(cls, seen):
    # ShapeGuard(expr, sloc: SLoc(framework_loc, maybe_user_loc)): the user line as torch formats it
    # ("code  # short/path.py:LINE in fn", path shortened) and the framework function that asked
    assert {"expr", "sloc"} <= set(cls._fields)
    guards = [(g["expr"], g["file"], g["line"], g["framework"]) for g in seen["described"]["guards"]]
    assert guards == [
        ("x.size()[0] > 4", __file__, seen["if_line"], "_dynamo/variables/tensor.py:evaluate_expr"),
        ("Eq(3*x.size()[0], 24)", __file__, seen["view_line"], "_prims_common/__init__.py:infer_size")]


def _check_op_overload(cls):
    assert isinstance(torch.ops.aten.add.Tensor, cls) and not isinstance(torch.ops.aten.add, cls)


def _check_op_overload_packet(cls):
    assert isinstance(torch.ops.aten.add, cls)


def _check_higher_order(cls):
    assert isinstance(torch.ops.higher_order.cond, cls)


def _check_record_function_fast(cls):
    # a kernel's name shows up as its own row in torch.profiler
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as p:
        with cls("graph_0_cpp_fused_probe_0"):
            torch.ones(2).add_(1)
    assert any(e.key == "graph_0_cpp_fused_probe_0" for e in p.key_averages())


def _check_storage_use_count(fn):
    # the output pool reuses a storage only when its own Python storage object is the one holder
    t = torch.ones(3)
    storage = t.untyped_storage()
    assert fn(storage._cdata) == 2            # the storage object and the tensor
    view = t[1:]
    assert fn(storage._cdata) == 3
    del t, view
    assert fn(storage._cdata) == 1


def _check_below_autograd(cls):
    with cls():
        out = torch.ones(2) + 1
    assert out.tolist() == [2.0, 2.0]


def _check_is_alias_of(fn):
    a = torch.ones(4)
    assert fn(a[1:], a) is True and fn(torch.ones(4), a) is False


def _check_has_kernel(fn):
    # add.out has its own CPU kernel; convolution.out is generated (functional op + copy)
    assert fn("aten::add.out", "CPU") is True and fn("aten::convolution.out", "CPU") is False


def _check_elementwise_dtypes(fn):
    kind = torch_compat.ELEMENTWISE_TYPE_PROMOTION_KIND
    assert fn(torch.ones(2, dtype=torch.int32), 1.5, type_promotion_kind=kind.DEFAULT) == (torch.float32,) * 2
    assert fn(torch.ones(2, dtype=torch.int64), type_promotion_kind=kind.INT_TO_FLOAT) == (torch.float32,) * 2


def _check_promotion_kind(kind):
    assert {"DEFAULT", "INT_TO_FLOAT"} <= set(kind.__members__)


def _check_get_decompositions(fn):
    table = fn([torch.ops.aten.addmm])
    assert torch.ops.aten.addmm.default in table


def _check_pytree(pytree):
    leaves, spec = pytree.tree_flatten([1, (2, 3)])
    assert leaves == [1, 2, 3] and pytree.tree_unflatten([4, 5, 6], spec) == [4, (5, 6)]
    assert pytree.tree_leaves({"a": (1, 2)}) == [1, 2]
    assert pytree.tree_map(lambda v: v * 10, (1, [2])) == (10, [20])
    _, tspec = pytree.tree_flatten((7, 8))    # what CompiledGraph reads of an output spec
    assert tspec.type is tuple and tspec.num_children == 2 and tspec.child(0).is_leaf()


def _check_torch_dispatch_mode(mode_type):
    seen = []

    class Record(mode_type):    # what subnormals.census reads: the op's packet name and its tensor args
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((func.overloadpacket.__name__, [a.shape for a in args if isinstance(a, torch.Tensor)]))
            return func(*args, **(kwargs or {}))

    a, b = torch.ones(2, 3), torch.ones(3, 4)
    with Record():
        torch.mm(a, b)
    assert seen == [("mm", [torch.Size([2, 3]), torch.Size([3, 4])])]


def _check_is_functorch_wrapped_tensor(fn):
    seen = []
    torch.vmap(lambda r: seen.append(fn(r)) or r)(torch.ones(2, 3))
    assert seen == [True] and fn(torch.ones(2)) is False


# ---- Inductor's hooks ------------------------------------------------------------------------

def _check_compile_fx(fn):
    assert "inner_compile" in params(fn)


def _check_compile_fx_inner(fn):
    # the annotation is a string under `from __future__ import annotations`: read the TypedDict
    kw = importlib.import_module("torch._inductor.compile_fx")._CompileFxKwargs
    assert {"is_backward", "is_inference"} <= set(params(fn)) | set(kw.__annotations__)


def _check_inductor_config(cfg):
    assert hasattr(cfg.cpp, "inject_relu_bug_TESTING_ONLY") and callable(cfg.patch)


def _check_compiler_bisector(mod):
    b = mod.CompilerBisector
    for name in ("get_subsystem_object", "update_bisect_status", "update_run_state", "update_bisect_range",
                 "get_config_change"):
        assert callable(getattr(b, name)), name
    # optional (torch 2.11 lacks it): torch_probe then reports the culprit without its debug info
    debug_info = getattr(b, "get_call_counter_debug_info", None)
    assert debug_info is None or list(inspect.signature(debug_info).parameters)[-3:] == [
        "backend_name", "subsystem_name", "call_counter"]
    assert hasattr(b, "in_process_cache") and hasattr(b, "bisection_enabled")
    assert callable(mod.get_env_val.cache_clear) and isinstance(mod.subsystem_call_counter, dict)
    assert b.get_subsystem_object("inductor", "post_grad_passes").name == "post_grad_passes"


def _check_cpu_vec_isa(mod):
    assert callable(mod.valid_vec_isa_list)


def _check_inductor_exc(mod):
    # inductor_hooks.cpp_compile_evidence reads the command and the compiler's output
    e = mod.CppCompileError(["g++", "k.cpp"], "k.cpp:1:1: error: x")
    assert (e.cmd, e.output) == (["g++", "k.cpp"], "k.cpp:1:1: error: x") and isinstance(e, Exception)


def _check_cpp_codegen(mod):
    # called once per kernel with (node_schedule, kernel_name): record_kernel_origins wraps it
    hook = getattr(mod, inductor_hooks._KERNEL_HOOK)
    first = list(inspect.signature(hook).parameters)[:2]    # in order (params() is a set)
    assert first == ["node_schedule", "kernel_name"] or getattr(hook, "tdbg_recording", False)
    assert inductor_hooks._KERNEL_HOOK in inspect.getsource(mod.CppScheduling.codegen_comment)


def _check_cache_entries(fn):
    # one entry per compile, each with the code Dynamo runs and its guards as Python text
    def double(x):
        return x * 2

    torch.compiler.reset()
    try:
        compiled = torch.compile(double, backend="eager")
        compiled(torch.ones(3))
        entries = fn(double.__code__)
        assert len(entries) == 1 and isinstance(entries[0].code, type(double.__code__))
        assert any(p.startswith("check_tensor(L['x'], Tensor") for p in entries[0].guard_manager.code_parts)
    finally:
        torch.compiler.reset()


def _check_autograd_cache_log(log):
    # explain --caches: AOTAutograd reports each lookup as an `aotautograd_cache_<state>` artifact
    # with `components`, its key's debug lines. torch 2.13 computes them only when this logger is at
    # DEBUG (caches.py sets it); 2.11 always computes them, and gates nothing on a level
    import logging
    mod = importlib.import_module(inductor_hooks.ENTRIES.entries["autograd_cache_log"].module)
    assert isinstance(log, logging.Logger) and log.name == mod.__name__
    source = inspect.getsource(mod)
    assert set(re.findall(r"log\.isEnabledFor\(([\w.]+)\)", source)) <= {"logging.DEBUG"}
    assert 'f"aotautograd_cache_{cache_state}"' in source
    assert '"components": debug_lines' in source
    # Inductor's FX graph cache: `fx_graph_cache_<state>` artifacts whose payload has the key's components
    assert 'f"fx_graph_cache_{cache_state}"' in inspect.getsource(importlib.import_module("torch._inductor.compile_fx"))
    assert '"components": debug_lines' in inspect.getsource(importlib.import_module("torch._inductor.codecache"))


def _check_inductor_cache_dir(cache_dir):
    import tempfile
    saved = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "c")
        try:
            assert cache_dir() == os.path.join(tmp, "c")
        finally:
            if saved is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved


def _check_dim_dynamic(cls):
    assert {"DYNAMIC", "STATIC"} <= set(cls.__members__)


def _check_stateful_symbolic_context(cls):
    assert {"dynamic_sizes", "constraint_sizes", "tensor_source",
            "shape_env_to_source_to_symbol_cache"} <= params(cls)


def _check_sources(_):
    """ConstantSource, LocalSource, TensorProperty and TensorPropertySource as runtime.py uses them."""
    from tdbg.compiler.torch_compat import ConstantSource, LocalSource, TensorProperty, TensorPropertySource
    assert ConstantSource("s77").name == "s77"
    name = TensorPropertySource(LocalSource("input0"), TensorProperty.SIZE, 1).name
    assert isinstance(name, str) and "input0" in name and "1" in name


def _check_tracing(fn):
    from tdbg.compiler.torch_compat import FakeTensorMode, TracingContext
    with fn(TracingContext(FakeTensorMode())):
        assert TracingContext.try_get() is not None
    assert TracingContext.try_get() is None


CHECKS = {
    "DimDynamic": _check_dim_dynamic, "StatefulSymbolicContext": _check_stateful_symbolic_context,
    "ConstantSource": _check_sources, "LocalSource": _check_sources, "TensorProperty": _check_sources,
    "TensorPropertySource": _check_sources, "tracing": _check_tracing,
    "dynamo_cache_entries": _check_cache_entries,
    "CompileContext": _check_compile_context, "TracingContext": _check_tracing_context,
    "InstructionTranslator": _check_instruction_translator, "compile_context": _check_compile_context_manager,
    "compile_lock": _check_compile_lock, "dynamo_callbacks": _check_dynamo_callbacks,
    "dynamo_disable": _check_dynamo_disable,
    "dynamo_counters": _check_counters, "flatten_graph_inputs": _check_flatten_graph_inputs,
    "dynamo": _check_dynamo, "dynamo_config": _check_dynamo_config, "lookup_backend": _check_lookup_backend,
    "list_backends": _check_list_backends, "TorchCompileWrapper": _check_torch_compile_wrapper, "BackendCompilerFailed": _check_backend_compiler_failed,
    "TorchDynamoException": _check_dynamo_exception, "SkipFrame": _check_skip_frame,
    "AotAutograd": _check_aot_autograd_class, "aot_autograd": _check_aot_autograd, "set_logs": _check_set_logs,
    "trace_structured": _check_trace_structured, "trace_log": _check_trace_log, "dynamo_timed": _check_dynamo_timed,
    "aot_module_simplified": _check_aot_module_simplified, "functorch_config": _check_functorch_config,
    "make_boxed_func": _check_make_boxed_func, "min_cut_rematerialization_partition": _check_min_cut,
    "FakeTensorMode": _check_fake_mode, "FakeTensor": _check_fake_tensor, "unset_fake_temporarily": _check_unset_fake,
    "FakeTensorProp": _check_fake_tensor_prop, "free_unbacked_symbols": _check_free_unbacked_symbols,
    "ShapeEnv": _check_shape_env, "ShapeGuard": _check_shape_guard,
    "OpOverload": _check_op_overload, "OpOverloadPacket": _check_op_overload_packet,
    "HigherOrderOperator": _check_higher_order, "storage_use_count": _check_storage_use_count,
    "AutoDispatchBelowADInplaceOrView": _check_below_autograd, "is_alias_of": _check_is_alias_of,
    "has_kernel_for_dispatch_key": _check_has_kernel, "RecordFunctionFast": _check_record_function_fast,
    "elementwise_dtypes": _check_elementwise_dtypes, "ELEMENTWISE_TYPE_PROMOTION_KIND": _check_promotion_kind,
    "get_decompositions": _check_get_decompositions, "pytree": _check_pytree,
    "TorchDispatchMode": _check_torch_dispatch_mode,
    "is_functorch_wrapped_tensor": _check_is_functorch_wrapped_tensor,
    # inductor_hooks
    "compile_fx": _check_compile_fx, "compile_fx_inner": _check_compile_fx_inner,
    "TorchCompileInductorWrapper": _check_torch_compile_inductor_wrapper,
    "inductor_config": _check_inductor_config, "compiler_bisector": _check_compiler_bisector,
    "cpu_vec_isa": _check_cpu_vec_isa, "inductor_exc": _check_inductor_exc, "cpp_codegen": _check_cpp_codegen,
    "autograd_cache_log": _check_autograd_cache_log, "inductor_cache_dir": _check_inductor_cache_dir,
}
NEEDS_DYNAMO_RUN = {"CompileContext", "TracingContext", "InstructionTranslator", "compile_context"}
NEEDS_SHAPES_RUN = {"ShapeEnv", "ShapeGuard"}
ENTRY_IDS = [(t, n) for t, table in TABLES.items() for n in table.entries]


def test_every_entry_has_exactly_one_check():
    names = [n for _, n in ENTRY_IDS]
    assert len(names) == len(set(names)), "an entry name is in both tables"
    assert set(names) == set(CHECKS)


@pytest.mark.parametrize("table,name", ENTRY_IDS, ids=[n for _, n in ENTRY_IDS])
def test_entry_exists_and_behaves(table, name, request):
    module = {"torch_compat": torch_compat, "inductor_hooks": inductor_hooks}[table]
    obj = getattr(module, name)           # resolved through the module's __getattr__
    assert obj is TABLES[table].resolve(name)
    entry = TABLES[table].entries[name]
    assert entry.checked and all(re.fullmatch(r"2\.\d+\.\d+", v) for v in entry.checked)
    if name in NEEDS_DYNAMO_RUN:
        CHECKS[name](obj, request.getfixturevalue("dynamo_seen"))
    elif name in NEEDS_SHAPES_RUN:
        CHECKS[name](obj, request.getfixturevalue("shapes_seen"))
    else:
        CHECKS[name](obj)


def test_inductor_warm_modules_import():
    for name in inductor_hooks.WARM_MODULES + torch_compat.MINIFY_WARM + torch_compat.RUN_WARM:
        importlib.import_module(name)
    assert set(torch_compat.RUN_WARM) <= set(torch_compat.MINIFY_WARM)


def test_missing_internal_fails_loudly_naming_it():
    table = Table([Entry("gone", "torch._dynamo", "no_such_attribute", "a tdbg feature", ("2.13.0",)),
                   Entry("gone_module", "torch._no_such_module", None, "another feature", ("2.13.0",))])
    with pytest.raises(TorchCompatError) as e:
        table.resolve("gone")
    assert str(e.value) == (f"tdbg needs torch._dynamo.no_such_attribute (a tdbg feature); this torch "
                            f"{torch.__version__} lacks it. tdbg was checked on torch 2.13.0: install one of "
                            f"those, or report this torch version to tdbg.")
    assert isinstance(e.value, ImportError)      # reads like the import it replaces
    assert torch_compat.check_all(table) == [
        str(e.value), f"tdbg needs torch._no_such_module (another feature); this torch {torch.__version__} "
                      f"lacks it. tdbg was checked on torch 2.13.0: install one of those, or report this torch "
                      f"version to tdbg."]
    assert torch_compat.check_all() == [] and torch_compat.check_all(inductor_hooks.ENTRIES) == []


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'no_such_entry'"):
        torch_compat.no_such_entry       # noqa: B018
    assert not hasattr(inductor_hooks, "no_such_entry")


def test_importing_the_compat_modules_imports_no_torch():
    import subprocess
    import sys
    code = ("import sys; import tdbg.compiler.torch_compat, tdbg.minifier.runs.inductor_hooks; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- nothing else touches torch internals --------------------------------------------------

# torch.X._private, torch.utils._private, torch.fx.experimental, torch.fx.passes, functorch;
# dunders (torch.__version__) and op names (torch.ops.aten._to_copy) are public
INTERNAL = re.compile(r"^(torch\.(_(?!_)\w*|utils\._\w+|fx\.experimental|fx\.passes)|functorch)(\.|$)")
SCANNED = ("compiler", "minifier", "cli", "benchmarks", "repro_templates")
COMPAT_MODULES = {"compiler/torch_compat.py", "minifier/runs/inductor_hooks.py"}
# copied verbatim into repro.py files that must run with torch alone (no tdbg import); what it
# touches is covered by entries above (test_runtime_internals_are_covered)
ALLOWED = {"repro_templates/runtime.py"}


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def internal_uses(path: str) -> set:
    """(line, dotted name) of every import of, or attribute chain into, a torch internal."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Attribute):
            names = [_dotted(node) or ""]
        else:
            continue
        found |= {(node.lineno, n) for n in names if INTERNAL.match(n)}
    return found


def _sources():
    for top in SCANNED:
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for f in sorted(files):
                if f.endswith(".py"):
                    yield os.path.relpath(os.path.join(folder, f), ROOT).replace(os.sep, "/")


def test_scanner_finds_each_kind_of_internal_use(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("import torch._dynamo\nfrom functorch.compile import make_boxed_func\n"
                 "x = torch.utils._pytree.tree_leaves\nv = torch.__version__\ny = torch.ops.aten._to_copy\n"
                 "from torch.fx.experimental import symbolic_shapes\n")
    assert {line for line, _ in internal_uses(str(p))} == {1, 2, 3, 6}


def test_no_module_outside_the_compat_modules_touches_torch_internals():
    offenders = [f"{path}:{line}: {name}" for path in _sources() if path not in COMPAT_MODULES | ALLOWED
                 for line, name in sorted(internal_uses(os.path.join(ROOT, path)))]
    assert offenders == [], "use compiler/torch_compat.py (or minifier/runs/inductor_hooks.py):\n" + "\n".join(
        offenders)


def test_compiler_never_touches_inductor():
    uses = [(p, n) for p in _sources() if p.startswith("compiler/")
            for _, n in internal_uses(os.path.join(ROOT, p)) if n.startswith("torch._inductor")]
    assert uses == []
    assert not any(e.module.startswith("torch._inductor") for e in torch_compat.ENTRIES.entries.values())


def test_runtime_internals_are_covered():
    """repro_templates/runtime.py keeps its own imports; each one is an entry checked above."""
    targets = {e.target for t in TABLES.values() for e in t.entries.values()}
    used = {n for _, n in internal_uses(os.path.join(ROOT, "repro_templates/runtime.py"))}
    leaves = {n for n in used if not any(m.startswith(n + ".") for m in used)}   # longest chains only
    assert leaves == {"torch._dynamo.list_backends", "torch._dynamo.lookup_backend",
                      "torch._subclasses.fake_tensor.FakeTensorMode",
                      "torch.fx.passes.fake_tensor_prop.FakeTensorProp", "torch._inductor.compile_fx.compile_fx_inner",
                      # Inductor told to draw eager's random numbers, as the run that dumped the graph
                      "torch._inductor.config",
                      # a saved graph recompiled with its symbolic sizes
                      "torch.fx.experimental.symbolic_shapes.ShapeEnv",
                      "torch.fx.experimental.symbolic_shapes.DimDynamic",
                      "torch.fx.experimental.symbolic_shapes.StatefulSymbolicContext",
                      "torch._dynamo.source.ConstantSource", "torch._dynamo.source.LocalSource",
                      "torch._dynamo.source.TensorProperty", "torch._dynamo.source.TensorPropertySource",
                      "torch._guards.TracingContext", "torch._guards.tracing"}
    assert leaves <= targets


def test_a_missing_torch_internal_is_tdbg_s_failure_never_a_stage_of_the_user_s_program():
    """A backend failing because this torch lacks an internal must not be blamed on a compile
    stage or the user's backend (bisect would then hunt a culprit in a healthy graph)."""
    from tdbg.minifier.runs.instrument import compile_stage, runtime_stage
    missing = TorchCompatError("tdbg needs torch._dynamo.x (why); this torch 2.99 lacks it.")
    try:
        try:
            raise missing
        except TorchCompatError as cause:
            raise RuntimeError("backend='tdbg' raised") from cause
    except RuntimeError as wrapped:
        assert [compile_stage(wrapped, kind) for kind in ("inductor", "aot_eager", "backend")] == ["internal"] * 3
        assert runtime_stage(wrapped) == "internal"
    assert runtime_stage(RuntimeError("the user's own bug")) == "backend"
