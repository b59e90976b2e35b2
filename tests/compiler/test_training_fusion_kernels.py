"""Training-step kernels (issue 10): a value several readers reach through views is computed once,
an unrelated inner loop never joins a column reduction, and the embedding gradient accumulates
in place (no copy of the [vocab, hidden] buffer). Structure is pinned; values are bounded
against float64."""
import logging

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table

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
