"""Random ops generated in kernels (compiler/lowering_random.py): statistics of the values,
dropout's mask (rate, scaling, the same mask in backward, a new one per call, fused with its
neighbours) and `fallback_random`, which must give eager's stream bit for bit.

Statistical bounds are 6 standard errors of the estimate for N = 1e5 values (a false failure
about once in 5e8 runs), never one generator's exact output."""
import math
import re

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from tdbg.compiler import config as tconfig

N = 100_000
Z = 6.0


def compiled(fn, **cfg):
    """`fn` under backend="tdbg" with `cfg` set while it compiles and runs (a fresh function,
    so no earlier compile of it is reused)."""
    compiled_fn = torch.compile(lambda *a: fn(*a), backend="tdbg")

    def call(*args):
        with tconfig.Config.patch(**cfg):
            return compiled_fn(*args)
    return call


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rand_like_is_uniform_on_unit_interval(dtype):
    u = compiled(torch.rand_like)(torch.empty(N, dtype=dtype))
    assert u.dtype == dtype and u.shape == (N,)
    assert 0 <= u.min().item() and u.max().item() < 1
    mean, var = u.double().mean().item(), u.double().var().item()
    assert abs(mean - 0.5) < Z * math.sqrt(1 / 12 / N)
    # standard error of a sample variance: sqrt((mu4 - sigma^4) / N), mu4 = 1/80 for U(0, 1)
    assert abs(var - 1 / 12) < Z * math.sqrt((1 / 80 - 1 / 144) / N)
    # no two neighbours equal and every decile holds its tenth: elements are not copies
    assert (u[1:] != u[:-1]).all()
    counts = torch.histc(u.double(), bins=10, min=0, max=1)
    assert ((counts - N / 10).abs() < Z * math.sqrt(N * 0.1 * 0.9)).all()


def test_randn_like_is_standard_normal():
    z = compiled(torch.randn_like)(torch.empty(N)).double()
    assert abs(z.mean().item()) < Z / math.sqrt(N)
    assert abs(z.var().item() - 1) < Z * math.sqrt(2 / N)
    tail = (z.abs() > 1.959963984540054).double().mean().item()   # P(|z| > 1.96) = 0.05
    assert abs(tail - 0.05) < Z * math.sqrt(0.05 * 0.95 / N)


def test_rand_with_size_and_uniform_range():
    u = compiled(lambda x: torch.rand(N, 2) * 0 + x.uniform_(-3.0, 5.0)[:, None])(torch.empty(N))
    assert u.shape == (N, 2) and (u[:, 0] == u[:, 1]).all()
    assert -3 <= u.min().item() and u.max().item() < 5
    assert abs(u[:, 0].double().mean().item() - 1.0) < Z * 8 * math.sqrt(1 / 12 / N)


def test_bernoulli_of_probabilities():
    p = torch.linspace(0, 1, 5).repeat(N // 5)
    b = compiled(torch.bernoulli)(p).view(-1, 5)
    assert set(b.unique().tolist()) <= {0.0, 1.0}
    assert (b[:, 0] == 0).all() and (b[:, 4] == 1).all()
    for j, q in enumerate([0.25, 0.5, 0.75], start=1):
        assert abs(b[:, j].double().mean().item() - q) < Z * math.sqrt(q * (1 - q) / (N // 5))


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_mask_rate_and_scaling(p):
    x = torch.rand(N) + 1   # no zeros, so a zero output is a dropped element
    y = compiled(lambda t: F.dropout(t, p, True))(x)
    kept = y != 0
    assert abs(kept.double().mean().item() - (1 - p)) < Z * math.sqrt(p * (1 - p) / N)
    torch.testing.assert_close(y[kept], x[kept] * (1 / (1 - p)), rtol=0, atol=0)


def test_dropout_calls_differ_and_follow_torch_manual_seed():
    fn = compiled(lambda t: F.dropout(t, 0.5, True))
    x = torch.ones(N)
    first, second = fn(x), fn(x)
    # two independent masks of rate 0.5 disagree on half the elements
    assert abs((first != second).double().mean().item() - 0.5) < Z * math.sqrt(0.25 / N)
    torch.manual_seed(1234)
    again = fn(x)
    torch.manual_seed(1234)
    assert torch.equal(fn(x), again)


def test_dropout_backward_uses_the_forward_mask():
    x = (torch.rand(64, 512) + 1).requires_grad_()
    y = compiled(lambda t: F.dropout(t * 3, 0.3, True).exp())(x)
    y.backward(torch.ones_like(y))
    kept = y != 1   # exp(0) where dropped
    assert kept.any() and (~kept).any()
    assert torch.equal(x.grad != 0, kept)
    # d/dx exp(3x / 0.7) = exp(.) * 3 / 0.7 where kept
    torch.testing.assert_close(x.grad[kept], (y * (3 / 0.7))[kept], rtol=1e-6, atol=0)


def test_dropout_fuses_with_its_neighbours():
    from torch.fx.experimental.proxy_tensor import make_fx
    from tdbg.compiler import compile_aten, lowering
    from tdbg.compiler.decompositions import decomposition_table

    def fn(a, b):
        return torch.ops.aten.native_dropout(torch.relu(a + b), 0.2, True)[0] * 2 + b

    a, b = torch.randn(32, 64), torch.randn(32, 64)
    torch.manual_seed(0)
    lowering.reset_counters()
    cfg = tconfig.current()
    gm = make_fx(fn, decomposition_table=decomposition_table(cfg))(a, b)
    graph = compile_aten(gm, [a, b], cfg)
    assert any("native_dropout" in str(n.target) for n in gm.graph.nodes)
    assert len(graph.kernels) == 1 and "tdbg_rand<float>" in graph.source_code
    # no aten call in the wrapper (the kernel's `// FX:` comments do name the op)
    assert not re.search(r"^\s*\w+ = aten\.native_dropout", graph.source_code, re.M)
    out = torch.utils._pytree.tree_leaves(graph(a, b))[0]
    kept = out != b
    torch.testing.assert_close(out[kept], ((a + b).relu() * (2 / 0.8) + b)[kept])


def test_fallback_random_matches_eager_bit_for_bit():
    def fn(t):
        return F.dropout(t.sin(), 0.3, True) + torch.rand_like(t) * torch.randn_like(t)

    x = torch.randn(256, 33)
    torch.manual_seed(7)
    want = fn(x)
    torch.manual_seed(7)
    got = compiled(fn, fallback_random=True)(x)
    assert torch.equal(got, want)


def test_fallback_random_training_step_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.25), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    torch.manual_seed(3)
    model(x).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch.manual_seed(3)
    compiled(model, fallback_random=True)(x).sum().backward()   # the same dropout mask as eager's
    for g, w in zip([p.grad for p in model.parameters()], want):
        torch.testing.assert_close(g, w)


# Random123's known-answer vectors for Philox4x32-10: (counter c0..c3, key k0 k1) -> first two
# output words. tdbg_philox(seed, stream, offset) puts offset in c0/c1, stream in c2/c3, seed in k.
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0), (0xD16CFE09, 0x94FDCCEB)),
]
KAT_SOURCE = '''#include "tdbg_prelude.h"
extern "C" void philox(int64_t seed, int64_t stream, int64_t offset, uint32_t* out) {
  tdbg_philox_out r = tdbg_philox(seed, stream, offset);
  out[0] = r.x0; out[1] = r.x1;
}
extern "C" void uniform(int64_t seed, float* o, long n) {
#pragma omp simd
  for (long i = 0; i < n; ++i) o[i] = tdbg_rand<float>(seed, 3, i);
}
'''


def _signed(hi, lo):
    v = (hi << 32) | lo
    return v - (1 << 64) if v >= 1 << 63 else v


def test_philox_matches_known_answers_and_vectorizes(tmp_path):
    import ctypes
    import subprocess
    from pathlib import Path
    from tdbg.compiler.build import cxx_available
    if not cxx_available():
        pytest.skip("needs a C++ compiler")
    prelude = Path(tconfig.__file__).with_name("cpp_prelude.h")
    (tmp_path / "tdbg_prelude.h").write_text(prelude.read_text())
    src = tmp_path / "kat.cpp"
    src.write_text(KAT_SOURCE)
    cfg = tconfig.current()
    flags = [f for f in cfg.cxx_flags if f != "-w"]
    proc = subprocess.run([cfg.cxx, *flags, "-fopt-info-vec-optimized", f"-I{tmp_path}", str(src),
                           "-o", str(tmp_path / "kat.so")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    loop_line = KAT_SOURCE.splitlines().index(next(l for l in KAT_SOURCE.splitlines() if "for (" in l)) + 1
    assert re.search(rf"kat\.cpp:{loop_line}:\d+: optimized: loop vectorized", proc.stderr), proc.stderr
    lib = ctypes.CDLL(str(tmp_path / "kat.so"))
    lib.philox.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    out = (ctypes.c_uint32 * 2)()
    for (c0, c1, c2, c3), (k0, k1), want in PHILOX_KAT:
        lib.philox(_signed(k1, k0), _signed(c3, c2), _signed(c1, c0), ctypes.addressof(out))
        assert (out[0], out[1]) == want
