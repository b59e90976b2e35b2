"""Training-step kernels (issue 10): a value several readers reach through views is computed once,
an unrelated inner loop never joins a column reduction, the embedding gradient accumulates in
place (no copy of the [vocab, hidden] buffer), and the loss backward's one-hot scatter is a
pointwise. Structure is pinned; values are bounded against float64."""
import logging

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table
from tdbg.compiler.errors import KernelRuntimeError

aten = torch.ops.aten
EPS = 2.0 ** -24


def _compile(fn, *inputs, **cfg):
    lowering.reset_counters()
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    return compile_aten(gm, list(inputs), current().replace(**cfg))


def _kernels(compiled):
    src = compiled.source_code
    return src[src.index("KERNELS = {"):src.index("NARGS")].split('extern "C"')[1:]


def _call_lines(compiled):
    src = compiled.source_code
    return src[src.index("def call("):].splitlines()


def _log_softmax_backward(x, s):
    # the cross-entropy backward chain: exp of the saved log-probabilities, reshaped for the
    # decoder's two GEMMs (one through a transpose) and the bias gradient's column sum
    g = (x - x.exp() * s).view(1, 64, 300).view(64, 300)
    return g


def test_value_read_through_views_by_several_readers_is_computed_once():
    x, s = torch.randn(64, 300), torch.rand(64, 1)
    w, h = torch.randn(300, 32), torch.randn(64, 16)

    def fn(x, s, w, h):
        g = _log_softmax_backward(x, s)
        return g @ w, g.t() @ h, g.sum(0)
    compiled = _compile(fn, x, s, w, h)
    # once: one kernel computes exp, the GEMMs read its buffer (the transpose as a strided view)
    assert sum("tdbg_exp(" in k for k in _kernels(compiled)) == 1
    assert len(_kernels(compiled)) == 2
    assert sum("aten.mm" in line for line in _call_lines(compiled)) == 2
    g64 = _log_softmax_backward(x.double(), s.double())
    ref = (g64 @ w.double(), g64.t() @ h.double(), g64.sum(0))
    size = (g64.abs() @ w.double().abs(), g64.abs().t() @ h.double().abs(), g64.abs().sum(0))
    for got, want, mag, n in zip(compiled(x, s, w, h), ref, size, (300, 64, 64)):
        # each element of g is within 4 ulps; then n-term sums in any order
        assert ((got.double() - want).abs() <= (n + 4) * 2 * EPS * mag + 1e-30).all()


def test_unrelated_inner_loop_does_not_join_a_column_reduction():
    g = torch.randn(128, 3000)

    def fn(g):
        return g.sum(0), torch.zeros(3000, 64)
    records, handler = [], logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tdbg.schedule")
    logger.addHandler(handler)
    try:
        compiled = _compile(fn, g, logs=frozenset({"schedule"}))
    finally:
        logger.removeHandler(handler)
    kernels = _kernels(compiled)
    assert len(kernels) == 2
    column = next(k for k in kernels if "sum" in k.split("(")[0])
    # the chunked outer reduction: chunks along the kept dim, the contiguous loop innermost
    assert "x0c += " in column and "for (int64_t r0 = 0; r0 < 128; ++r0)" not in column
    assert any("it would change the group's loops" in r.getMessage() for r in records)
    total, zeros = compiled(g)
    assert ((total.double() - g.double().sum(0)).abs() <= 128 * EPS * g.double().abs().sum(0)).all()
    assert zeros.shape == (3000, 64) and not zeros.any()


def test_embedding_gradient_accumulates_in_place_without_a_copy():
    grad, ids = torch.randn(1, 6, 8), torch.tensor([[0, 3, 3, 7, 49, 3]])

    def fn(grad, ids):
        return aten.embedding_dense_backward(grad, ids, 50, 0, False)
    compiled = _compile(fn, grad, ids)
    calls = _call_lines(compiled)
    assert sum("aten.index_put_.default(" in line for line in calls) == 1
    assert not any("_unsafe_masked_index_put_accumulate.default(" in line or "clone" in line for line in calls)
    want = torch.zeros(50, 8, dtype=torch.float64)
    for t, i in enumerate(ids[0].tolist()):
        if i != 0:   # padding_idx 0 gets no gradient
            want[i] += grad[0, t].double()
    got = compiled(grad, ids)
    got = got[0] if isinstance(got, (list, tuple)) else got
    # row 3 adds three float32 values: 2 roundings
    assert ((got.double() - want).abs() <= 2 * EPS * 3 * grad.abs().max().double()).all()


def test_accumulating_into_a_value_read_elsewhere_runs_through_aten():
    x, ids, vals = torch.randn(10, 4), torch.tensor([1, 1, 12]), torch.randn(3, 4)
    mask = torch.tensor([[True], [True], [False]])

    def fn(x, ids, vals, mask):
        z = x * 2
        return aten._unsafe_masked_index_put_accumulate(z, mask, [ids], vals), z.sum(0)
    compiled = _compile(fn, x, ids, vals, mask)
    calls = _call_lines(compiled)
    assert sum("_unsafe_masked_index_put_accumulate.default(" in line for line in calls) == 1
    assert not any("index_put_.default(" in line for line in calls)
    put, total = compiled(x, ids, vals, mask)
    want = x.double() * 2
    want[1] += vals[0].double() + vals[1].double()   # index 12 is masked off (and clamped)
    assert ((put.double() - want).abs() <= 2 * EPS * want.abs().max()).all()
    assert ((total.double() - (x.double() * 2).sum(0)).abs() <= 10 * EPS * (x.double() * 2).abs().sum(0)).all()


def test_one_hot_scatter_is_a_pointwise_fused_into_the_loss_backward():
    # nll_loss backward: a zero fill, a scatter of -1 at each row's target, times the grad weight
    logp = torch.randn(16, 500).log_softmax(1)
    target = torch.randint(0, 500, (16,))
    target[3] = -100   # ignored row

    def fn(logp, target):
        return torch.ops.aten.nll_loss_backward(torch.tensor(1.0), logp, target, None, 1, -100, torch.tensor(15.0))
    compiled = _compile(fn, logp, target)
    calls = _call_lines(compiled)
    assert not any("aten.scatter" in line for line in calls)
    assert len(_kernels(compiled)) == 1
    got = compiled(logp, target)
    got = got[0] if isinstance(got, (list, tuple)) else got
    want = torch.zeros(16, 500, dtype=torch.float64)
    for row, t in enumerate(target.tolist()):
        if t != -100:
            want[row, t] = -1.0 / 15.0
    assert ((got.double() - want).abs() <= EPS * want.abs()).all()


def test_one_hot_scatter_rejects_an_index_out_of_range_like_aten():
    x, index = torch.zeros(4, 10), torch.tensor([[1], [9], [0], [3]])

    def fn(x, index):
        return aten.scatter.value(x, 1, index, -1.0)
    compiled = _compile(fn, x, index)
    assert not any("aten.scatter" in line for line in _call_lines(compiled))
    got = compiled(x, index)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert torch.equal(got, aten.scatter.value(x, 1, index, -1.0))
    for bad in (10, -1):   # aten raises for both: a scatter index never wraps around
        index[2, 0] = bad
        with pytest.raises(RuntimeError):
            aten.scatter.value(x, 1, index, -1.0)
        with pytest.raises(KernelRuntimeError, match="out of bounds"):
            compiled(x, index)


def _tied_gradient(g, h, grad, ids):
    # a tied embedding/decoder weight: the decoder's gradient (an mm) plus the embedding's scatter
    return torch.mm(g.t(), h) + aten.embedding_dense_backward(grad, ids, 40, 0, False)


def test_scatter_into_a_zero_fill_accumulates_into_the_added_gradient_in_place():
    g, h = torch.randn(6, 40), torch.randn(6, 8)
    grad, ids = torch.randn(1, 6, 8), torch.tensor([[0, 3, 3, 7, 39, 3]])
    compiled = _compile(_tied_gradient, g, h, grad, ids)
    calls = _call_lines(compiled)
    mm = next(line for line in calls if "aten.mm" in line).split("=")[0].strip()
    # the mm's own buffer takes the scatter, and is the result: no zero fill, no add kernel
    assert any(line.strip().startswith(f"aten.index_put_.default({mm},") or f"= aten.index_put_.default({mm}," in line
               for line in calls)
    assert not any("fused_add" in k.split("(")[0] or "fused_full" in k.split("(")[0] for k in _kernels(compiled))
    got = compiled(g, h, grad, ids)
    got = got[0] if isinstance(got, (list, tuple)) else got
    want = _tied_gradient(g.double(), h.double(), grad.double(), ids)
    mag = g.double().abs().t() @ h.double().abs() + aten.embedding_dense_backward(grad.double().abs(), ids, 40, 0, False)
    # 6-term mm sums, then up to 3 scatter adds: 9 roundings of terms bounded by `mag`
    assert ((got.double() - want).abs() <= 9 * EPS * mag + 1e-30).all()


def test_scatter_is_not_moved_onto_a_gradient_read_elsewhere():
    g, h = torch.randn(6, 40), torch.randn(6, 8)
    grad, ids = torch.randn(1, 6, 8), torch.tensor([[0, 3, 3, 7, 39, 3]])

    def fn(g, h, grad, ids):
        a = torch.mm(g.t(), h)
        return a + aten.embedding_dense_backward(grad, ids, 40, 0, False), a
    compiled = _compile(fn, g, h, grad, ids)
    assert any("fused_add" in k.split("(")[0] for k in _kernels(compiled))
    total, a = compiled(g, h, grad, ids)
    assert torch.equal(a, torch.mm(g.t(), h))
    want = fn(g.double(), h.double(), grad.double(), ids)[0]
    mag = g.double().abs().t() @ h.double().abs() + aten.embedding_dense_backward(grad.double().abs(), ids, 40, 0, False)
    assert ((total.double() - want).abs() <= 9 * EPS * mag + 1e-30).all()


@pytest.mark.parametrize("op,fn,inputs", [
    ("scatter", lambda x, t: aten.scatter.value(x, 1, t.unsqueeze(1), -1.0),
     (torch.zeros(4, 9), torch.tensor([1, 8, 0, 3]))),
    ("_unsafe_masked_index_put_accumulate", lambda g, ids: aten.embedding_dense_backward(g, ids, 10, -1, False),
     (torch.ones(1, 3, 2), torch.tensor([[2, 7, 2]]))),
], ids=["scatter", "index_put_accumulate"])
def test_the_training_scatters_are_injectable(op, fn, inputs):
    """Each new lowering is in config.INJECTABLE_OPS, so an injected bug must change what it computes
    (bisect and the tests of the debugging tools rely on it)."""
    healthy = _compile(fn, *inputs)(*inputs)
    broken = _compile(fn, *inputs, inject_bug=(op, "accuracy"))(*inputs)
    healthy = healthy[0] if isinstance(healthy, (list, tuple)) else healthy
    broken = broken[0] if isinstance(broken, (list, tuple)) else broken
    assert torch.equal(healthy, fn(*inputs))
    assert not torch.equal(broken, healthy)


def test_a_sum_over_an_nchw_times_nhwc_product_runs_chunked_along_the_channels():
    """ConvNeXt's layer-scale gradient: sum over N, H, W of an NCHW gradient times an NHWC
    activation, fused with the column sum of the NHWC bias gradient. Two of the three reads are
    contiguous along the channels, so the kernel runs chunked (the channel loop innermost)
    instead of reading the NHWC tensor at a stride of C once per channel."""
    n, c, hw = 2, 96, 12
    g = torch.randn(n, c, hw, hw)                                             # NCHW
    a = torch.randn(n, hw, hw, c).permute(0, 3, 1, 2)                         # NHWC strides
    b = torch.randn(n * hw * hw, c)

    def fn(g, a, b):
        return (g * a).sum((0, 2, 3)), b.sum(0)
    compiled = _compile(fn, g, a, b)
    (kernel,) = _kernels(compiled)
    assert "x0c += " in kernel and "for (int64_t x0 = 0; x0 < 96; ++x0)" not in kernel
    prod, col = compiled(g, a, b)
    want = (g.double() * a.double()).sum((0, 2, 3))
    mag = (g.double() * a.double()).abs().sum((0, 2, 3))
    terms = n * hw * hw
    assert ((prod.double() - want).abs() <= (terms + 1) * EPS * mag).all()
    assert ((col.double() - b.double().sum(0)).abs() <= terms * EPS * b.double().abs().sum(0)).all()


def test_a_channels_last_output_of_a_training_graph_loops_in_memory_order():
    """ConvNeXt's residual `x + gamma * y` on channels_last activations: AOTAutograd fixes the
    saved output's strides to eager's (NHWC). The kernel loops in that memory order (channels
    innermost, every access unit-stride), not in logical order with every access at stride C."""
    n, c, h = 2, 32, 6
    x, y = (torch.randn(n, h, h, c).permute(0, 3, 1, 2) for _ in range(2))
    gamma = torch.randn(c)

    def fn(x, y, gamma):
        return x + gamma.view(1, c, 1, 1) * y
    compiled = _compile(fn, x, y, gamma)
    (kernel,) = _kernels(compiled)
    inner = kernel[kernel.rindex("for (int64_t "):].split()[2]        # the innermost loop variable
    assert f"for (int64_t {inner} = 0; {inner} < {c}; ++{inner})" in kernel
    assert f"out_ptr0[({inner} + " in kernel and f"in_ptr0[({inner} + " in kernel
    got = compiled(x, y, gamma)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert got.stride() == (h * h * c, 1, h * c, c)
    want = x.double() + gamma.double().view(1, c, 1, 1) * y.double()
    assert ((got.double() - want).abs() <= 2 * EPS * (x.double().abs() + (gamma.double().view(1, c, 1, 1) * y.double()).abs())).all()


@pytest.mark.parametrize("rows,cols", [(64, 256), (100, 250)])   # whole tiles, and partial ones at both edges
def test_a_kernel_reading_a_transpose_runs_in_tiles(rows, cols):
    """MobileBERT's head: cat([W.t(), D]) with W [vocab, 128]. Row by row, each read of W.t()
    touched a new cache line; the last two loops now run in TILE-sized tiles, the tile loops
    parallel, the element loops bounded by their tile. A plain (untransposed) add is not tiled."""
    from tdbg.compiler.scheduler import TILE
    w, d = torch.randn(cols, 32), torch.randn(rows - 32, cols)

    def fn(w, d):
        return torch.cat([w.t(), d], 0)
    compiled = _compile(fn, w, d)
    (kernel,) = _kernels(compiled)
    assert f"for (int64_t x0t = 0; x0t < {rows}; x0t += {TILE[0]})" in kernel
    assert f"for (int64_t x1t = 0; x1t < {cols}; x1t += {TILE[1]})" in kernel
    assert "#pragma omp parallel for" in kernel.split("x0t = 0")[0]
    got = compiled(w, d)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert torch.equal(got, fn(w, d))
    (plain,) = _kernels(_compile(lambda a, b: a + b, d, d))
    assert "x0t" not in plain and "x1t" not in plain
