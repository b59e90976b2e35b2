"""Every pointwise row of compiler/ops.py against eager, per dtype, including NaN/inf cases.

All rows accepted by eager for one dtype are traced into ONE graph (one kernel build per dtype);
each must be lowered (not fall back) and match eager exactly for integers and bool, and to
float tolerance (NaNs in the same places) for floats.
"""
import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten
from tdbg.compiler.config import current
from tdbg.compiler.ops import POINTWISE, TABLE

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool]
SPECIALS = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.5, -2.5, 0.5]


def _accepts(row, dtype):
    if dtype == torch.bool:
        return row.bool_ok
    return row.float_ok if dtype.is_floating_point else row.int_ok


def make_inputs(row, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (4, 6)
    if dtype == torch.bool:
        return [torch.randint(0, 2, shape, generator=g).bool() for _ in range(row.nargs)]
    if dtype.is_floating_point:
        xs = [torch.randn(shape, generator=g, dtype=dtype) * 3 for _ in range(row.nargs)]
        xs[0].view(-1)[: len(SPECIALS)] = torch.tensor(SPECIALS, dtype=dtype)
    else:
        lo, hi = (0, 255) if dtype == torch.uint8 else (-50, 50)
        xs = [torch.randint(lo, hi, shape, generator=g, dtype=dtype) for _ in range(row.nargs)]
    if row.domain == "positive":
        xs = [x.abs() + (0.1 if dtype.is_floating_point else 1) for x in xs]
    elif row.domain == "unit" and dtype.is_floating_point:
        xs = [torch.tanh(x) for x in xs]
    elif row.domain == "small":
        xs = [xs[0]] + [x.abs().remainder(4).to(dtype) for x in xs[1:]]
    elif row.domain == "nonzero" and not dtype.is_floating_point:
        xs = [xs[0]] + [torch.where(x == 0, torch.ones_like(x), x) for x in xs[1:]]
    return xs


def rows_for(dtype):
    rows = []
    for row in POINTWISE:
        if not _accepts(row, dtype):
            continue
        inputs = make_inputs(row, dtype, 0)
        try:
            row.aten[0](*inputs)
        except (RuntimeError, TypeError):
            continue
        rows.append(row)
    return rows


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pointwise_rows_match_eager(dtype):
    rows = rows_for(dtype)
    assert len(rows) >= 10
    inputs = [x for row in rows for x in make_inputs(row, dtype, 1)]

    def fn(*flat):
        outs, i = [], 0
        for row in rows:
            outs.append(row.aten[0](*flat[i:i + row.nargs]))
            i += row.nargs
        return tuple(outs)

    gm = make_fx(fn)(*inputs)
    compiled = compile_aten(gm, inputs, current())
    assert compiled.fallback_targets == []
    got, want = compiled(*inputs), fn(*inputs)
    bad = []
    for row, g, w in zip(rows, got, want):
        exact = not w.dtype.is_floating_point
        ok = g.dtype == w.dtype and (torch.equal(g, w) if exact else
                                     torch.allclose(g, w, rtol=1e-5, atol=1e-6, equal_nan=True))
        if not ok:
            bad.append((row.name, g, w))
    assert not bad, "\n".join(f"{n}: got {g} want {w}" for n, g, w in bad)


def test_scalar_operands_and_promotion():
    x8 = torch.tensor([0, 1, 200, 255], dtype=torch.uint8)
    xi = torch.tensor([-3, -1, 4, 7])
    xf = torch.tensor([-1.5, float("nan"), 2.0, 0.0])

    def fn(a, b, c):
        return (a + 100, -a, a * 2, b / 2, b // -2, b % 3, c + b, torch.maximum(c, c.new_tensor(1.0)),
                a > 100, torch.where(a > 100, b, c), b.pow(2), torch.clamp(c, -1.0, 1.0),
                torch.sub(b, a, alpha=2), torch.div(b, 3, rounding_mode="floor"),
                torch.div(b, -3, rounding_mode="trunc"), c.to(torch.int64), a.to(torch.bool))
    gm = make_fx(fn)(x8, xi, xf)
    compiled = compile_aten(gm, [x8, xi, xf], current())
    for g, w in zip(compiled(x8, xi, xf), fn(x8, xi, xf)):
        assert g.dtype == w.dtype
        assert torch.allclose(g.double(), w.double(), equal_nan=True), (g, w)


def test_nan_propagating_max_min():
    a = torch.tensor([float("nan"), 1.0, 2.0, float("nan")])
    b = torch.tensor([0.0, float("nan"), 3.0, float("nan")])
    fn = lambda a, b: (torch.maximum(a, b), torch.minimum(a, b), torch.clamp(a, 0.5, 1.5))  # noqa: E731
    compiled = compile_aten(make_fx(fn)(a, b), [a, b], current())
    for g, w in zip(compiled(a, b), fn(a, b)):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())


def test_table_rows_have_promotion_and_spelling():
    for row in TABLE.values():
        assert row.kind in ("pointwise", "special")
        assert 1 <= row.nargs <= 3
        assert "{0}" in row.spelling(torch.float32) or row.spelling(torch.float32) == "false"
        row.promotion_kind  # a real ELEMENTWISE_TYPE_PROMOTION_KIND member
