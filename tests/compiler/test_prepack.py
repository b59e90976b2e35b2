"""Weight prepacking (compiler/prepack.py): inference linears and convolutions whose weight is a
graph input run on a packed copy, remade whenever the weight changes.

Each test checks the answer against float64 within float32 tolerance and what output_code.py
calls (`_packed.linear` / `_packed.conv`, or the plain aten op where prepacking must not apply)."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from helpers import compile_capturing
from tdbg.compiler import compile_aten, lowering, prepack
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table

aten = torch.ops.aten
F = torch.nn.functional
pytestmark = pytest.mark.skipif(not (prepack.mkl_available() and prepack.mkldnn_available()),
                                reason="torch built without MKL / oneDNN")


def compile_fn(fn, *inputs, kind="inference", **cfg):
    """`fn` compiled by tdbg; addmm stays addmm (bias_epilogue.py's split has tests of its own)."""
    lowering.reset_counters()
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    return compile_aten(gm, list(inputs), current().replace(**{"bias_epilogue": False, **cfg}), kind=kind)


def check(fn, compiled, *inputs):
    got = compiled(*inputs)
    got = got[0] if isinstance(got, (tuple, list)) else got
    ref = fn(*[x.double() for x in inputs])
    torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)
    assert got.stride() == fn(*inputs).stride()


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def linear_gelu(x, w1, b1, w2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2)


def conv_relu(x, w, b):
    return F.relu(F.conv2d(x, w, b, padding=1))


def onednn_linear_gelu(x, w, b):
    if x.dtype != torch.float32:
        return F.gelu(F.linear(x, w, b))
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "gelu", [], "none")


# (name, fn, inputs, the PackedWeights calls output_code.py must make)
CASES = [
    ("addmm and mm", linear_gelu, (randn(2, 8, 64), randn(256, 64, seed=1, scale=0.1), randn(256, seed=2),
                                   randn(64, 256, seed=3, scale=0.1)), ["_packed.linear(0,", "_packed.linear(1,"]),
    ("conv", conv_relu, (randn(2, 16, 10, 10), randn(32, 16, 3, 3, seed=1, scale=0.1), randn(32, seed=2)),
     ["_packed.conv(0,"]),
    # linear_gelu.py's fused call (float64, the reference, computes it in aten)
    ("oneDNN linear + GELU", onednn_linear_gelu, (randn(64, 32), randn(128, 32, seed=1, scale=0.1), randn(128, seed=2)),
     ["_packed.dnn_linear(0,"]),
]


@pytest.mark.parametrize("name,fn,inputs,calls", CASES, ids=[c[0] for c in CASES])
def test_packed_calls_give_the_answer(name, fn, inputs, calls):
    compiled = compile_fn(fn, *inputs)
    for call in calls:
        assert call in compiled.source_code
    assert "aten.addmm" not in compiled.source_code and "aten.mm" not in compiled.source_code
    assert "aten.convolution" not in compiled.source_code
    check(fn, compiled, *inputs)


def test_every_packer_row_is_exercised():
    """The table and the cases agree: each PACKERS target appears in some case's aten graph."""
    seen = set()
    for _, fn, inputs, _ in CASES:
        gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
        seen |= {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert set(prepack.PACKERS) <= seen


@pytest.mark.parametrize("name,fn,inputs,calls", CASES, ids=[c[0] for c in CASES])
def test_a_changed_weight_is_repacked(name, fn, inputs, calls):
    """In-place writes (as an optimizer step or load_state_dict make) bump the weight's version:
    the next call packs it again. A new weight tensor in the same call slot is packed too."""
    inputs = [x.clone() for x in inputs]
    compiled = compile_fn(fn, *inputs)
    check(fn, compiled, *inputs)
    w = inputs[1]
    with torch.no_grad():
        w.mul_(-2.0)
    check(fn, compiled, *inputs)
    w.copy_(randn(*w.shape, seed=7, scale=0.1))
    check(fn, compiled, *inputs)
    fresh = [inputs[0], randn(*w.shape, seed=8, scale=0.1), *inputs[2:]]
    check(fn, compiled, *fresh)


def test_a_module_updated_by_an_optimizer_step():
    """Train a step eagerly, then run the compiled inference graph: the stepped weights count."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
    x = torch.randn(32, 64)
    f = torch.compile(m, backend="tdbg")
    with torch.no_grad():
        before = f(x)
    torch.testing.assert_close(before, m(x).detach())
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m(x).square().sum().backward()
    opt.step()
    with torch.no_grad():
        after = f(x)
        torch.testing.assert_close(after, m(x))
    assert not torch.allclose(before, after)


# where prepacking must not apply: (name, fn, inputs, compile options, the aten call that stays)
PLAIN = [
    ("fewer rows than MIN_ROWS", linear_gelu, (randn(1, 4, 64), randn(256, 64, seed=1), randn(256, seed=2),
                                               randn(64, 256, seed=3)), {}, "aten.addmm"),
    ("B is an activation", lambda x, y: torch.mm(x, y.relu()), (randn(16, 128), randn(128, 256)), {}, "aten.mm"),
    ("pack_weights off", linear_gelu, CASES[0][2], {"pack_weights": False}, "aten.addmm"),
    ("training graph", linear_gelu, CASES[0][2], {"kind": "forward"}, "aten.addmm"),
    ("NCHW convolution", conv_relu, CASES[1][2], {"layout_optimization": False}, "aten.convolution"),
]


@pytest.mark.parametrize("name,fn,inputs,opts,call", PLAIN, ids=[c[0] for c in PLAIN])
def test_where_prepacking_does_not_apply(name, fn, inputs, opts, call):
    compiled = compile_fn(fn, *inputs, **opts)
    assert "_packed." not in compiled.source_code
    assert call in compiled.source_code
    check(fn, compiled, *inputs)


def test_inference_mode_and_no_grad_share_the_packed_weights():
    """A copy packed under inference_mode serves no_grad calls, and an in-place write made under
    inference_mode still bumps the (normal) weight's version."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    x = torch.randn(32, 128)
    f = torch.compile(m, backend="tdbg")
    with torch.inference_mode():
        torch.testing.assert_close(f(x), m(x))
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
    with torch.inference_mode():
        m[0].weight.add_(1.0)
        torch.testing.assert_close(f(x), m(x))
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))



def test_weights_made_under_inference_mode_are_packed_every_call():
    """An inference tensor has no version counter (reading it raised before): its packed copy
    is made anew each call, so an in-place write under inference_mode is still seen."""
    torch.manual_seed(0)
    with torch.inference_mode():
        m = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
        x = torch.randn(32, 128)
        f = torch.compile(m, backend="tdbg")
        torch.testing.assert_close(f(x), m(x))
        m[0].weight.mul_(-1.0)
        torch.testing.assert_close(f(x), m(x))

@pytest.mark.parametrize("n, k", [(256, 128), (2048, 1024)])
def test_a_linear_runs_plain_when_its_packed_copy_would_be_too_large_and_the_shape_is_remembered(n, k, monkeypatch):
    """MKL's packed buffer may carry far more than the weight (torch 2.13's MKL on an AVX-512 Xeon: a
    128 KB weight packs to ~7.6 MiB; the size may differ by MKL build and CPU, so the rule is checked):
    beyond MAX_PACKED_RATIO times the weight, the linear runs the graph's own addmm (eager's bits),
    and later weights of that shape are not packed to find out again."""
    x, w, b = randn(16, k), randn(n, k, seed=1, scale=0.1), randn(n, seed=2)
    monkeypatch.setattr(prepack, "_PLAIN", set())
    packed_bytes = torch.ops.mkl._mkl_reorder_linear_weight(w, 16).numel() * 4
    plain = packed_bytes > prepack.MAX_PACKED_RATIO * w.nbytes
    pw = prepack.PackedWeights()
    out = pw.linear(0, x, w, b)
    assert (pw.slots[0].values() == [None]) == plain and ((n, k, 16) in prepack._PLAIN) == plain
    if plain:
        assert torch.equal(out, torch.addmm(b, x, w.t()))
        monkeypatch.setattr(torch.ops.mkl, "_mkl_reorder_linear_weight", None)   # must not be asked again
        assert torch.equal(prepack.PackedWeights().linear(0, x, w.clone(), b), out)
    else:
        torch.testing.assert_close(out, torch.addmm(b, x, w.t()))


def _linear_case(dtype, layout="nk"):
    """(fn, inputs) for a LINEAR_PACKINGS row: a linear of `dtype`, 32 rows, a [2048, 512]
    weight (over every row's minimum, and DNN_INSTEAD's at 32 rows when MKL declines it), stored
    [N, K] as nn.Linear's or [K, N] as GPT-2's Conv1D."""
    x, w, b = randn(32, 512), randn(2048, 512, seed=1, scale=0.05), randn(2048, seed=2)
    if layout == "kn":
        return (lambda x, w, b: torch.addmm(b, x, w).relu()), tuple(t.to(dtype) for t in (x, w.t().contiguous(), b))
    return (lambda x, w, b: F.linear(x, w, b).relu()), tuple(t.to(dtype) for t in (x, w, b))


def _ulps_from(got, expected):
    """Per element, |got - expected| in units of `expected`'s dtype's spacing at expected."""
    spacing = torch.nextafter(expected.abs(), torch.tensor(float("inf"), dtype=expected.dtype)) - expected.abs()
    return ((got.double() - expected.double()).abs() / spacing.double()).max().item()


# (row, how its linear is compiled, weight layout, CPU vendor): "any" rows are tried with static
# and with symbolic rows, each row with both weight layouts, on the vendor a row names last (an
# earlier row would serve its first)
ROW_CASES = [(row, rows, layout, row[2][-1]) for row in prepack.LINEAR_PACKINGS
             for rows in (("static", "symbolic") if row[1] == "any" else (row[1],)) for layout in ("nk", "kn")]


@pytest.mark.parametrize("row,rows,layout,cpu", ROW_CASES,
                         ids=[f"{r[0]}-{k}-{lay}-{cpu}" for r, k, lay, cpu in ROW_CASES])
def test_each_linear_packing_row(row, rows, layout, cpu, monkeypatch):
    """Each row's linear runs its PackedWeights method where the row is available (the plain
    aten op where not), packs its weight once for every row count, and gives eager's answer:
    float32 within float32 tolerance of float64, bf16/fp16 within one ulp of eager's addmm (the
    same oneDNN GEMM on a weight reordered once instead of every call)."""
    dtype, _, cpus, method, available, _when = row
    assert cpu in cpus
    fn, inputs = _linear_case(dtype, layout)
    packs = []   # each packed copy made (MKL's, when it declines a weight for its size, is None)
    held = prepack.PackedWeights._held
    monkeypatch.setattr(prepack.PackedWeights, "_held", lambda self, slot, w, extra, make: held(
        self, slot, w, extra, lambda: packs.append(make()) or packs[-1]))
    compiled, graphs = compile_capturing(fn, dynamo_dynamic=rows == "symbolic", cpu_vendor=cpu)
    with torch.no_grad():
        for n in ((32,) if rows == "static" else (32, 19, 57)):
            args = (randn(n, 512).to(dtype), *inputs[1:])
            got = compiled(*args)
            if dtype == torch.float32:
                check(fn, lambda *a: got, *args)
            else:
                assert _ulps_from(got, fn(*args)) <= 1.0
    torch._dynamo.reset()
    assert len(graphs) == 1 and bool(graphs[0].size_symbols) == (rows == "symbolic")
    source = graphs[0].source_code
    if available():
        assert f"_packed.{method}(0," in source and "aten.addmm" not in source
        assert sum(p is not None for p in packs) == 1   # one packed copy serves every length
    else:
        assert "_packed." not in source and "aten.addmm" in source


# (rows, N, K, method on an AMD CPU): a vocabulary-sized output at any row count, or outputs 1.5
# times the inputs at up to 512 rows (prepack.WIDE_MAX_ROWS), run on oneDNN there; Intel's run every
# one on MKL
WIDE_CASES = [(8, 8192, 64, "dnn_linear"), (600, 8192, 64, "dnn_linear"), (128, 768, 512, "dnn_linear"),
              (394, 768, 512, "dnn_linear"), (512, 768, 512, "dnn_linear"), (513, 768, 512, "linear"),
              (394, 512, 768, "linear"), (128, 767, 512, "linear"),
              (128, 512, 768, "linear"), (128, 384, 256, "linear"), (7, 8192, 64, None)]


@pytest.mark.parametrize("rows,n,k,amd", WIDE_CASES, ids=[f"{r}x{n}x{k}" for r, n, k, _ in WIDE_CASES])
def test_which_library_serves_a_float32_linear_by_cpu_vendor(rows, n, k, amd):
    x, w, b = randn(rows, k), randn(n, k, seed=1, scale=k ** -0.5), randn(n, seed=2)
    fn = lambda x, w, b: F.linear(x, w, b).relu()   # noqa: E731
    for cpu, method in (("amd", amd), ("intel", amd and "linear"), ("other", amd and "linear")):
        compiled = compile_fn(fn, x, w, b, cpu_vendor=cpu)
        src = compiled.source_code
        assert (f"_packed.{method}(0," in src) if method else "_packed." not in src, (cpu, src[src.index("def call"):])
        if cpu == "amd":
            check(fn, compiled, x, w, b)


def test_a_symbolic_row_count_below_the_rows_minimum_runs_plain():
    """Symbolic rows are judged by their example's value: a float32 linear first seen (and
    compiled symbolically) at 2 rows stays plain addmm, where oneDNN's per-call cost loses."""
    fn, (x, w, b) = _linear_case(torch.float32)
    compiled, graphs = compile_capturing(fn, dynamo_dynamic=True)
    with torch.no_grad():
        for n in (2, 3):
            x = randn(n, 512)
            check(fn, compiled, x, w, b)
    torch._dynamo.reset()
    assert graphs[-1].size_symbols and "_packed." not in graphs[-1].source_code


def _dnn_case(rows, elements):
    """x [rows, 64], w [elements // 64, 64], b: a linear with this row count and weight size."""
    n = max(1, elements // 64)
    return randn(rows, 64), randn(n, 64, seed=1, scale=0.1), randn(n, seed=2)


@pytest.mark.parametrize("rows,elements", prepack.DNN_INSTEAD, ids=[f"{r}x{n}" for r, n in prepack.DNN_INSTEAD])
def test_a_linear_too_large_for_mkl_runs_on_onednn_from_each_rows_thresholds(rows, elements, monkeypatch):
    """Each DNN_INSTEAD row: a linear MKL declines runs on oneDNN's packed weight at the row's
    row count and weight size, plain addmm with one row fewer (unless another row holds), and
    both give addmm's answer within float32 tolerance."""
    if not prepack._dnn_linear_available():
        pytest.skip("oneDNN linear not available")
    monkeypatch.setattr(prepack, "_mkl_pack", lambda w, r: None)   # MKL declines every weight
    for r, dnn in ((rows, True), (rows - 1, any(rows - 1 >= r2 and elements >= n2 for r2, n2 in prepack.DNN_INSTEAD))):
        x, w, b = _dnn_case(r, elements)
        pw = prepack.PackedWeights()
        out = pw.linear(0, x, w, b)
        assert (("dnn", 0) in pw.slots) == dnn, (r, elements)
        torch.testing.assert_close(out, torch.addmm(b, x, w.t()), rtol=1e-4, atol=1e-4)


def shared_layers(x, w, b, img, cw):
    """One linear's weight used three times at one row count and once at another (ALBERT's
    layers share their weights), and one convolution's weight twice on one input shape."""
    h = F.linear(F.linear(F.linear(x, w, b), w, b), w, b)
    return h, F.linear(x[:8], w), F.conv2d(F.relu(F.conv2d(img, cw, padding=1)), cw, padding=1)


def test_calls_packing_one_weight_the_same_way_share_one_packed_copy(monkeypatch):
    inputs = (randn(16, 128), randn(128, 128, seed=1, scale=0.1), randn(128, seed=2), randn(2, 16, 6, 6, seed=3),
              randn(16, 16, 3, 3, seed=4, scale=0.1))
    compiled = compile_fn(shared_layers, *inputs)
    src = compiled.source_code
    # the three 16-row calls share slot 0; 8 rows pack again (MKL's copy is per row count)
    assert [src.count(f"_packed.linear({i},") for i in range(3)] == [3, 1, 0]
    assert src.count("_packed.conv(2,") == 2
    made = []
    real = prepack._mkl_pack
    monkeypatch.setattr(prepack, "_mkl_pack", lambda wt, rows: made.append(rows) or real(wt, rows))
    for _ in range(2):
        got = compiled(*inputs)
        for g, e in zip(got, shared_layers(*[t.double() for t in inputs])):
            torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=1e-4)
    assert made == [16, 8]          # packed once per slot, on the first call only
