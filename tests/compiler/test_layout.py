"""Layout planning (compiler/layout.py): inference graphs with 2-d convolutions run NHWC.

Each test compiles a small aten graph with compile_aten and checks the answer against float64
within float32 tolerance, the strides of the outputs against eager's, and what the plan did
(conversions inserted, buffers in channels_last, loops in memory order)."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, layout, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table

aten = torch.ops.aten
F = torch.nn.functional


def trace(fn, *inputs):
    return make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)


def compile_fn(fn, *inputs, kind="inference", **cfg):
    lowering.reset_counters()
    return compile_aten(trace(fn, *inputs), list(inputs), current().replace(**cfg), kind=kind)


def check(fn, compiled, *inputs):
    """Outputs within float32 tolerance of the float64 answer, with eager's strides."""
    got = torch.utils._pytree.tree_leaves(compiled(*inputs))
    want = torch.utils._pytree.tree_leaves(fn(*inputs))
    ref = torch.utils._pytree.tree_leaves(fn(*[x.double() for x in inputs]))
    for g, w, r in zip(got, want, ref):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)
        assert g.stride() == w.stride(), (g.stride(), w.stride())


def params(c_in, c_out, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(c_out, c_in, k, k, generator=g) * 0.2, torch.randn(c_out, generator=g)


def block(x, w1, b1, w2, mean, var, gamma, beta):
    y = F.conv2d(x, w1, b1, padding=1)
    y = F.batch_norm(y, mean, var, gamma, beta, training=False, eps=1e-5)
    y = F.relu6(y) + x
    return (F.conv2d(y, w2, padding=1),)


def block_inputs(c=8, hw=10):
    g = torch.Generator().manual_seed(1)
    w1, b1 = params(c, c)
    w2, _ = params(c, c, seed=2)
    stats = [torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g),
             torch.randn(c, generator=g)]
    return [torch.randn(2, c, hw, hw, generator=g), w1, b1, w2, *stats]


def test_conv_chain_runs_channels_last_and_returns_eager_strides():
    inputs = block_inputs()
    gm = trace(block, *inputs)
    planned = layout.plan_layout(gm, inputs, current(), "inference")
    convs = [n for n in planned.graph.nodes if n.target is aten.convolution.default]
    assert len(convs) == 2
    for conv in convs:   # every convolution reads a channels_last conversion
        assert conv.args[0].target is aten.clone.default
        assert conv.args[0].kwargs["memory_format"] is torch.channels_last
        assert layout.is_channels_last(conv.meta["val"])
    out = next(n for n in planned.graph.nodes if n.op == "output").args[0][0]
    assert out.meta["tdbg_eager_stride"] == (800, 100, 10, 1)
    compiled = compile_fn(block, *inputs)
    check(block, compiled, *inputs)
    assert compiled(*inputs)[0].is_contiguous()


def test_planned_kernel_loops_in_memory_order():
    """BN + relu6 + residual add + conversion is one kernel writing NHWC with the channel dim
    innermost (unit stride store), not a strided NCHW walk."""
    inputs = block_inputs(c=8, hw=10)
    compiled = compile_fn(block, *inputs)
    src = compiled.source_code
    kernels = src[src.index("KERNELS = {"):src.index("NARGS")]
    name = next(k for k in compiled.kernels if "clamp" in k)
    kernel = src[src.index(f"'{name}'"):]
    kernel = kernel[:kernel.index("'''", kernel.index("r'''") + 4)]
    # channels (8) innermost: the store has unit stride in the loop over x3
    assert "for (int64_t x3 = 0; x3 < 8; ++x3)" in kernel
    assert "out_ptr0[(x3 + (8*x2) + (80*x1) + (800*x0))]" in kernel
    assert all(op in name for op in ("add", "clamp", "clone", "sqrt"))   # BN, relu6, residual, NHWC: one kernel


def test_plan_off_keeps_graph_and_same_answer():
    inputs = block_inputs()
    gm = trace(block, *inputs)
    assert layout.plan_layout(gm, inputs, current().replace(layout_optimization=False), "inference") is gm
    assert layout.plan_layout(gm, inputs, current(), "forward") is gm   # training graphs are not planned
    compiled = compile_fn(block, *inputs, layout_optimization=False)
    check(block, compiled, *inputs)


def test_graph_without_convolution_is_untouched():
    gm = trace(lambda x: (x.relu() + 1,), torch.randn(2, 3, 4, 4))
    assert layout.plan_layout(gm, [torch.randn(2, 3, 4, 4)], current(), "inference") is gm


def test_view_of_planned_value_becomes_reshape():
    """flatten of an NHWC conv output cannot be a view: the plan turns it into a reshape."""
    w, b = params(4, 6)

    def fn(x, w, b):
        return (F.conv2d(x, w, b).relu().view(2, -1) * 2,)
    inputs = [torch.randn(2, 4, 5, 5), w, b]
    gm = trace(fn, *inputs)
    planned = layout.plan_layout(gm, inputs, current(), "inference")
    assert aten.reshape.default in {n.target for n in planned.graph.nodes}
    compiled = compile_fn(fn, *inputs)
    check(fn, compiled, *inputs)


def test_conv_output_returned_directly_keeps_eager_strides():
    """An output computed by the aten convolution itself (NHWC after planning) is copied back."""
    w, b = params(3, 5)

    w2, _ = params(5, 4, k=1, seed=4)

    def fn(x, w, b, w2):
        y = F.conv2d(x, w, b)
        return y, F.conv2d(y.sigmoid(), w2)
    inputs = [torch.randn(2, 3, 7, 7), w, b, w2]
    compiled = compile_fn(fn, *inputs)
    check(fn, compiled, *inputs)


@pytest.mark.parametrize("groups", [1, 4])
def test_depthwise_and_squeeze_excite_exact(groups):
    """EfficientNet-style: grouped conv, SiLU, mean over H, W, 1x1 convs on [N, C, 1, 1], gating."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(8, 8 // groups, 3, 3, generator=g) * 0.3
    w_se1, w_se2 = torch.randn(2, 8, 1, 1, generator=g), torch.randn(8, 2, 1, 1, generator=g)

    def fn(x, w, w_se1, w_se2):
        y = F.silu(F.conv2d(x, w, padding=1, groups=groups))
        s = y.mean((2, 3), keepdim=True)
        s = torch.sigmoid(F.conv2d(F.silu(F.conv2d(s, w_se1)), w_se2))
        return (y * s,)
    inputs = [torch.randn(2, 8, 9, 9, generator=g), w, w_se1, w_se2]
    compiled = compile_fn(fn, *inputs)
    check(fn, compiled, *inputs)
