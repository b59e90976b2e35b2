"""Eval BatchNorm (`_native_batch_norm_legit_no_training`) is decomposed to pointwise over the
running statistics, so it runs in tdbg's kernels fused with what follows, never as an aten call.
Answers are checked against float64 within the input dtype's tolerance."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table

F = torch.nn.functional
TOL = {torch.float32: 1e-5}


def stats(c, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    mean, var = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.1
    return [t.to(dtype) for t in (mean, var, torch.randn(c, generator=g), torch.randn(c, generator=g))]


def compile_and_check(fn, inputs, dtype):
    lowering.reset_counters()
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    gm.graph.eliminate_dead_code()   # as AOTAutograd does: the unused saved-stats outputs go
    gm.recompile()
    compiled = compile_aten(gm, list(inputs), current())
    got = compiled(*inputs)[0]
    ref = fn(*[x.double() for x in inputs])[0]
    torch.testing.assert_close(got.double(), ref, rtol=TOL[dtype], atol=TOL[dtype])
    assert got.dtype == fn(*inputs)[0].dtype
    return compiled


@pytest.mark.parametrize("dtype", [torch.float32])   # tdbg lowers no reduced-precision floats
@pytest.mark.parametrize("affine", [True, False])
def test_eval_batchnorm_relu_residual_is_one_kernel(dtype, affine):
    def fn(x, res, mean, var, w, b):
        y = F.batch_norm(x, mean, var, w if affine else None, b if affine else None, training=False, eps=1e-3)
        return (F.relu(y) + res,)
    g = torch.Generator().manual_seed(1)
    x, res = (torch.randn(2, 6, 5, 7, generator=g).to(dtype) for _ in range(2))
    compiled = compile_and_check(fn, [x, res, *stats(6, dtype)], dtype)
    assert compiled.fallback_targets == []          # no aten batch_norm call left
    assert len(compiled.kernels) == 1               # BN, relu and the add in one pass
    assert "relu" in compiled.kernels[0] and "add" in compiled.kernels[0]


def test_eval_batchnorm_1d_input():
    def fn(x, mean, var, w, b):
        return (F.batch_norm(x, mean, var, w, b, training=False, eps=1e-5),)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(2))
    compiled = compile_and_check(fn, [x, *stats(3)], torch.float32)
    assert compiled.fallback_targets == []
