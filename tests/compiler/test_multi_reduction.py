"""Fused row+column reductions: a row reduction (x.sum(1)) and a column reduction (x.mean(0))
of the same input run in one kernel that reads the input once (scheduler.ColumnPart,
codegen_reduction.row_column_body): exact loop structure, results equal to eager for every
supported kind with NaN/inf and odd sizes, epilogues on both sides, and the cases that keep
two kernels. A reduction reading the inner pointwise node just before it (softmax's sum of
the exp) accumulates inside that node's loop (scheduler.accumulates_in_producer), and keeps its
own loop when that is not safe."""
import re
from types import SimpleNamespace

import pytest
import sympy
import torch

from tdbg.compiler import scheduler
from tdbg.compiler.config import current
from test_vectorize import compile_fn, loop_heads, schedule_log, schedule_messages, source


def row_col(x):
    return x.sum(1), (x * x).mean(0)


def test_row_and_column_reduction_share_one_loop_nest():
    x = torch.randn(37, 40)
    compiled, messages = schedule_messages(row_col, x, min_chunk_size=1)
    assert len(compiled.kernels) == 1
    assert any("row+column reduction: buf1 keeps 40 column accumulators per thread (2 threads)" in m
               for m in messages), messages
    src = source(compiled)
    ROWS = "for (int64_t x0 = x0b; x0 < (x0b + 8 < 37 ? x0b + 8 : 37); ++x0)"
    assert loop_heads(src) == [
        "#pragma omp simd simdlen(8)", "for (int64_t i = 0; i < 80; ++i)",        # init both threads' columns
        "#pragma omp parallel num_threads(2)",
        "#pragma omp for schedule(static)", "for (int64_t x0b = 0; x0b < 37; x0b += 8)",
        "#pragma omp simd simdlen(8)", "for (int64_t c = 0; c < 40; ++c)",         # zero float partials
        ROWS,
        "#pragma omp simd simdlen(32) reduction(+:acc1p)", "for (int64_t r0 = 0; r0 < 40; ++r0)",
        "#pragma omp simd simdlen(8)", "for (int64_t c = 0; c < 40; ++c)",         # partials into doubles
        "#pragma omp for schedule(static)", "for (int64_t x0 = 0; x0 < 40; ++x0)",  # combine + epilogue
    ]
    # one load per element feeds both reductions
    assert src.count("in_ptr0[") == 1
    assert "double* acc0t = acc0 + omp_get_thread_num() * 40;" in src
    assert "acc0p[r0] = acc0p[r0] + static_cast<float>(tmp3);" in src
    assert "double acc0v = acc0[x0];" in src and "acc0v = acc0v + static_cast<double>(acc0[40 + x0]);" in src


def nan_inf(rows, cols):
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * cols))
    if rows > 3 and cols > 3:
        x[1, 2] = float("nan")
        x[2, :] = float("inf")
        x[3, 1] = -float("inf")
        x[:, 3] = -float("inf")
    return x


FNS = {
    "sum_mean": row_col,
    "amax_amin": lambda x: (x.amax(1), x.amin(0)),
    "amin_amax_sum": lambda x: (x.amin(1), x.amax(0), x.sum(0)),
    "mean_sum_sq": lambda x: (x.mean(1), (x * x).sum(0), x.abs().amax(0)),
}


@pytest.mark.parametrize("shape", [(37, 17), (13, 1023), (5, 1), (1, 9), (64, 64)])
@pytest.mark.parametrize("name", sorted(FNS))
def test_results_equal_eager_with_nan_inf_and_odd_sizes(name, shape):
    compiled = compile_fn(FNS[name], nan_inf(*shape), min_chunk_size=1)
    rows, cols = shape
    fused = rows > 1 and cols > 1
    if fused:
        assert len(compiled.kernels) == 1
    assert ("omp_get_thread_num" in source(compiled)) == fused


def test_epilogues_on_both_sides():
    x = torch.randn(50, 33)
    fn = lambda x: (x.sum(1) * 2 + 1, ((x * x).mean(0) + 1).sqrt() * x.amax(0))  # noqa: E731
    compiled = compile_fn(fn, x, min_chunk_size=1)
    assert len(compiled.kernels) == 1


def test_layernorm_backward_shape_row_sums_of_a_product_and_column_sums():
    g, xhat = torch.randn(40, 24), torch.randn(40, 24)
    fn = lambda g, h: ((g * h).sum(1), g.sum(0), (g * h).sum(0))  # noqa: E731
    compiled = compile_fn(fn, g, xhat, min_chunk_size=1)
    assert len(compiled.kernels) == 1
    src = source(compiled)
    assert src.count("in_ptr0[") == 1 and src.count("in_ptr1[") == 1   # one load of each input per element


def test_column_reduction_may_also_read_another_input_contiguously():
    x, y = torch.randn(20, 30), torch.randn(20, 30)
    compiled = compile_fn(lambda x, y: (x.sum(1), (x + y).amax(0)), x, y)
    assert len(compiled.kernels) == 1


@pytest.mark.parametrize("dim", [0, 1])
def test_fused_sums_are_at_least_as_accurate_as_eager(dim):
    x = torch.randn(1000, 1030, generator=torch.Generator().manual_seed(0)) + 0.5
    compiled = compile_fn(row_col, x)
    assert len(compiled.kernels) == 1
    got = compiled(x)[dim].double()
    reference = row_col(x.double())[dim]
    eager_error = (row_col(x)[dim].double() - reference).abs().max()
    assert (got - reference).abs().max() <= eager_error


def test_single_thread_when_the_work_is_small():
    """One thread: a plain block without OpenMP (no region of one thread to start)."""
    compiled = compile_fn(row_col, torch.randn(9, 10))
    src = source(compiled)
    assert "omp_get_thread_num()" in src and "#pragma omp parallel" not in src and "#pragma omp for" not in src


def test_columns_above_the_cap_keep_two_kernels():
    x = torch.rand(3, scheduler.COLUMN_CAP + 1)   # positive: the long row sums stay within rtol
    compiled, messages = schedule_messages(row_col, x)
    assert len(compiled.kernels) == 2
    assert any(f"{scheduler.COLUMN_CAP + 1} kept columns > cap {scheduler.COLUMN_CAP}" in m for m in messages), messages


def test_the_cap_shrinks_with_the_thread_count():
    x = torch.rand(3, scheduler.COLUMN_TOTAL // 8 + 1)
    compiled, messages = schedule_messages(row_col, x, num_threads=8)
    assert len(compiled.kernels) == 2
    assert any(f"{scheduler.COLUMN_TOTAL // 8 + 1} kept columns > cap {scheduler.COLUMN_TOTAL // 8}" in m
               for m in messages), messages
    assert len(compile_fn(row_col, x[:, :-1], num_threads=8).kernels) == 1


def test_integer_row_and_column_sums_and_extrema():
    x = torch.randint(-100, 100, (21, 35), dtype=torch.int32)
    compiled = compile_fn(lambda x: (x.sum(1), x.sum(0), x.amax(0), x.amin(0)), x, min_chunk_size=1)
    assert len(compiled.kernels) == 1


@pytest.mark.parametrize("fn", [
    lambda x, y: (x.sum(1), y.sum(0)),                 # different inputs
    lambda x, y: (x.sum(1), (x * y.flip(1)).sum(0)),   # reads y backwards along the row loop
    lambda x, y: (x.sum(1), x.prod(0)),                # no column form for prod
    lambda x, y: (x.sum(1), (x.sum(1, keepdim=True) * x).sum(0)),  # reads the row result
])
def test_unfusable_pairs_keep_two_kernels(fn):
    compiled = compile_fn(fn, torch.randn(20, 30), torch.randn(20, 30))
    assert len(compiled.kernels) == 2
    assert "omp_get_thread_num" not in source(compiled)


def test_layernorm_backward_runs_its_column_sums_in_the_row_kernel():
    from helpers import check_model
    from tdbg.compiler.config import current, use
    with schedule_log() as messages, use(current().replace(logs=frozenset({"schedule"}), num_threads=2, min_chunk_size=1)):
        check_model(torch.nn.LayerNorm(96), [torch.randn(64, 96, requires_grad=True)], check_grad=True)
    # grad_weight = (g * xhat).sum(0) joins the row sums of g * w * xhat; grad_bias = g.sum(0) follows
    assert any("row+column reduction: buf5 keeps 96 column accumulators" in m for m in messages), messages
    assert any("fuse buf6 into" in m and "(column reduction, ranges [96])" in m for m in messages), messages


# -- a reduction accumulating inside the loop of the inner pointwise node it reads ------------
ROWS_NAN_INF = {1: float("nan"), 2: float("inf"), 4: -float("inf")}


def rows_with_nan_inf(n):
    x = torch.randn(6, n, generator=torch.Generator().manual_seed(n))
    for row, value in ROWS_NAN_INF.items():
        x[row, n // 2] = value
    x[3, :] = -float("inf")
    x[5, :] = float("inf")
    return x


@pytest.mark.parametrize("n", [1, 17, 1023, 1025])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_sum_in_the_exp_loop_matches_eager_with_nan_inf_rows(op, n):
    fn = lambda x: getattr(torch, op)(x, -1)  # noqa: E731
    x = rows_with_nan_inf(n)
    with schedule_log() as messages:
        compiled = compile_fn(fn, x, logs=frozenset({"schedule"}))
    merged = [m for m in messages if "accumulates inside" in m]
    assert merged == ([] if n == 1 else [f"{compiled.kernels[0]}: buf2 accumulates inside buf1's loop "
                                         "(same reduction ranges, reads it at its index)"]), messages
    if n > 128:
        tail = f"for (int64_t r0 = r0b; r0 < (r0b + 128 < {n} ? r0b + 128 : {n}); ++r0)"
        heads = [re.sub(r"acc\d+p", "accp", h) for h in loop_heads(source(compiled))]
        # the sum's partial block wraps the exp loop; the epilogue loop follows
        assert heads[heads.index(tail) - 2:heads.index(tail) + 2] == [
            f"for (int64_t r0b = 0; r0b < {n}; r0b += 128)", "#pragma omp simd simdlen(32) reduction(+:accp)",
            tail, "#pragma omp simd simdlen(8)"], heads


def test_max_of_the_producer_accumulates_nan_aware_in_its_loop():
    x = rows_with_nan_inf(300)
    compiled, messages = schedule_messages(lambda x: (lambda y: (y.amax(-1), y.amin(-1), y * 3))(
        (x - x.mean(-1, keepdim=True)).exp()), x)
    assert any("buf2 accumulates inside buf1's loop" in m for m in messages), messages
    src = source(compiled)
    assert "reduction(max:acc8) reduction(|:acc8_nan)" in src and "if (acc8_nan) acc8 = " in src


def test_argmax_of_the_producer_keeps_its_own_loop():
    fn = lambda x: (lambda y: (y.argmax(-1), y * 3))((x - x.amax(-1, keepdim=True)).exp())  # noqa: E731
    compiled, messages = schedule_messages(fn, rows_with_nan_inf(40))
    assert any("buf2 keeps its own loop: a argmax reduction would make the loop scalar" in m for m in messages), messages
    heads = loop_heads(source(compiled))
    # max loop, the exp loop (vectorized), the scalar argmax loop, the mul loop
    assert heads.count("for (int64_t r0 = 0; r0 < 40; ++r0)") == 4 and heads.count("#pragma omp simd simdlen(8)") == 2


def test_injected_bug_keeps_the_reduction_in_its_own_loop():
    x = torch.randn(4, 40)
    with schedule_log() as messages:
        compiled = compile_fn(lambda x: torch.softmax(x, -1) * 1, x, logs=frozenset({"schedule"}),
                              inject_bug=("neg", "runtime_error"))
    assert any("buf2 keeps its own loop: a computed index or an injected bug may write tdbg_status" in m
               for m in messages), messages
    assert "for (int64_t r0 = 0; r0 < 40; ++r0)" in loop_heads(source(compiled))[4:]   # the sum's own loop


def fake_node(name, reads, rranges=(40,), reduction=None):
    x0, r0 = sympy.Symbol("x0", integer=True), sympy.Symbol("r0", integer=True)
    data = SimpleNamespace(reduction_type=reduction, src_dtype=torch.float32)
    return SimpleNamespace(name=name, reads=reads, rranges=rranges, is_reduction=reduction is not None,
                           index=[x0] if reduction else [x0, r0], rindex=[r0] if reduction else [],
                           store_index=40 * x0 + r0, buffer=SimpleNamespace(data=data))


@pytest.mark.parametrize("read, rranges, reason", [
    (lambda x0, r0: 40 * x0 + r0, (40,), None),
    (lambda x0, r0: 40 * x0 + 39 - r0, (40,), "it reads buf1 at another index"),
    (lambda x0, r0: 40 * x0 + r0, (8, 5), "reduction ranges (8, 5) differ from (40,)"),
])
def test_the_reduction_accumulates_in_the_producer_only_at_its_index_and_ranges(read, rranges, reason):
    x0, r0 = sympy.Symbol("x0", integer=True), sympy.Symbol("r0", integer=True)
    producer = fake_node("buf1", {"in0": [40 * x0 + r0]})
    consumer = fake_node("buf2", {"buf1": [40 * x0 + r0, sympy.expand(read(x0, r0))]}, rranges, "sum")
    group = SimpleNamespace(nodes=[producer, consumer], lane=None, columns=None)
    assert scheduler.accumulates_in_producer(group, producer, current()) == (consumer, reason)
    assert scheduler.accumulates_in_producer(group, consumer, current()) == (None, None)


# -- a pointwise group feeding a reduction over its last dims joins the reduction's loops -------
def scaled_softmax(s):
    return torch.softmax(s / 6.0, -1)


@pytest.mark.parametrize("shape", [(3, 5, 37), (2, 4, 196), (6, 17)])
def test_scaled_scores_run_inside_the_softmax_kernel(shape):
    """Attention's `softmax(scores / c)`: the division is read twice by the softmax (its max and
    its exp), so it used to be a kernel of its own writing a buffer; now it is an inner node of the
    softmax's row loop, kept in a scratch row."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
    x[0, ..., 3] = float("nan")
    x[-1, ..., :] = float("inf")
    compiled, messages = schedule_messages(scaled_softmax, x)
    assert len(compiled.kernels) == 1, compiled.kernels
    assert [m for m in messages if "pointwise into reduction" in m] == [
        f"fuse buf1 into ['buf0'] (pointwise into reduction, ranges {list(shape[:-1])})"]
    assert "scratch0[" in source(compiled)      # the division's row, never a buffer
    got, want = compiled(x), scaled_softmax(x)
    ref = scaled_softmax(x.double())
    assert torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    assert ((got[ok].double() - ref[ok]).abs() <= (want[ok].double() - ref[ok]).abs() + 2 * 2.0 ** -24).all()


@pytest.mark.parametrize("fn, why", [
    (lambda s: (lambda d: (torch.softmax(d, -1), d.sum(0)))(s / 6.0), "a column sum reads the division too"),
    (lambda s: torch.softmax(s[:, :8] / 6.0, -1), "rows of 8 are shorter than MIN_INNER_ROW"),
])
def test_a_pointwise_keeps_its_kernel_when_the_reduction_cannot_take_it(fn, why):
    x = torch.randn(40, 64)
    compiled, messages = schedule_messages(fn, x)
    assert not [m for m in messages if "pointwise into reduction" in m], why
    assert len(compiled.kernels) >= 2, why
    assert scheduler.MIN_INNER_ROW == 16


def residual_layer_norm(x, r, w, b):
    return torch.nn.functional.layer_norm(x + r, x.shape[-1:], w, b, 1e-5)


@pytest.mark.parametrize("shape", [(128, 256), (3, 37, 100), (5, 257)])
def test_a_residual_add_runs_inside_its_layer_norm_kernel(shape):
    """BERT-style `layer_norm(h + residual)`: var_mean's shift reads the row's first value and its
    mean is a per-row pointwise reading it too, so the add used to keep a kernel of its own writing
    a buffer; now its row is a scratch array the layer norm reads, first element included."""
    g = torch.Generator().manual_seed(sum(shape))
    x, r = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g) * 3
    x[0, ..., 3] = float("nan")
    x[-1, ..., :] = float("inf")
    w, b = torch.randn(shape[-1], generator=g), torch.randn(shape[-1], generator=g)
    compiled, messages = schedule_messages(residual_layer_norm, x, r, w, b)
    assert len(compiled.kernels) == 1, compiled.kernels
    assert [m for m in messages if "pointwise into reduction" in m] == [
        f"fuse buf1 into ['buf0'] (pointwise into reduction, ranges {list(shape[:-1])})"]
    assert "scratch0[0]" in source(compiled)     # the shift: the row's first element
    got, want = compiled(x, r, w, b), residual_layer_norm(x, r, w, b)
    ref = residual_layer_norm(*(t.double() for t in (x, r, w, b)))
    assert torch.equal(got.isnan(), want.isnan())
    # the rule: within 8 half-ulps of the terms w * xhat and b, each rounding at most half an ulp
    # (the add, the shift, the mean, the variance, rsqrt, two products and the sum; eager: <= 2.7)
    xhat = torch.nn.functional.layer_norm((x + r).double(), shape[-1:])
    ok = ~want.isnan()
    scale = (w.abs().double() * (xhat.abs() + 1) + b.abs().double())[ok]
    assert ((got[ok].double() - ref[ok]).abs() <= 8 * 2.0 ** -24 * scale).all()


X0, R0, R1 = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("x0", "r0", "r1"))
KS = sympy.Symbol("ks0", integer=True, positive=True)


@pytest.mark.parametrize("rranges, store, index, offset", [
    ((256,), 256 * X0 + R0, 256 * X0 + R0, R0),            # its own element
    ((256,), 256 * X0 + R0, 256 * X0, 0),                  # the row's first value (var_mean's shift)
    ((256,), 256 * X0 + R0, 256 * X0 + 255, 255),          # its last
    ((256,), 256 * X0 + R0, 256 * X0 + 256, None),         # the next row's first
    ((256,), 256 * X0 + R0, 256 * X0 + 2 * R0, None),      # another element each iteration
    ((4, 8), 32 * X0 + 8 * R0 + R1, 32 * X0 + 9, 9),
    ((4, 8), 32 * X0 + R0 + 4 * R1, 32 * X0 + 9, None),    # stored transposed: the scratch row is not
    ((KS,), KS * X0 + R0, KS * X0, 0),                     # a symbolic row's first value
    ((KS,), KS * X0 + R0, KS * X0 + 1, None),              # ... a row of 1 has no second
])
def test_row_offset_allows_fixed_elements_of_the_row_only(rranges, store, index, offset):
    node = SimpleNamespace(index=[X0, *(R0, R1)[:len(rranges)]], rranges=rranges, store_index=store)
    assert scheduler.row_offset(node, index) == offset
