"""Graphs with symbolic shapes compile ONCE into kernels whose sizes are arguments (issue 23
item 1): each graph below runs under torch.compile(dynamic=True) (and the default automatic
dynamic) on sizes 2, 7, 17, 64 and 1000 (not multiples of any vector width; 1 Dynamo
specializes), matches eager within float32's usual bounds (torch.testing's defaults), compiles
one symbolic graph and no static specialization, and its kernels take `int64_t ks<i>` arguments
instead of literal sizes. What cannot compile symbolically falls back to per-signature
compilation with its reason counted."""
import re

import pytest
import torch
import torch.nn.functional as F

from tdbg.compiler.ir import SymbolicUnsupported, reshape_reindex, ShapeSymbols, shape_scope
from tdbg.compiler.wrapper import pysize
from helpers import compile_capturing

SIZES = (2, 7, 17, 64, 1000)


def _counters():
    from torch._dynamo.utils import counters
    return counters


def run_dynamic(fn, make_args, sizes=SIZES, dynamo_dynamic=True, **cfg):
    """fn compiled by tdbg (capturing each CompiledGraph), called on make_args(n) for each n,
    checked against eager; returns the compiled graphs."""
    compiled, graphs = compile_capturing(fn, dynamo_dynamic, **cfg)
    for n in sizes:
        args = make_args(n)
        assert_matches(compiled(*args), fn, args)
    torch._dynamo.reset()
    return graphs


def assert_matches(out, fn, args):
    """Within float32's usual bounds of eager (torch.testing's rtol 1.3e-6, atol 1e-5) from the
    float64 result, or at most twice eager's own distance from it (sums over 1000 rows round
    differently in any order); where fn cannot run in float64, within those bounds of eager."""
    from torch.utils._pytree import tree_leaves
    expected = fn(*args)
    try:
        reference = tree_leaves(fn(*[a.double() for a in args]))
    except RuntimeError:   # float32 weights in the closure
        torch.testing.assert_close(out, expected)
        return
    for o, e, r in zip(tree_leaves(out), tree_leaves(expected), reference, strict=True):
        assert o.shape == e.shape and o.dtype == e.dtype
        if o.numel() == 0:
            continue
        bound = torch.maximum(2 * (e.double() - r).abs(), 1e-5 + 1.3e-6 * r.abs())
        excess = ((o.double() - r).abs() - bound).max().item()
        assert excess <= 0, f"{excess} beyond the bound for shape {tuple(o.shape)}"


def assert_one_symbolic(graphs, static=0):
    """Exactly one symbolic compilation after `static` static ones, no per-signature copies, and
    kernels whose C++ takes size symbols (and no literal of a size that was called)."""
    counters = _counters()["tdbg"]
    assert (counters["symbolic_compilations"], counters["static_specializations"],
            counters["symbolic_fallbacks"]) == (1, 0, 0)
    assert len(graphs) == static + 1
    g = graphs[-1]
    assert g.size_symbols and g.kernels
    kernels = re.findall(r'extern "C" int \w+\(([^)]*)\)', g.source_code)
    assert len(kernels) == len(g.kernels)
    assert any("int64_t ks0" in params for params in kernels)
    return g


def _rows(n):
    return (torch.randn(n, 768),)


def test_pointwise_chain():
    g = assert_one_symbolic(run_dynamic(lambda x: torch.tanh(x * 2 + 1).sigmoid() - x.abs(), _rows))
    assert "1000" not in g.source_code and "< 17" not in g.source_code
    # `python output_code.py` runs on random inputs of the example's sizes (no symbol there;
    # dynamic=True makes both dims symbolic, passed as SymInt inputs too)
    assert "\nINPUTS = [2, 768, ((2, 768), (768, 1), torch.float32)]\n" in g.source_code


def test_broadcasting_add_of_a_row_vector():
    b = torch.randn(768)
    assert_one_symbolic(run_dynamic(lambda x: torch.relu(x + b) * b, _rows))


@pytest.mark.parametrize("name,fn", [
    ("softmax_static_dim", lambda x: x.softmax(-1)),
    ("softmax_symbolic_dim", lambda x: x.softmax(0)),
    ("layer_norm", lambda x: F.layer_norm(x, (768,))),
    ("sum_symbolic_dim", lambda x: x.sum(0)),
    ("sum_static_dim", lambda x: x.sum(1)),
    ("mean_both", lambda x: x.mean(0, keepdim=True) + x.mean(1, keepdim=True)),
])
def test_reductions(name, fn):
    assert_one_symbolic(run_dynamic(fn, _rows))


def test_reductions_over_a_symbolic_inner_dim():
    """Both dims symbolic: the rows' length is a kernel argument too (loops bounded by ks<i>)."""
    g = assert_one_symbolic(run_dynamic(lambda x: x.softmax(-1) + x.mean(-1, keepdim=True),
                                        lambda n: (torch.randn(3, n),)))
    assert "< ks" in g.source_code


def test_views_with_symbolic_sizes():
    def fn(x):   # [s0*12, 64] <-> [s0, 12, 64]
        y = (x.view(-1, 12, 64) * 2).transpose(0, 1)
        return y.reshape(12, -1).cos(), x.view(-1, 12, 64).sum(1)
    assert_one_symbolic(run_dynamic(fn, lambda n: (torch.randn(n * 12, 64),)))


def test_cat():
    assert_one_symbolic(run_dynamic(lambda x, y: torch.cat([x.sin(), y * 2], 0).relu(),
                                    lambda n: (torch.randn(n, 32), torch.randn(5, 32))))


def test_attention_block():
    torch.manual_seed(0)
    wq, wk, wv = (torch.randn(64, 64) * 0.1 for _ in range(3))

    def attention(x):   # [batch 3, length s0, 64], 4 heads
        b, s, _ = x.shape
        q, k, v = ((x @ w).view(b, s, 4, 16).transpose(1, 2) for w in (wq, wk, wv))
        p = (q @ k.transpose(-1, -2) / 4.0).softmax(-1)
        return F.layer_norm((p @ v).transpose(1, 2).reshape(b, s, 64) + x, (64,))
    graphs = run_dynamic(attention, lambda n: (torch.randn(3, n, 64),), sizes=(2, 7, 17, 64, 300))
    assert_one_symbolic(graphs)


def test_automatic_dynamic_compiles_once_more_for_every_later_size():
    """The default (dynamic=None): a static graph for the first size, then one symbolic graph
    serves every other size."""
    graphs = run_dynamic(lambda x: x.softmax(-1) * 3, _rows, sizes=(7, 17, 64, 1000, 2), dynamo_dynamic=None)
    assert_one_symbolic(graphs, static=1)


def test_specialize_knob_keeps_the_per_signature_path():
    graphs = run_dynamic(lambda x: x.softmax(-1), _rows, sizes=(2, 7, 17), dynamic="specialize")
    assert len(graphs) == 1 and _counters()["tdbg"]["static_specializations"] == 3


def test_what_cannot_compile_symbolically_falls_back_with_its_reason(monkeypatch):
    """A lowering that cannot work on symbolic sizes (here: sin's, made to refuse them) sends
    its graph to the per-signature path: counted with its reason, values still right."""
    from tdbg.compiler import ir
    from tdbg.compiler.lowering import LOWERINGS
    sin = torch.ops.aten.sin.default
    static_lowering = LOWERINGS[sin]

    def refuses_symbolic(g, node, *args, **kwargs):
        if ir.current_shapes() is not None:
            raise ir.SymbolicUnsupported("sin: test refusal")
        return static_lowering(g, node, *args, **kwargs)
    monkeypatch.setitem(LOWERINGS, sin, refuses_symbolic)
    graphs = run_dynamic(lambda x: x.sin() * 2, _rows, sizes=(2, 7, 17))
    counters = _counters()
    assert (counters["tdbg"]["symbolic_fallbacks"], counters["tdbg"]["static_specializations"],
            counters["tdbg"]["symbolic_compilations"], len(graphs)) == (1, 3, 0, 1)
    assert dict(counters["tdbg_symbolic_fallbacks"]) == {"SymbolicUnsupported: sin: test refusal": 1}


def test_random_ops_in_kernels_compile_symbolically():
    """Dropout's Philox offsets are the element's linear index over symbolic sizes."""
    torch._dynamo.reset()
    _counters().clear()
    compiled = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="tdbg", dynamic=True)
    for n in (2, 7, 17, 64):
        x = torch.randn(n, 40) + 3   # no element is 0
        out = compiled(x)
        assert bool(((out == 0) | (out == 2 * x)).all()) and 0 < int((out == 0).sum()) < out.numel()
    torch._dynamo.reset()
    assert _counters()["tdbg"]["symbolic_compilations"] == 1


def test_reshape_groups_must_hold_for_every_size():
    """[a, 3b] -> [b, 3a] with hints a == b == 2: the dims pair up by their hints only, not for
    every size, so the remap is refused (a wrong one would be silent)."""
    import sympy
    a, b = (sympy.Symbol(n, integer=True, positive=True) for n in ("ks0", "ks1"))
    shapes = ShapeSymbols()
    shapes.hints.update({a: 2, b: 2})
    with shape_scope(shapes):
        with pytest.raises(SymbolicUnsupported, match="no exact dim grouping"):
            reshape_reindex([a, b * 3], [b, a * 3])
        remap = reshape_reindex([a * 12, 64], [a, 12, 64])   # an exact grouping is kept
        i = [sympy.Symbol(f"x{k}", integer=True, nonnegative=True) for k in range(3)]
        assert remap(i) == [12 * i[0] + i[1], i[2]]


def test_pysize_spells_floor_division_and_remainder():
    import sympy
    from tdbg.compiler.ir import FloorDiv, ModIndex
    k = sympy.Symbol("ks0", integer=True, positive=True)
    assert pysize(ModIndex(FloorDiv(k * 3, 2), k)) == "(((3*ks0) // 2) % ks0)"


def test_symbolic_kernels_vectorize_as_static_ones():
    """Regression: a store index holding a size symbol (x0*ks0) was taken for a computed index
    and LayerNorm's normalizing loop lost its `omp simd`. Size symbols are loop invariants."""
    fn = lambda x: F.layer_norm(x, (32,)) * 2   # noqa: E731
    static = run_dynamic(fn, lambda n: (torch.randn(n, 32),), sizes=(7,), dynamo_dynamic=False)[-1]
    symbolic = assert_one_symbolic(run_dynamic(fn, lambda n: (torch.randn(n, 32),), sizes=(7, 17)))
    count = lambda g: g.source_code.count("#pragma omp simd")   # noqa: E731
    assert count(symbolic) == count(static) >= 2


def test_training_forward_and_backward_compile_once_each():
    """A forward and its backward (the backward reads saved sizes the forward returns as ints)."""
    torch._dynamo.reset()
    _counters().clear()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32))
    step = lambda m, x: m(x).softmax(-1).mul(torch.arange(32.0)).sum()   # noqa: E731
    compiled = torch.compile(step, backend="tdbg", dynamic=True)
    for n in (2, 7, 17, 64):
        x = torch.randn(n, 16)
        net.zero_grad()
        step(net, x).backward()
        expected = [p.grad.clone() for p in net.parameters()]
        net.zero_grad()
        compiled(net, x).backward()
        for got, want in zip([p.grad for p in net.parameters()], expected, strict=True):
            # weight gradients sum over the rows in another order than eager: rtol 1e-4
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
    counters = _counters()["tdbg"]
    assert (counters["symbolic_compilations"], counters["static_specializations"],
            counters["symbolic_fallbacks"]) == (2, 0, 0)


def test_sizes_in_cpp_never_use_pythons_floor_division():
    """`//` starts a C++ comment: a size printed by Python's str (ShapeEnv's FloorDiv prints as
    `ks0//12`) would cut a loop bound off. csize spells it as C++ division."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv as ShapeEnvFloorDiv
    from tdbg.compiler.ir import csize
    k = sympy.Symbol("ks0", integer=True, positive=True)
    size = ShapeEnvFloorDiv(k, 12) * 64
    assert "//" in str(size)
    assert csize(size) == "(64*(ks0 / 12))" and csize(7) == "7"


def test_linears_with_symbolic_rows_run_unpacked():
    """A packed weight serves one row count: packed at every new length it would cost more
    than it saves, so a symbolic row count keeps the plain GEMM (a static one is packed); the
    relu after it adds the bias (bias_epilogue.py), so that GEMM is an mm."""
    from tdbg.compiler import prepack
    if not prepack.mkl_available():
        pytest.skip("no MKL: nothing is packed")
    torch.manual_seed(0)
    lin = torch.nn.Linear(128, 256)
    fn = lambda x: lin(x).relu()   # noqa: E731
    with torch.no_grad():
        static = run_dynamic(fn, lambda n: (torch.randn(n, 128),), sizes=(9,), dynamo_dynamic=False)[-1]
        symbolic = assert_one_symbolic(run_dynamic(fn, lambda n: (torch.randn(n, 128),), sizes=(9, 17, 64)))
    assert "_packed.linear" in static.source_code
    assert "_packed" not in symbolic.source_code and "aten.mm.default(" in symbolic.source_code


def test_a_symbolic_graph_recycles_its_large_buffers_and_grows_them_for_a_larger_call():
    """The buffer pool plans on the example's bytes and checks each reuse against the call's: a
    larger call allocates (never writes past a kept storage), a smaller one reuses, and results
    the caller still holds are never overwritten."""
    def fn(x):
        h = torch.tanh(x) * 2
        return torch.softmax(h, -1) + 1, h * h
    compiled, graphs = compile_capturing(fn)
    kept = []
    for n in (400, 2000, 64):    # results dropped: each call may reuse the last one's storages
        x = torch.randn(n, 768)
        assert_matches(compiled(x), fn, (x,))
        kept.append(len(graphs[-1]._call.pool))
    # 2000 rows do not fit the example's storages: new ones beside them (not those grown in place
    # by set_, which changes their pointers); 64 rows reuse one
    assert kept[1] == 2 * kept[0] and kept[2] == kept[1] and kept[0] >= 1
    held = []
    for n in (400, 600, 64, 2000, 64, 600):   # results held: never written over
        x = torch.randn(n, 768)
        out = compiled(x)
        assert_matches(out, fn, (x,))
        held.append(([o.clone() for o in out], out))
    torch._dynamo.reset()
    g = assert_one_symbolic(graphs)
    assert "_BufferPool(" in g.source_code and "exact=False" in g.source_code
    for copies, out in held:              # what the caller kept is unchanged
        for c, o in zip(copies, out):
            assert torch.equal(c, o)
    assert len(g._call.pool) >= 1


def test_advanced_indexing_with_symbolic_sizes_compiles_once():
    """index.Tensor's broadcast of its index tensors' sizes was torch.broadcast_shapes, which takes
    ints only: GPT-2's symbolic graph fell back to per-signature copies (8, then aten unfused)."""
    def fn(x):
        n, i = x.shape[0], (x[:, 0] > 0).long()        # data-dependent indices in 0..1
        return x[torch.arange(n - 1, -1, -1), i] * 2 + 1, x[i[:, None], i[None, :2]]

    def args(n):
        return (torch.randn(n, 8),)
    g = assert_one_symbolic(run_dynamic(fn, args, sizes=(2, 7, 17, 64)))
    assert not g.fallback_targets


def _data_dependent(fn):
    """fn compiled by tdbg with Dynamo capturing data-dependent output shapes and .item()."""
    return torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True)(fn)


@_data_dependent
def test_data_dependent_sizes_compile_once_and_are_read_after_the_call_that_makes_them():
    """x[x > 0] has a size no input pins (unbacked): the kernels after it take it as ks<i>, read
    from the index call's output; empty and full selections run the same compiled graph."""
    def fn(x):
        y = x[x > 0]
        return (y.sin() * 2).sum(), y.exp() - 1
    compiled, graphs = compile_capturing(fn, dynamo_dynamic=None)
    base = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    for x in (base, -base.abs() - 1, base.abs() + 1, base[:37]):
        assert_matches(compiled(x), fn, (x,))
    torch._dynamo.reset()
    counters = _counters()["tdbg"]
    assert (counters["symbolic_compilations"], counters["symbolic_fallbacks"]) == (2, 0)   # 1000, then 37 too
    g = graphs[0]
    assert len(g.kernels) == 3 and "ks0 = buf1.size(0)  # data-dependent" in g.source_code
    assert g.source_code.index("aten.index.Tensor") < g.source_code.index("ks0 = buf1.size(0)")


@_data_dependent
def test_a_size_computed_from_a_value_is_refused_and_the_graph_runs_through_aten():
    """x[:n.item()]: the size comes from a value, not a tensor's shape; no compiled graph can read
    it, so the graph runs its aten ops unchanged, with the reason counted."""
    def fn(x, n):
        return x[:int(n.item())].cos() + 1
    compiled, graphs = compile_capturing(fn, dynamo_dynamic=None)
    x = torch.randn(100)
    for n in (17, 0, 100):
        assert_matches(compiled(x, torch.tensor(n)), fn, (x, torch.tensor(n)))
    torch._dynamo.reset()
    assert _counters()["tdbg"]["symbolic_fallbacks"] >= 1 and not graphs[0].kernels
    assert any("no input's size" in r for r in _counters()["tdbg_symbolic_fallbacks"])


@_data_dependent
def test_a_size_check_on_a_data_dependent_size_is_checked_by_the_compiled_graph():
    """torch._check on a data-dependent size is a runtime assert in the graph: the compiled graph
    raises where eager does, once the size is read (checks that hold for every size, as
    Dynamo's u0 >= 0, are not emitted)."""
    def fn(x):
        y = x[x > 0]
        torch._check(y.size(0) >= 3)
        return y * 2
    compiled, graphs = compile_capturing(fn, dynamo_dynamic=None)
    x = torch.tensor([1.0, -2.0, 3.0, 4.0, -5.0])
    assert_matches(compiled(x), fn, (x,))
    with pytest.raises(RuntimeError):
        compiled(torch.tensor([1.0, -2.0, -3.0, 4.0, -5.0]))
    torch._dynamo.reset()
    source = graphs[0].source_code
    assert "if not (ks0 >= 3): raise RuntimeError(" in source and "ks0 >= 0" not in source
    assert source.index("ks0 = buf1.size(0)") < source.index("if not (ks0 >= 3)")
