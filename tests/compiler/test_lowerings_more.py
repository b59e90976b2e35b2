"""Lowerings added for OpInfo coverage (issue 23 item 5): index.Tensor (compiler/lowering_index.py),
the empty factories, prims.rev and diagonal (compiler/lowering_shape.py), and composites the
decomposition table now rewrites into lowered ops.

These ops copy values (or write zeros), so the compiled results must equal eager's exactly, for
float and integer dtypes alike; each graph must run with no aten fallback. Edge cases: negative
dims and indices, non-contiguous inputs, index tensors that broadcast, non-adjacent indexed dims
(whose broadcast dims lead the result). One compile per group keeps the file cheap."""
import pytest
import torch
from test_layout import compile_fn

aten = torch.ops.aten


def _run(fn, *inputs):
    compiled = compile_fn(fn, *inputs)
    assert compiled.fallback_targets == [], compiled.fallback_targets
    got, want = compiled(*inputs), fn(*inputs)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        assert _same(g, w), (k, g, w)
    return compiled


def _same(g, w):
    """Equal values, NaN where eager has NaN, and the same sign of zero."""
    if not g.is_floating_point():
        return torch.equal(g, w)
    nan = w.isnan()
    return (torch.equal(g.isnan(), nan) and torch.equal(g.nan_to_num(7.0), w.nan_to_num(7.0))
            and torch.equal(g.signbit() & ~nan, w.signbit() & ~nan))


def _index_cases(x, xi, i, j):
    xt = x.transpose(0, 2)                         # non-contiguous
    return (x[i],                                   # negative indices wrap
            x[:, j],                                # int32 indices, one dim in the middle
            x[i.view(2, 1), :, j[:3]],              # non-adjacent: broadcast [2, 3] dims lead the result
            x[:, i.view(2, 1), j[:3] % 4],          # adjacent: they replace dims 1 and 2 in place
            xt[j[:2] % 5, i[:1]],                   # non-contiguous input
            xi[i] * 3)                              # integer values


def test_index_tensor():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, generator=g)
    xi = torch.randint(-100, 100, (3, 4, 5), generator=g)
    i = torch.tensor([-1, 2])
    j = torch.tensor([0, -4, 3, 1], dtype=torch.int32)
    compiled = _run(_index_cases, x, xi, i, j)
    assert len(compiled.kernels) >= 1


def _shape_cases(x, xi):
    return (torch.flip(x, [-1, 0]),                 # prims.rev, negative dim
            torch.flip(x.transpose(1, 2), [1]),     # non-contiguous
            torch.flip(xi, [1]) + 1,                # integer
            torch.diagonal(x, 1, -2, -1) * 2,       # above the diagonal, negative dims
            torch.diagonal(x + 1, -2, 2, 0),        # below it, dims given in reverse order
            torch.diag_embed(torch.diagonal(xi, 0, 0, 1)),   # decomposed; integer
            torch.trace(x[0] * 1),                  # decomposed into diagonal + sum
            aten.zero(torch.empty_like(x)) + x,     # empty -> a buffer, then (functionally) filled
            aten.fill.Scalar(x.new_empty((2, 3)), 7.0))


def test_shape_ops():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 5, generator=g)
    xi = torch.randint(-100, 100, (4, 4, 2), generator=g)
    _run(_shape_cases, x, xi)


def test_out_of_range_index_is_an_error_not_a_wrong_read():
    x = torch.randn(4, 3)
    compiled = compile_fn(lambda a, b: (a[b] + 1,), x, torch.tensor([0, 3]))
    assert compiled.fallback_targets == []
    with pytest.raises(Exception, match="index out of bounds"):
        compiled(x, torch.tensor([0, 4]))
    with pytest.raises(Exception, match="index out of bounds"):
        compiled(x, torch.tensor([-5, 0]))


def _scan_round_split_cases(x, xi, xb):
    a, b, c = torch.ops.aten.unsafe_split.Tensor(x * 2, 2, -1)
    return (torch.cumsum(x, -1),                    # float32 folds in double, as eager: equal values
            torch.cumprod(x.transpose(0, 2), 0),    # non-contiguous, scan dim not innermost
            torch.cumsum(xi, 1),                    # int64
            torch.cumprod(xi[..., :3] % 7, -2),     # integer products (wrap as eager's int64)
            torch.cumsum(xb, 0),                    # bool -> int64
            torch.cumsum(x, 1, dtype=torch.float64),
            torch.round(x * 100, decimals=2), torch.round(x * 1e4, decimals=-3),
            torch.round(-x, decimals=0),
            a, b + 1, c)                            # pieces of 2, 2 and 1


def test_scan_round_split():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 4, 5, generator=g)
    x[0, 1, 2] = -0.0
    xi = torch.randint(-1000, 1000, (2, 6, 4), generator=g)
    xb = torch.rand(5, 3, generator=g) > 0.5
    _run(_scan_round_split_cases, x, xi, xb)


def test_long_scan_stays_an_aten_call():
    """A scan dim longer than SCAN_UNROLL runs as aten's linear scan (the unrolled fold is O(n))."""
    from tdbg.compiler.lowering_scan import SCAN_UNROLL
    x = torch.randn(2, SCAN_UNROLL + 1)
    compiled = compile_fn(lambda t: (torch.cumsum(t, -1),), x)
    assert compiled.fallback_targets == ["aten.cumsum.default"]
    assert torch.equal(compiled(x)[0], torch.cumsum(x, -1))


def _pool_cases(x):
    F = torch.nn.functional
    return (F.avg_pool2d(x, 3, 2, 1),                                   # padded, counted
            F.avg_pool2d(x, (2, 3), (1, 2), (1, 1), count_include_pad=False),
            F.avg_pool2d(x, 3, 2, 1, ceil_mode=True),                   # the last window overhangs
            F.avg_pool2d(x.transpose(2, 3), 2, divisor_override=3),     # non-contiguous
            F.avg_pool2d(x[0], 2),                                      # 3-d input
            F.avg_pool1d(x[0], 3, 1, 1))


def test_avg_pool2d():
    """Sums in eager's order and the same divisor: equal values (eager's NCHW kernel is scalar)."""
    x = torch.randn(2, 3, 7, 6, generator=torch.Generator().manual_seed(4))
    _run(_pool_cases, x)


def _running_extreme_cases(x, xi):
    return (*torch.cummax(x, -1), *torch.cummin(x.transpose(0, 1), 0), *torch.cummax(xi, 0),
            *torch.cummin(xi, -1))


def test_cummax_cummin_nan_and_ties():
    """Eager's rule: a NaN takes over (and every later NaN moves the index), ties move the index
    to the later element; values and indices equal eager's."""
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, float("nan"), 5.0, float("nan")],
                      [-0.0, 0.0, -1.0, -1.0, 4.0, 4.0, 1.0]])
    xi = torch.tensor([[2, 2, 1], [2, 5, 5], [0, 2, -3]])
    _run(_running_extreme_cases, x, xi)
