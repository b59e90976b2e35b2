"""Vectorized and cache-friendly loops: `#pragma omp simd` where it is safe (and only there),
reduction clauses with NaN-propagating max/min, per-row scratch arrays instead of full-size
intermediates, chunked outer reductions that walk memory contiguously, and the config switches."""
import contextlib
import logging
import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.codegen_loops import LoopFacts
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table

SIMD = "#pragma omp simd"


def compile_fn(fn, *inputs, **cfg):
    """Compile `fn` with tdbg (threads fixed at 2) and assert its results equal eager's."""
    lowering.reset_counters()
    cfg.setdefault("num_threads", 2)
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    compiled = compile_aten(gm, list(inputs), current().replace(**cfg))
    got = torch.utils._pytree.tree_leaves(compiled(*inputs))
    for g, w in zip(got, torch.utils._pytree.tree_leaves(fn(*inputs))):
        torch.testing.assert_close(g, w, equal_nan=True)
    return compiled


def source(compiled):
    src = compiled.source_code
    return src[src.index("KERNELS = {"):src.index("NARGS")]


@contextlib.contextmanager
def schedule_log():
    """The messages logged on the `schedule` channel inside the block (a list filled as it runs)."""
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("tdbg.schedule")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def schedule_messages(fn, *inputs, **cfg):
    with schedule_log() as messages:
        compiled = compile_fn(fn, *inputs, logs=frozenset({"schedule"}), **cfg)
    return compiled, messages


def loop_heads(src):
    """The `for` heads and pragmas of the kernel source, in order, without indentation."""
    return [line.strip() for line in src.splitlines() if line.strip().startswith(("for (", "#pragma"))]


@pytest.mark.parametrize("n", [1023, 17, 1])
def test_contiguous_pointwise_kernel_is_vectorized_with_tails(n):
    args = [torch.randn(3, n), torch.randn(1, n), torch.randn(3, 1)]
    compiled = compile_fn(lambda a, b, c: ((a + b) * c).sin() + a, *args, min_chunk_size=1)
    src = source(compiled)
    assert "simd simdlen(8)" in src     # n == 1: one loop, `parallel for simd`
    if n > 1:
        # the vectorized column loop is innermost, the row loop is the parallel one
        heads = loop_heads(src)
        assert heads[:4] == ["#pragma omp parallel for num_threads(2)", "for (int64_t x0 = 0; x0 < 3; ++x0)",
                             "#pragma omp simd simdlen(8)", f"for (int64_t x1 = 0; x1 < {n}; ++x1)"]


def test_single_loop_combines_parallel_and_simd():
    x = torch.randn(10000)
    src = source(compile_fn(lambda x: x * 2 + 1, x))
    assert "#pragma omp parallel for simd simdlen(8) num_threads(2)" in src


def test_simdlen_counts_float32_lanes_and_scales_to_narrow_types():
    x = torch.randint(0, 200, (64, 100), dtype=torch.uint8)
    src = source(compile_fn(lambda x: x + 3, x))
    assert f"{SIMD} simdlen(32)" in src           # 8 float lanes = 32 uint8 lanes (256 bits)
    src = source(compile_fn(lambda x: x + 3, x.float(), simdlen=16))
    assert f"{SIMD} simdlen(16)" in src


@pytest.mark.parametrize("n", [1023, 17, 1])
def test_sum_reduction_is_vectorized_with_float_partials_into_a_double(n):
    x = torch.randn(5, n)
    src = source(compile_fn(lambda x: x.sum(1), x))
    assert "double acc0 = 0;" in src
    if n > 1:                                # n == 1: no reduction loop at all
        assert "float acc0p = 0;" in src and "acc0 = acc0 + acc0p;" in src
        assert "#pragma omp simd simdlen(32) reduction(+:acc0p)" in src   # 4 chains of 8 lanes
    if n > 128:
        assert "for (int64_t r0b = 0; r0b < 1023; r0b += 128)" in src
        assert "for (int64_t r0 = r0b; r0 < (r0b + 128 < 1023 ? r0b + 128 : 1023); ++r0)" in src


@pytest.mark.parametrize("dim", [0, 1])
def test_float_sums_are_at_least_as_accurate_as_eager(dim):
    x = torch.randn(1000, 1030, generator=torch.Generator().manual_seed(0)) + 0.5
    got = torch.utils._pytree.tree_leaves(compile_fn(lambda x: x.sum(dim), x)(x))[0].double()
    reference = x.double().sum(dim)
    eager_error = (x.sum(dim).double() - reference).abs().max()
    assert (got - reference).abs().max() <= eager_error


@pytest.mark.parametrize("pos", [0, 7, 8, 16, 99])
def test_max_reduction_propagates_nan_from_any_lane(pos):
    x = torch.randn(4, 100)
    x[1, pos] = float("nan")
    x[2, pos] = float("inf")
    x[3] = -float("inf")
    src = source(compile_fn(lambda x: (x.amax(1), x.amin(1), torch.max(x, 1).values), x))
    assert "reduction(max:acc0) reduction(|:acc0_nan)" in src
    assert "reduction(min:" in src


def test_integer_and_bool_reductions_match_eager():
    x = torch.randint(-50, 50, (6, 37), dtype=torch.int32)
    compile_fn(lambda x: (x.amax(1), x.amin(1), x.sum(1), (x > 0).any(1), (x > -45).all(1), x.prod(1) % 7), x)


def test_softmax_with_nan_and_inf_inputs_matches_eager():
    x = torch.randn(6, 33)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3, :] = -float("inf")
    x[4, 0] = -float("inf")
    compile_fn(lambda x: torch.softmax(x, -1), x)


def test_softmax_exp_stays_in_a_per_row_scratch_array():
    x = torch.randn(64, 1000)
    compiled = compile_fn(lambda x: torch.softmax(x, -1), x)
    src = source(compiled)
    assert "float scratch" in src and "[1000];" in src
    assert src.count("out_ptr") == 2      # one parameter, one store: the exp never goes to memory
    assert compiled.source_code.count("empty_strided((") == 1
    # max loop; exp loop accumulating the sum (float partials per 128 elements into a double); div loop
    assert loop_heads(src) == [
        "#pragma omp parallel for num_threads(2)", "for (int64_t x0 = 0; x0 < 64; ++x0)",
        "#pragma omp simd simdlen(8) reduction(max:acc0) reduction(|:acc0_nan)", "for (int64_t r0 = 0; r0 < 1000; ++r0)",
        "for (int64_t r0b = 0; r0b < 1000; r0b += 128)",
        "#pragma omp simd simdlen(32) reduction(+:acc6p)",
        "for (int64_t r0 = r0b; r0 < (r0b + 128 < 1000 ? r0b + 128 : 1000); ++r0)",
        "#pragma omp simd simdlen(8)", "for (int64_t r0 = 0; r0 < 1000; ++r0)",
    ], src
    body = [line.strip() for line in src.splitlines() if not line.strip().startswith("// FX")]
    exp = body.index("float tmp5 = tdbg_exp(tmp4);")
    assert body[exp + 1:exp + 4] == ["scratch2[r0] = tmp5;", "// accumulate", "acc6p = acc6p + static_cast<float>(tmp5);"]
    assert src.count("scratch2[r0]") == 2   # written by the exp loop, read once by the div loop


def test_argmax_stays_scalar_and_the_log_says_why():
    x = torch.randn(8, 300)
    compiled, messages = schedule_messages(lambda x: x.argmax(1), x)
    assert SIMD not in source(compiled)
    assert any("loop not vectorized" in m and "argmax keeps the first index" in m for m in messages), messages


def residual_layer_norm(x, y):
    h = x + y.transpose(0, 1).reshape(64, 96)    # stored (an output), then normalized in its rows
    return h, torch.nn.functional.layer_norm(h, (96,))


def test_row_sums_of_a_buffer_an_earlier_loop_wrote_are_vectorized():
    """A residual add stored by the kernel's first loop, then var_mean's sums reading it (at the
    element and at the row's first value, the shift): the buffer is complete before those loops
    start, so they vectorize (they used to stay scalar double chains: Swin-tiny's layer norms,
    2026-11-27, 65.3 -> 62.0 ms per call at 2 threads)."""
    x, y = torch.randn(64, 96), torch.randn(8, 8, 96)
    compiled, messages = schedule_messages(residual_layer_norm, x, y)
    src = [line.strip() for line in source(compiled).splitlines()]
    accumulators = [i for i, line in enumerate(src) if line.startswith("double acc")]
    assert len(compiled.kernels) == 1 and len(accumulators) == 2, src
    for i in accumulators:
        assert src[i + 2].startswith(SIMD) and "reduction(+:" in src[i + 2], src[i:i + 3]
    assert not [m for m in messages if "loop not vectorized" in m], messages


def test_a_loop_reading_what_it_writes_at_another_index_stays_scalar():
    facts = LoopFacts(stores={"buf1"}, foreign_reads={"buf1", "buf0"})
    assert facts.conflicts() == ["reads buf1, which this loop writes, at another index"]
    assert LoopFacts(stores={"buf2"}, foreign_reads={"buf1"}).conflicts() == []


def test_indirect_loads_with_bounds_checks_are_not_vectorized():
    w, idx = torch.randn(50, 64), torch.tensor([3, 0, 49, 3, 7])
    compiled, messages = schedule_messages(lambda w, i: torch.nn.functional.embedding(i, w) * 2, w, idx)
    assert SIMD not in source(compiled)
    assert any("loop not vectorized" in m and "writes tdbg_status" in m for m in messages), messages


@pytest.mark.parametrize("op", ["index_put", "scatter_add"])
def test_scatter_with_duplicate_indices_matches_eager_without_simd_stores(op):
    x, src_ = torch.zeros(10, 16), torch.randn(6, 16)
    idx = torch.tensor([1, 3, 1, 1, 9, 3])
    if op == "index_put":
        fn = lambda x, s: torch.index_put(x * 1, (idx,), s * 2, accumulate=True)  # noqa: E731
    else:
        fn = lambda x, s: torch.scatter_add(x * 1, 0, idx[:, None].expand(6, 16), s * 2)  # noqa: E731
    compiled = compile_fn(fn, x, src_)
    # the accumulate-scatter runs through aten; no generated loop stores through a computed index
    assert any(op in t for t in compiled.fallback_targets), compiled.fallback_targets
    for line in source(compiled).splitlines():
        assert not re.search(r"out_ptr\d+\[[^\]]*tmp", line), line


def test_outer_sum_walks_memory_contiguously():
    x = torch.randn(300, 1030)
    LANE = "for (int64_t x0 = x0c; x0 < (x0c + 528 < 1030 ? x0c + 528 : 1030); ++x0)"
    src = source(compile_fn(lambda x: x.sum(0), x))
    heads = loop_heads(src)
    # chunks of 528 columns per thread; per chunk: zero the double accumulators, then blocks of
    # 8 rows summed per column in float (partials), added to the doubles; then the stores
    assert heads == [
        "#pragma omp parallel for num_threads(2)", "for (int64_t x0c = 0; x0c < 1030; x0c += 528)",
        "#pragma omp simd simdlen(8)", LANE,
        "for (int64_t r0b = 0; r0b < 300; r0b += 8)",
        "#pragma omp simd simdlen(8)", LANE,
        "for (int64_t r0 = r0b; r0 < (r0b + 8 < 300 ? r0b + 8 : 300); ++r0)",
        "#pragma omp simd simdlen(8)", LANE,
        "#pragma omp simd simdlen(8)", LANE,
        "#pragma omp simd simdlen(8)", LANE,
    ], heads
    assert "in_ptr0[(x0 + (1030*r0))]" in src


@pytest.mark.parametrize("shape", [(37, 17), (300, 1030), (5, 8)])
def test_outer_mean_with_epilogue_matches_eager(shape):
    x = torch.randn(*shape)
    src = source(compile_fn(lambda x: ((x * x).mean(0) + 1).sqrt() * x.amax(0), x))
    assert "x0c" in src


def test_outer_reductions_of_every_kind_over_a_middle_dim():
    x = torch.randn(3, 40, 24)
    x[1, 5, 7] = float("nan")
    src = source(compile_fn(lambda x: (x.sum(1), x.amax(1), x.amin(1), x.argmax(1), x.prod(1),
                                       torch.var_mean(x, 1), (x > 1).any(1)), x))
    assert "for (int64_t x1c = 0; x1c < 24; x1c += 24)" in src


@pytest.mark.parametrize("cfg", [dict(vectorize=False), dict(simdlen=0)])
def test_vectorization_off_removes_every_simd_pragma(cfg):
    x = torch.randn(64, 100)
    fn = lambda x: (torch.softmax(x, -1), x.sum(0), x * 2)  # noqa: E731
    assert SIMD in source(compile_fn(fn, x))
    compiled, messages = schedule_messages(fn, x, **cfg)
    assert "simd" not in source(compiled)
    reason = "config.vectorize is off" if "vectorize" in cfg else "config.simdlen is 0"
    assert any(f"loop not vectorized" in m and reason in m for m in messages), messages


def test_vectorization_off_keeps_parallel_loops_and_parallel_off_removes_them():
    """What docs/compiler.md promises: TDBG_VECTORIZE=0 leaves `omp parallel for` (a `parallel for simd`
    loses its simd), TDBG_PARALLEL=0 as well leaves no pragma at all."""
    x = torch.randn(64, 100)
    fn = lambda x: (torch.softmax(x, -1), x.sum(0), x * 2)  # noqa: E731
    scalar = [h for h in loop_heads(source(compile_fn(fn, x, vectorize=False))) if h.startswith("#pragma")]
    assert any("omp parallel" in h for h in scalar) and not any("simd" in h for h in scalar), scalar
    assert [h for h in loop_heads(source(compile_fn(fn, x, vectorize=False, parallel=False)))
            if h.startswith("#pragma")] == []


def test_division_by_a_row_value_is_one_reciprocal_and_a_multiply_per_element():
    x = torch.randn(16, 300)
    src = source(compile_fn(lambda x: (torch.softmax(x, -1), x / x.abs().amax(1, keepdim=True),
                                       x.mean(1), x / (x + 2)), x))
    recips = re.findall(r"float (tmp\d+) = static_cast<float>\(1\) / (\w+);", src)
    assert len(recips) == 2, src                       # the softmax sum and the amax, once per row
    for recip, _ in recips:
        assert re.search(rf"float tmp\d+ = tmp\d+ \* {recip};", src)
    assert "/ static_cast<float>(300.0)" in src       # mean: division by a constant stays a division
    assert re.search(r"tmp\d+ = tmp\d+ / tmp\d+;", src)  # x / (x + 2): the divisor varies per element


def test_integer_true_division_by_a_row_value_stays_a_division():
    x = torch.randint(1, 50, (6, 40), dtype=torch.int32)
    src = source(compile_fn(lambda x: x / x.amax(1, keepdim=True), x))
    assert "static_cast<float>(1) /" not in src


def test_native_vector_width_is_the_default_and_reaches_the_assembly(tmp_path):
    """Config() takes the vector width g++ -march=native targets (16 float lanes and
    -mprefer-vector-width=512 where it predefines __AVX512F__, else 8): on an AVX-512 CPU tdbg's
    loops were 256 bits wide while eager's and Inductor's kernels use 512. A simdlen loop built
    with the default flags uses that many lanes: zmm registers at 16, ymm at 8."""
    import subprocess

    from tdbg.compiler.build import native_vector
    from tdbg.compiler.config import Config
    predefined = subprocess.run(["g++", "-march=native", "-dM", "-E", "-x", "c++", "/dev/null"],
                                capture_output=True, text=True).stdout
    lanes, flags = native_vector()
    assert (lanes, flags) == ((16, ("-mprefer-vector-width=512",)) if "#define __AVX512F__ 1" in predefined else (8, ()))
    cfg = Config()   # the suite pins TDBG_SIMDLEN=8 for current(); the bare default is the CPU's
    assert cfg.simdlen == lanes and cfg.cxx_flags[len(cfg.cxx_flags) - len(flags):] == flags
    src = tmp_path / "k.cpp"
    src.write_text('extern "C" void k(const float* a, float* o, long n) {\n'
                   f'#pragma omp simd simdlen({lanes})\n  for (long i = 0; i < n; ++i) o[i] = a[i] * 3.0f + 1.0f;\n}}\n')
    build = [f for f in cfg.cxx_flags if f not in ("-w", "-shared") and not f.startswith("-Wl,")]
    proc = subprocess.run([cfg.cxx, *build, "-S", str(src), "-o", str(tmp_path / "k.s")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    asm = (tmp_path / "k.s").read_text()
    if "ymm" not in asm and "zmm" not in asm:
        pytest.skip("no AVX vector loop: not an x86-64 AVX target")
    assert ("zmm" in asm) == (lanes == 16)


@pytest.mark.parametrize("lanes", [8, 16])
def test_gelu_and_row_sums_at_either_width_match_eager(lanes):
    """The erf GELU and a float32 row sum (4 chains of `lanes` partial sums) at 8 and 16 lanes."""
    x = torch.randn(64, 1000)
    compile_fn(lambda x: (torch.nn.functional.gelu(x), x.sum(1)), x, simdlen=lanes)
