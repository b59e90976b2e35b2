"""Linear biases added by the kernel after the GEMM (compiler/bias_epilogue.py): which addmm is
split into mm + a fused add, which is not, and that the answer holds (float64 reference)."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import bias_epilogue, compile_aten
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table

F = torch.nn.functional


def randn(*shape, seed=0, scale=1.0, dtype=torch.float32):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def linear_residual(x, w, b):
    return F.layer_norm(F.linear(x, w, b) + x, x.shape[-1:])


def linear_returned(x, w, b):
    return F.linear(x, w, b)


def linear_into_extern(x, w, b):
    return F.linear(x, w, b) @ x.transpose(-1, -2)


def linear_cumsum(x, w, b):
    return torch.cumsum(F.linear(x, w, b), 1)   # a scan over 64 runs as aten's call


def linear_in_two_slices(x, w, b):
    y = F.linear(x, w, b)          # each half copied out by a kernel of its own: the add would be one too
    return y[:, :32].t().contiguous(), y[:, 32:].t().contiguous()


def linear_in_one_slice(x, w, b):
    return F.relu(F.linear(x, w, b)[:, 16:48])


def scaled_addmm(x, w, b):
    return torch.addmm(b, x, w.t(), beta=2.0).relu()


def x_w_b(dtype=torch.float32):
    return randn(16, 64, dtype=dtype), randn(64, 64, seed=1, scale=0.1, dtype=dtype), randn(64, seed=2, dtype=dtype)


# name, fn, inputs, whether its addmm is split
CASES = [
    ("into gelu", linear_gelu, x_w_b(), True),
    ("into a residual add and layer norm", linear_residual, x_w_b(), True),
    ("returned", linear_returned, x_w_b(), False),
    ("read by an extern mm", linear_into_extern, x_w_b(), False),
    ("read by a scan", linear_cumsum, x_w_b(), False),
    ("read in two slices", linear_in_two_slices, x_w_b(), False),
    ("read in one slice", linear_in_one_slice, x_w_b(), True),
    ("beta 2", scaled_addmm, x_w_b(), False),
    ("bf16", linear_gelu, x_w_b(torch.bfloat16), False),
]


def graph_of(fn, inputs):
    return make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("name,fn,inputs,split", CASES, ids=[c[0] for c in CASES])
def test_which_addmm_is_split(name, fn, inputs, split):
    gm = graph_of(fn, inputs)
    assert torch.ops.aten.addmm.default in targets(gm)
    new = bias_epilogue.split_biases(gm, "inference", current())
    assert (new is not gm) == split
    if split:
        assert torch.ops.aten.addmm.default not in targets(new) and torch.ops.aten.mm.default in targets(new)
        assert torch.ops.aten.addmm.default in targets(gm)   # the caller's graph is left as it was
    assert bias_epilogue.split_biases(gm, "forward", current()) is gm
    assert bias_epilogue.split_biases(gm, "inference", current().replace(bias_epilogue=False)) is gm


@pytest.mark.parametrize("name,fn,inputs,split", CASES, ids=[c[0] for c in CASES])
def test_the_answer_holds(name, fn, inputs, split):
    gm = graph_of(fn, inputs)
    compiled = compile_aten(gm, list(inputs), current())
    # the weight is too small to pack: the GEMM is aten's, with the bias or without
    assert ("aten.addmm.default(b_1, x_1" in compiled.source_code) != split
    assert ("aten.mm.default(x_1" in compiled.source_code) == split
    got = compiled(*inputs)
    ref = fn(*[x.double() for x in inputs])
    got = tuple(got) if isinstance(ref, tuple) else got[0] if isinstance(got, (tuple, list)) else got
    tol = 1e-4 if inputs[0].dtype == torch.float32 else 2e-2
    for g, r in zip(got if isinstance(ref, tuple) else [got], ref if isinstance(ref, tuple) else [ref]):
        torch.testing.assert_close(g.double(), r, rtol=tol, atol=tol)
    # a split bias is added inside a kernel that does more: never by a kernel of its own
    assert "cpp_fused_add_0" not in compiled.source_code
