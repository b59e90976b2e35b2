"""Padding in channels_last graphs (lowering_data.py lower_pad) and values that flow into one reader
along several paths (GraphLowering._converging_sink).

EfficientNet pads each stride-2 depthwise convolution's SiLU input in H and W. Planned NHWC, the
padded dims are outer loops, so the pad reads its input at a wrapped index with no branch and
the loop over channels vectorizes; the BatchNorm before the SiLU (read by sigmoid and by the
multiply) is inlined into that one kernel instead of taking a round trip through memory.
Answers are checked against float64 within float32 tolerance, with eager's strides."""
import re

import torch
from test_layout import check, compile_fn, trace

from tdbg.compiler import layout
from tdbg.compiler.config import current

F = torch.nn.functional


def kernel_source(compiled, fragment):
    """The C++ of the one kernel whose name contains `fragment`."""
    (name,) = [k for k in compiled.kernels if fragment in k]
    src = compiled.source_code
    start = src.index(f'extern "C" int {name}(')
    return src[start:src.index("\n}\n", start)]


def padded_block(x, w, mean, var, gamma, beta, wd):
    """EfficientNet's stride-2 step: BN, SiLU, pad right/bottom by one, depthwise conv."""
    y = F.batch_norm(F.conv2d(x, w), mean, var, gamma, beta, training=False, eps=1e-3)
    y = F.pad(F.silu(y), [0, 1, 0, 1])
    return (F.conv2d(y, wd, stride=2, groups=wd.shape[0]),)


def padded_inputs(c=8, hw=9):
    g = torch.Generator().manual_seed(5)
    return [torch.randn(2, 4, hw, hw, generator=g), torch.randn(c, 4, 1, 1, generator=g) * 0.3,
            torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5, torch.randn(c, generator=g),
            torch.randn(c, generator=g), torch.randn(c, 1, 3, 3, generator=g) * 0.3]


def test_planned_pad_is_branch_free_and_fused_with_batchnorm_and_silu():
    inputs = padded_inputs()
    compiled = compile_fn(padded_block, *inputs)
    check(padded_block, compiled, *inputs)
    # the input's NHWC conversion, ONE kernel from the first convolution's output to the depthwise
    # convolution's input, and the output's copy back to eager's NCHW strides
    assert len(compiled.kernels) == 3, compiled.kernels
    src = kernel_source(compiled, "constant_pad_nd")
    assert all(op in compiled.kernels[1] for op in ("sqrt", "sigmoid", "constant_pad_nd"))
    assert "if (" not in src                          # no masked load: the channel loop vectorizes
    assert "tdbg_detail::sel(" in src and " ? " not in src   # the fill is a blend, not a branch g++ keeps
    assert "#pragma omp simd" in src
    assert "for (int64_t x3 = 0; x3 < 8; ++x3)" in src   # channels innermost (NHWC)
    assert "(x2 % 9)" in src and "(x1 % 9)" in src   # H and W read at a wrapped, in-bounds index
    assert "tdbg_sigmoid" in src and src.count("in_ptr0[") == 1   # the BN value is loaded once


def test_pad_of_innermost_dim_is_cut_into_segments():
    """Unplanned NCHW: H is read at a wrapped index (computed per row), and W, the innermost loop,
    where a wrapped index would be a modulo per element, is cut at the pad: [0, 9) reads with no
    branch, [9, 10) is the pad value (codegen_segments)."""
    inputs = padded_inputs()
    compiled = compile_fn(padded_block, *inputs, layout_optimization=False)
    check(padded_block, compiled, *inputs)
    src = kernel_source(compiled, "constant_pad_nd")
    interior = src[src.index("for (int64_t x3 = 0; x3 < 9; ++x3)"):src.index("for (int64_t x3 = 9; x3 < 10; ++x3)")]
    assert "if (" not in interior and "(x2 % 9)" in interior and "tdbg_detail::sel(" in interior
    pad = src[src.index("for (int64_t x3 = 9; x3 < 10; ++x3)"):]
    assert "in_ptr" not in pad and "] = static_cast<float>(0.0);" in pad   # the pad column: stores only


def test_wrapped_pad_with_crop_and_value_is_exact():
    """Pads before and after, a negative pad (a crop) and a fill value, in H and W of NHWC."""
    g = torch.Generator().manual_seed(6)

    def fn(x, w1, w2):
        return (F.conv2d(F.pad(torch.tanh(F.conv2d(x, w1)), [2, 1, -1, 3], value=0.5), w2),)
    inputs = [torch.randn(2, 3, 5, 4, generator=g), torch.randn(6, 3, 1, 1, generator=g),
              torch.randn(3, 6, 1, 1, generator=g)]
    compiled = compile_fn(fn, *inputs)
    check(fn, compiled, *inputs)
    src = kernel_source(compiled, "constant_pad_nd")
    assert "if (" not in src and "((1 + x1) % 5)" in src and "((2 + x2) % 4)" in src


def test_channels_last_input_is_planned_without_conversions():
    """A graph whose input already is NHWC inserts no conversion, yet its buffers stay NHWC
    (looped channels innermost) instead of being realized NCHW."""
    inputs = padded_inputs()
    inputs[0] = inputs[0].contiguous(memory_format=torch.channels_last)

    def fn(x, w, mean, var, gamma, beta, wd):
        return padded_block(x, w, mean, var, gamma, beta, wd)
    gm = trace(fn, *inputs)
    planned = layout.plan_layout(gm, inputs, current(), "inference")
    assert planned is not gm
    assert any(n.meta.get("tdbg_layout") == "channels_last" for n in planned.graph.nodes)
    compiled = compile_fn(fn, *inputs)
    check(fn, compiled, *inputs)
    src = kernel_source(compiled, "constant_pad_nd")
    assert "for (int64_t x3 = 0; x3 < 8; ++x3)" in src and "if (" not in src


def test_gelu_diamond_is_computed_once_in_its_reader():
    """a * b feeds GELU's x * 0.5 and erf(x / sqrt 2): both reach one multiply, so the product is
    inlined there (no buffer), and loaded and multiplied once per element."""
    def fn(a, b):
        return (F.pad(F.gelu(a * b), [0, 0, 1, 1]),)
    g = torch.Generator().manual_seed(7)
    inputs = [torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)]
    compiled = compile_fn(fn, *inputs)
    check(fn, compiled, *inputs)
    assert len(compiled.kernels) == 1, compiled.kernels
    src = kernel_source(compiled, "erf")
    assert src.count("in_ptr0[") == 1 and src.count("in_ptr1[") == 1
    a, b = (re.search(rf"float (tmp\d+) = in_ptr{i}\[", src).group(1) for i in (0, 1))
    assert src.count(f"{a} * {b}") == 1   # the product computed once, read by both GELU paths
    assert "if (" not in src   # rows padded, the innermost (column) loop is not: branch-free


def bias_gelu_3d(x, w, b, w2):
    """A linear's [B*S, N] output with its bias, viewed [B, S, N] before a GELU that reads it twice
    (Swin's and Mistral's MLPs), then the next linear."""
    h = torch.addmm(b, x, w.t()).view(2, 24, 64)
    return (torch.mm(F.gelu(h).view(48, 64), w2),)


def test_a_value_read_twice_through_a_reshape_is_computed_inside_its_readers_kernel():
    """The bias add is read by both halves of the GELU through a 3-d view: it stays lazy and the
    GELU's kernel computes it (once per index), instead of a kernel of its own writing a buffer
    the scheduler could not fuse (its loops are [48, 64], the GELU's [2, 24, 64])."""
    g = torch.Generator().manual_seed(7)
    inputs = [torch.randn(48, 32, generator=g), torch.randn(64, 32, generator=g) * 0.2,
              torch.randn(64, generator=g), torch.randn(64, 16, generator=g) * 0.2]
    compiled = compile_fn(bias_gelu_3d, *inputs)
    check(bias_gelu_3d, compiled, *inputs)
    [kernel] = compiled.kernels
    assert all(op in kernel for op in ("add", "erf", "mul")), kernel
    src = kernel_source(compiled, "erf")
    assert src.count("in_ptr1[") == 1      # the bias, loaded once per element for both paths
