"""Scheduler behaviour seen from compile_aten: vertical/horizontal fusion, views as index remaps,
reductions with their epilogues, limits, dead buffers, buffer reuse, locals and the log."""
import logging

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table

aten = torch.ops.aten


def compile_fn(fn, *inputs, **cfg):
    lowering.reset_counters()
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    compiled = compile_aten(gm, list(inputs), current().replace(**cfg))
    got = torch.utils._pytree.tree_leaves(compiled(*inputs))
    for g, w in zip(got, torch.utils._pytree.tree_leaves(fn(*inputs))):
        torch.testing.assert_close(g, w)
    return compiled


def kernel_source(compiled):
    src = compiled.source_code
    return src[src.index("KERNELS = {"):src.index("NARGS")]


def allocations(compiled):
    return compiled.source_code.count("empty_strided((")


def test_add_pattern_is_one_kernel_without_intermediates():
    args = [torch.randn(64, 32) for _ in range(4)]
    compiled = compile_fn(lambda a, b, c, d: (a + b + c) * d + a, *args)
    assert compiled.kernels == ["cpp_fused_add_mul_0"]
    assert kernel_source(compiled).count("out_ptr") == 2  # parameter + one store
    assert allocations(compiled) == 1


def test_permute_feeding_add_is_an_index_remap():
    x, y = torch.randn(8, 5), torch.randn(5, 8)
    compiled = compile_fn(lambda x, y: x.permute(1, 0) + y, x, y)
    assert compiled.kernels == ["cpp_fused_add_0"]
    assert "permute" in compiled.lowered_nodes
    # the output takes eager's strides, x's layout (1, 5): the loops run in that memory order,
    # so x is read and the result stored contiguously, y through the permuted index
    src = kernel_source(compiled)
    assert "in_ptr0[(x1 + (5*x0))]" in src and "out_ptr0[(x1 + (5*x0))]" in src and "in_ptr1[(x0 + (8*x1))]" in src
    assert compiled(x, y).stride() == (1, 5)
    assert allocations(compiled) == 1


def test_siblings_over_the_same_space_fuse_horizontally():
    x = torch.randn(16, 16)
    compiled = compile_fn(lambda x: (x + 1, x * 2), x)
    assert compiled.kernels == ["cpp_fused_add_mul_0"]
    assert allocations(compiled) == 2


def test_softmax_reductions_and_epilogue_share_one_loop_nest():
    x = torch.randn(32, 50)
    compiled = compile_fn(lambda x: torch.softmax(x, 1), x)
    assert compiled.kernels == ["cpp_fused_amax_div_exp_sub_sum_0"]


def test_layer_norm_is_one_kernel():
    x, w, b = torch.randn(16, 40), torch.randn(40), torch.randn(40)
    compiled = compile_fn(lambda x, w, b: torch.nn.functional.layer_norm(x, (40,), w, b), x, w, b)
    assert len(compiled.kernels) == 1


def test_max_fusion_size_one_keeps_nodes_apart():
    args = [torch.randn(8, 8) for _ in range(4)]
    compiled = compile_fn(lambda a, b, c, d: (a + b + c) * d + a, *args, max_fusion_size=1)
    assert compiled.kernels == ["cpp_fused_add_0", "cpp_fused_add_1", "cpp_fused_mul_2", "cpp_fused_add_3"]


def test_reads_at_other_indices_do_not_fuse():
    x = torch.randn(8, 8)
    compiled = compile_fn(lambda x: (lambda e: e + e.t())(x.exp() + x.sin()), x)
    assert len(compiled.kernels) == 2


def test_dead_buffers_are_eliminated():
    x = torch.randn(4, 4)
    gm = make_fx(lambda x: x + 1)(x)
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_after(placeholder):
        dead = gm.graph.call_function(aten.exp.default, (placeholder,))
    dead.meta["val"] = torch.exp(x)
    gm.recompile()
    compiled = compile_aten(gm, [x], current())
    assert compiled.kernels == ["cpp_fused_add_0"]
    assert dead.name in compiled.lowered_nodes
    torch.testing.assert_close(compiled(x), x + 1)


def test_dead_storage_is_reused():
    x = torch.randn(32, 32)
    compiled = compile_fn(lambda x: x.exp().neg().sin().cos(), x, fusion=False)
    assert len(compiled.kernels) == 4
    assert "# reuse" in compiled.source_code
    assert allocations(compiled) == 2


def test_intermediate_read_only_inside_its_kernel_becomes_a_local():
    x = torch.randn(16, 16)
    compiled = compile_fn(lambda x: (lambda a: a * a.sin())(x + 1), x)
    assert compiled.kernels == ["cpp_fused_add_mul_sin_0"]
    assert allocations(compiled) == 1


def test_schedule_log_explains_fusion_and_parallelism():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tdbg.schedule")
    logger.addHandler(handler)
    try:
        x = torch.randn(4, 4)
        compile_fn(lambda x: (lambda a: a * a.sin())(x + 1), x, logs=frozenset({"schedule"}))
    finally:
        logger.removeHandler(handler)
    messages = [r.getMessage() for r in records]
    assert any(m.startswith("fuse buf") and "(vertical" in m for m in messages), messages
    assert any("loop not parallel: work 16 < min_chunk_size 4096" in m for m in messages), messages


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_pragma_follows_config_and_work(parallel):
    x = torch.randn(128, 64)
    compiled = compile_fn(lambda x: x * 3, x, parallel=parallel, num_threads=2)
    assert ("#pragma omp parallel for num_threads(2)" in kernel_source(compiled)) == parallel


def test_storage_read_by_an_extern_is_not_reused():
    """masked_fill_ returns an alias of its input: that storage must outlive the input's name."""
    def fn(x):
        m = x * 0.5
        m.masked_fill_(m < 0, 0)
        frac = m - m.to(torch.int64)
        m.ceil_()
        return frac, m
    x = torch.tensor([-1.0, 0.3, 2.6])
    compiled = compile_aten(make_fx(fn)(x), [x.clone()], current())
    assert "# reuse" not in compiled.source_code
    for got, want in zip(compiled(x.clone()), fn(x.clone())):
        torch.testing.assert_close(got, want)
