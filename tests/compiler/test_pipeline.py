"""compile_aten end to end on make_fx graphs: the seed graph, counted knobs, injected bugs,
the debug trace, report lines, the standalone output_code.py, and typed errors."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table
from tdbg.compiler.errors import CppCompileError, KernelRuntimeError, LoweringError


def foo1(x1, x2):
    return torch.cat([torch.maximum(x2, torch.neg(x1))], dim=0)


@pytest.fixture(scope="module")
def seed():
    torch.manual_seed(0)
    x1 = torch.randint(256, (1, 8), dtype=torch.uint8)
    x2 = torch.randint(256, (8390, 8), dtype=torch.uint8)
    return make_fx(foo1)(x1, x2), [x1, x2]


def compile_seed(seed, **cfg):
    lowering.reset_counters()
    gm, inputs = seed
    return compile_aten(gm, inputs, current().replace(**cfg), graph_name="foo1__0_inference_0")


def test_seed_graph_is_one_kernel_and_matches_eager(seed):
    compiled = compile_seed(seed)
    assert compiled.kernels == ["cpp_fused_cat_maximum_neg_0"]
    assert compiled.lowered_nodes == ["neg", "maximum", "cat"]
    assert compiled.fallback_targets == []
    x1, x2 = seed[1]
    assert torch.equal(compiled(x1, x2), foo1(x1, x2))
    small = torch.randint(256, (1, 8), dtype=torch.uint8)
    gm = make_fx(foo1)(small, small)
    assert torch.equal(compile_aten(gm, [small, small], current())(small, small), foo1(small, small))


def test_uint8_neg_wraps_around(seed):
    compiled = compile_seed(seed)
    x1 = torch.tensor([[0, 1, 2, 127, 128, 200, 254, 255]], dtype=torch.uint8)
    x2 = torch.zeros((8390, 8), dtype=torch.uint8)
    assert compiled(x1, x2)[0].tolist() == [0, 255, 254, 129, 128, 56, 2, 1]


def test_fallback_ops_sends_neg_to_aten(seed):
    compiled = compile_seed(seed, fallback_ops=frozenset({"neg"}))
    assert compiled.fallback_targets == ["aten.neg.default"]
    assert "neg" not in compiled.lowered_nodes
    assert compiled.kernels == ["cpp_fused_cat_maximum_0"]
    assert torch.equal(compiled(*seed[1]), foo1(*seed[1]))


def test_max_lowered_ops_lowers_only_the_first_nodes(seed):
    compiled = compile_seed(seed, max_lowered_ops=1)
    assert compiled.lowered_nodes == ["neg"]
    assert compiled.fallback_targets == ["aten.maximum.default", "aten.cat.default"]
    assert torch.equal(compiled(*seed[1]), foo1(*seed[1]))


@pytest.mark.parametrize("cfg", [dict(max_fusions=0), dict(fusion=False)], ids=["max_fusions=0", "fusion=False"])
def test_no_fusion_gives_one_kernel_per_node(seed, cfg, tmp_path):
    report = tmp_path / "report.jsonl"
    compiled = compile_seed(seed, report_path=str(report), **cfg)
    assert compiled.kernels == ["cpp_fused_neg_0", "cpp_fused_maximum_1", "cpp_fused_cat_2"]
    assert torch.equal(compiled(*seed[1]), foo1(*seed[1]))
    line = json.loads(report.read_text())
    assert line["fusions"] == []


def test_max_fusions_counts_decisions(seed, tmp_path):
    report = tmp_path / "report.jsonl"
    compiled = compile_seed(seed, max_fusions=1, report_path=str(report))
    assert compiled.kernels == ["cpp_fused_maximum_neg_0", "cpp_fused_cat_1"]
    line = json.loads(report.read_text())
    assert [f["index"] for f in line["fusions"]] == [0]
    assert line["fusions"][0]["nodes"] == ["neg", "maximum"]


def test_report_line(seed, tmp_path):
    report = tmp_path / "report.jsonl"
    compile_seed(seed, report_path=str(report))
    line = json.loads(report.read_text())
    assert line["graph"] == "foo1__0_inference_0" and line["kind"] == "inference"
    assert [(r["index"], r["fx_node"], r["kernel"]) for r in line["lowered"]] == [
        (0, "neg", "cpp_fused_cat_maximum_neg_0"), (1, "maximum", "cpp_fused_cat_maximum_neg_0"),
        (2, "cat", "cpp_fused_cat_maximum_neg_0")]
    assert line["kernels"] == [{"name": "cpp_fused_cat_maximum_neg_0", "fx_nodes": ["cat", "maximum", "neg"]}]
    assert [f["index"] for f in line["fusions"]] == [0, 1]


def test_inject_compile_error(seed):
    with pytest.raises(CppCompileError) as info:
        compile_seed(seed, inject_bug=("neg", "compile_error"))
    assert "tdbg_injected_compile_error_neg" in info.value.stderr and "error:" in info.value.stderr
    assert info.value.kernels == ("cpp_fused_cat_maximum_neg_0",)
    assert "neg" in info.value.fx_nodes and os.path.exists(info.value.source_path)


def test_inject_runtime_error(seed):
    compiled = compile_seed(seed, inject_bug=("neg", "runtime_error"))
    with pytest.raises(KernelRuntimeError) as info:
        compiled(*seed[1])
    assert info.value.kernel == "cpp_fused_cat_maximum_neg_0" and info.value.fx_nodes == ("neg",)


def test_inject_accuracy_makes_neg_double(seed):
    compiled = compile_seed(seed, inject_bug=("neg", "accuracy"))
    x1, x2 = seed[1]
    assert torch.equal(compiled(x1, x2), torch.maximum(x2, x1 * 2))
    assert not torch.equal(compiled(x1, x2), foo1(x1, x2))


def test_inject_bug_ignores_ops_that_fell_back(seed):
    compiled = compile_seed(seed, inject_bug=("neg", "accuracy"), fallback_ops=frozenset({"aten.neg.default"}))
    assert torch.equal(compiled(*seed[1]), foo1(*seed[1]))


def test_inject_crash_segfaults_in_a_subprocess(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent("""
        import torch
        from torch.fx.experimental.proxy_tensor import make_fx
        from tdbg.compiler import compile_aten
        from tdbg.compiler.config import current
        x = torch.randn(4, 4)
        gm = make_fx(lambda x: torch.neg(x) + 1)(x)
        compile_aten(gm, [x], current().replace(inject_bug=("neg", "crash")))(x)
        print("survived")
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGSEGV, proc.stderr[-2000:]
    assert "survived" not in proc.stdout


def test_debug_trace_and_output_code_module(seed, tmp_path):
    compiled = compile_seed(seed, debug=True, debug_dir=str(tmp_path / "dbg"))
    d = compiled.debug_dir
    assert d.endswith(os.path.join("compiler", "foo1__0_inference_0"))
    for name in ("fx_graph_readable.py", "fx_graph_runnable.py", "fx_graph_transformed.py", "ir_pre_fusion.txt",
                 "ir_post_fusion.txt", "output_code.py", "kernel_map.json", "debug.log"):
        assert os.path.getsize(os.path.join(d, name)) > 0, name
    code = open(os.path.join(d, "output_code.py")).read()
    assert "// FX: neg = torch.ops.aten.neg.default(x1_1)" in code
    assert json.load(open(os.path.join(d, "kernel_map.json"))) == {"cpp_fused_cat_maximum_neg_0": ["cat", "maximum", "neg"]}
    stages = [line.split()[0] for line in open(os.path.join(d, "debug.log"))]
    assert stages == ["lower", "check_lowered", "schedule", "check_scheduled", "codegen", "wrap", "build"]
    post = open(os.path.join(d, "ir_post_fusion.txt")).read()
    assert "reads: ['x1_1', 'x2_1']" in post and "neg(" in post
    namespace = {"__name__": "output_code"}
    exec(compile(code, "output_code.py", "exec"), namespace)   # what `python output_code.py` runs
    call = namespace["make_call"](namespace["load"]())
    assert torch.equal(call(list(seed[1]))[0], foo1(*seed[1]))


def test_lowering_bug_raises_lowering_error(monkeypatch):
    x = torch.randn(3, 4)
    gm = make_fx(lambda x: torch.exp(x) * 2)(x)

    def broken(g, node, *args, **kwargs):
        raise ValueError("boom")
    monkeypatch.setitem(lowering.LOWERINGS, torch.ops.aten.exp.default, broken)
    with pytest.raises(LoweringError) as info:
        compile_aten(gm, [x], current())
    ev = info.value.evidence()
    assert ev["fx_node"] == "exp" and ev["target"] == "aten.exp.default" and ev["inputs"] == ["(3, 4):torch.float32"]
    assert "boom" in ev["message"]


def test_unlowered_ops_become_extern_calls():
    x, w = torch.randn(4, 40), torch.randn(40, 3)   # cumsum over 40 > lowering_scan.SCAN_UNROLL: aten
    fn = lambda x, w: (torch.relu(x @ w) + 1, torch.cumsum(x, 1))  # noqa: E731
    compiled = compile_aten(make_fx(fn)(x, w), [x, w], current())
    assert compiled.fallback_targets == ["aten.mm.default", "aten.cumsum.default"]
    assert compiled.kernels == ["cpp_fused_add_relu_0"]
    for got, want in zip(compiled(x, w), fn(x, w)):
        torch.testing.assert_close(got, want)


def test_reductions_views_and_data_movement_match_eager():
    torch.manual_seed(0)
    x, y, i = torch.randn(6, 10), torch.randn(10, 6), torch.randint(0, 6, (5,))
    fn = lambda x, y, i: (  # noqa: E731
        x.sum(1), x.mean(0, keepdim=True), x.amax(1), x.argmax(0), x.max(1), x.var(1), x.prod(0),
        torch.softmax(x, 1), x.t() + y, x[:, 2:8:2] * 2, x.view(2, 3, 10).sum(1), torch.cat([x, y.t()], 1),
        torch.nn.functional.pad(x, (1, 2, 0, 1), value=-1.0), x.index_select(0, i), torch.arange(7) * 3,
        torch.where(x > 0, x, y.t()), torch.nn.functional.embedding(i, y))
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(x, y, i)
    compiled = compile_aten(gm, [x, y, i], current())
    assert compiled.fallback_targets == []
    got, want = torch.utils._pytree.tree_leaves(compiled(x, y, i)), torch.utils._pytree.tree_leaves(fn(x, y, i))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_input_strides_different_from_compiled_ones_are_handled():
    x = torch.randn(5, 7)
    compiled = compile_aten(make_fx(lambda x: x * 2)(x), [x], current())
    xt = torch.randn(7, 5).t()
    torch.testing.assert_close(compiled(xt), xt * 2)


def test_symbolic_shapes_and_scalar_inputs_compile_per_concrete_signature():
    torch._dynamo.reset()
    fn = lambda x, s: torch.relu(x).sum(1) * s + x.shape[0]  # noqa: E731
    compiled = torch.compile(fn, backend="tdbg")
    for n in (4, 8, 16, 8):   # the third call makes Dynamo go dynamic
        x = torch.randn(n, 3)
        torch.testing.assert_close(compiled(x, 2.5), fn(x, 2.5))
    torch._dynamo.reset()


def test_numpy_is_a_runtime_dependency_and_torch_finds_it():
    """Without numpy torch prints "Failed to initialize NumPy" on every run (issue 11 item 3)."""
    import importlib.metadata
    import subprocess
    import sys
    assert "numpy" in [r.split(";")[0].strip() for r in importlib.metadata.requires("tdbg")]
    proc = subprocess.run([sys.executable, "-c", "import torch; print(torch.zeros(2).numpy().sum())"],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, "NumPy" in proc.stderr) == (0, "0.0\n", False), proc.stderr


def test_graphs_after_a_graph_break_are_named_by_the_users_function_and_line():
    """Dynamo names the code after a break `torch_dynamo_resume_in_f_at_N`; tdbg's graph names
    (debug folders, trace files, bisect's `graph:`) say `f_at_N`, as every other output does."""
    import torch
    from tdbg.compiler import make_backend
    names = []

    def record(gm, inputs, cfg, graph_name, kind):
        names.append(graph_name)
        return gm

    def stepwise(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()
    torch.compiler.reset()
    try:
        torch.compile(stepwise, backend=make_backend(inner_compile=record))(torch.ones(3))
    finally:
        torch.compiler.reset()
    line = stepwise.__code__.co_firstlineno + 2
    assert [n.rsplit("__", 1)[0] for n in names] == ["stepwise", f"stepwise_at_{line}"], names
