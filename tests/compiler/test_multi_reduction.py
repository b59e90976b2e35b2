"""Fused row+column reductions: a row reduction (x.sum(1)) and a column reduction (x.mean(0))
of the same input run in one kernel that reads the input once (scheduler.ColumnPart,
codegen_reduction.row_column_body): exact loop structure, results equal to eager for every
supported kind with NaN/inf and odd sizes, epilogues on both sides, and the cases that keep
two kernels."""
import pytest
import torch

from tdbg.compiler import scheduler
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
    compiled = compile_fn(row_col, torch.randn(9, 10))
    assert "#pragma omp parallel num_threads(1)" in source(compiled)


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
