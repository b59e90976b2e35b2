"""bf16 / fp16 graphs are lowered (no aten fallback) and round as eager does.

The rule (docs/compiler.md "bf16 and fp16"): a kernel loads a bf16/fp16 element as float,
computes in float (reductions accumulate in float), and rounds to nearest even where the graph
gives a value the dtype: each op's result (the lowering computes an op in its opmath type,
float32, and converts to the op's result dtype, as eager's CPU kernels do), a cast, and every
store. So tdbg rounds at the same points as eager even inside a fused kernel, and differs from
eager only where its float32 math (its exp/tanh/erf polynomials, its summation order) lands on
the other side of a rounding boundary:

  * single ops (softmax, layer_norm, sum, mean, amax, var_mean, a cast): every stored value is within ONE
    ulp of the dtype of eager's value; amax, signbit and casts are bit-exact (NaN, inf, -0, ties, overflow).
  * the fused chain add/gelu/mul/tanh/exp: within one ulp of eager per stored value (one flipped
    rounding of an intermediate u moves exp(tanh(u)) by |u| sech^2(u) <= 0.45 of its relative
    ulp), and so never more than one ulp further from the float64 reference than eager is.
  * a float-accumulated reduction of n elements is within 1 ulp + n * 2^-24 * sum|x| of the
    float64 sum (float32 accumulation bound); 4096 ones sum to exactly 4096 (a bf16 accumulator
    would stall at 256).
"""
import math

import pytest
import torch
import torch.nn.functional as F

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table
from torch.fx.experimental.proxy_tensor import make_fx

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# float32 values whose rounding is an edge: ties to even, overflow to inf, NaN, signed zero,
# subnormals of each dtype, and the largest finite value
EDGES = {
    torch.bfloat16: [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, 3.3961e38, 3.4e38, float("inf"),
                     float("nan"), -0.0, 1e-40, -9.2e-41, 3.3895e38, -1.0],
    torch.float16: [1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504.0, 65519.99, 65520.0, 1e6, float("nan"),
                    float("-inf"), -0.0, 2 ** -25, 2 ** -25 + 2 ** -40, 3 * 2 ** -25, 6.1e-5, -1.0],
}


def graph(x, y, w, b, big, f32):
    """Every case of this file in one graph (one compile per dtype keeps the test cheap)."""
    return {
        "chain": torch.tanh(F.gelu(x + y) * y).exp(),
        "softmax": torch.softmax(x, -1),
        "layer_norm": F.layer_norm(x, (x.shape[-1],), w, b),
        "sum": x.sum(-1), "mean": x.mean(-1), "amax": x.amax(-1),
        "cast": f32.to(x.dtype).to(torch.float32),
        "big_sum": big.sum(), "big_mean": big.mean(),
        # regressions: var_mean rounded its shifted sum to the dtype before dividing (0.12 off in
        # bf16); signbit of a bf16 load crashed g++ 12 (an ICE vectorizing __builtin_signbit)
        "var": torch.var_mean(x * 4, -1)[0], "var_mean": torch.var_mean(x * 4)[1],
        "signbit": torch.signbit(f32.to(x.dtype)),
    }


def ulp(v: torch.Tensor, dtype) -> torch.Tensor:
    """The dtype's ulp at |v| (float64; subnormal spacing below the smallest normal)."""
    info = torch.finfo(dtype)
    mag = v.double().abs().clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * info.eps


def inputs(dtype):
    g = torch.Generator().manual_seed(23)
    x, y = (torch.randn(37, 100, generator=g).to(dtype) for _ in range(2))
    w, b = (torch.randn(100, generator=g).to(dtype) for _ in range(2))
    big = (torch.rand(4096, generator=g) + 0.5).to(dtype)
    f32 = torch.cat([torch.tensor(EDGES[dtype]), torch.randn(50, generator=g) * 100])
    return x, y, w, b, big, f32


@pytest.fixture(scope="module", params=list(DTYPES))
def case(request):
    dtype = DTYPES[request.param]
    args = inputs(dtype)
    lowering.reset_counters()
    gm = make_fx(graph, decomposition_table=decomposition_table(current()))(*args)
    compiled = compile_aten(gm, list(args), current().replace(num_threads=2))
    return dtype, args, gm, compiled, compiled(*args), graph(*args)


def test_every_node_is_lowered(case):
    dtype, _, gm, compiled, _, _ = case
    assert compiled.fallback_targets == []
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"aten.exp.default", "aten.tanh.default", "aten.sum.dim_IntList", "aten.amax.default",
            "aten._to_copy.default", "aten.var_mean.correction", "aten.mean.dim"} <= targets
    load, store = ("tdbg_bf16_to_float", "tdbg_float_to_bf16") if dtype == torch.bfloat16 else \
        ("tdbg_f16_to_float", "tdbg_float_to_f16")
    assert f"{load}(" in compiled.source_code and f"{store}(" in compiled.source_code
    assert "const uint16_t* in_ptr0" in compiled.source_code


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "sum", "mean", "amax", "var", "var_mean"])
def test_single_ops_within_one_ulp_of_eager(case, name):
    dtype, _, _, _, got, want = case
    g, w = got[name], want[name]
    assert g.dtype == w.dtype == dtype and g.shape == w.shape
    err = (g.double() - w.double()).abs()
    assert (err <= ulp(w, dtype)).all(), f"{name}: {(err / ulp(w, dtype)).max().item()} ulps"


def test_amax_and_casts_are_exact(case):
    dtype, args, _, _, got, want = case
    assert torch.equal(got["amax"], want["amax"])
    assert torch.equal(got["signbit"], want["signbit"])
    c, e = got["cast"], want["cast"]
    assert torch.equal(c.isnan(), e.isnan())
    assert torch.equal(c[~c.isnan()], e[~e.isnan()])
    # signs of zeros and infinities too
    assert torch.equal(torch.signbit(c[~c.isnan()]), torch.signbit(e[~e.isnan()]))
    # the NaN bits eager's vectorized conversion writes (bf16 0xFFFF; fp16 the quiet NaN, sign kept)
    assert torch.equal(args[5].to(dtype).view(torch.int16), compile_cast(args[5], dtype).view(torch.int16))


def test_fused_chain_rounds_where_eager_does(case):
    dtype, (x, y, *_), _, compiled, got, want = case
    g, e = got["chain"].double(), want["chain"].double()
    assert ((g - e).abs() <= ulp(e, dtype)).all()
    x64, y64 = x.double(), y.double()
    ref = torch.tanh(F.gelu(x64 + y64) * y64).exp()
    assert ((g - ref).abs() <= (e - ref).abs() + ulp(e, dtype)).all()
    # the chain is in one fused kernel: its roundings happen in registers, not through memory
    # (with the softmax over the same converted x: scheduler._into_reduction)
    [kernel] = [k for k, nodes in compiled.kernel_nodes.items() if "tanh" in nodes]
    assert {"add", "erf", "mul_1", "tanh", "exp"} <= set(compiled.kernel_nodes[kernel])


def test_reductions_accumulate_in_float(case):
    dtype, args, _, _, got, _ = case
    big = args[4].double()
    n, bound = big.numel(), big.abs().sum().item() * big.numel() * 2.0 ** -24
    ref = big.sum().item()
    assert abs(got["big_sum"].item() - ref) <= ulp(torch.tensor(ref), dtype).item() + bound
    assert abs(got["big_mean"].item() - ref / n) <= ulp(torch.tensor(ref / n), dtype).item() + bound / n


def compile_cast(f32, dtype):
    fn = lambda t: t.to(dtype)
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(f32)
    compiled = compile_aten(gm, [f32], current())
    assert compiled.fallback_targets == []
    return torch.utils._pytree.tree_leaves(compiled(f32))[0]


def test_sum_of_4096_ones_is_exact():
    """A bf16 accumulator would stop at 256 (256 + 1 rounds back to 256); float reaches 4096."""
    ones = torch.ones(4096, dtype=torch.bfloat16)
    gm = make_fx(lambda t: t.sum(), decomposition_table=decomposition_table(current()))(ones)
    compiled = compile_aten(gm, [ones], current())
    assert compiled.fallback_targets == []
    assert torch.utils._pytree.tree_leaves(compiled(ones))[0].item() == 4096.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_conversions_are_bit_exact_over_every_value_and_its_float_neighbours(dtype):
    """Widening every one of the 65536 bit patterns, and narrowing each one's float value and its
    neighbours +-3 float ulps (every rounding boundary and tie, subnormals, overflow, NaN payloads),
    gives torch's bits. fp16's conversions are integer-mask selects since g++ 12 left _Float16
    conversions scalar (a GELU 7x slower); this pins their bits."""
    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype).contiguous()
    wide = every.float()
    got = compile_cast(every, torch.float32)
    assert torch.equal(got.view(torch.int32)[~wide.isnan()], wide.view(torch.int32)[~wide.isnan()])
    assert bool(got[wide.isnan()].isnan().all())
    near = torch.cat([wide.view(torch.int32) + d for d in range(-3, 4)]).view(torch.float32).contiguous()
    narrow, expected = compile_cast(near, dtype), near.to(dtype)
    nan = expected.isnan()
    assert torch.equal(narrow.view(torch.int16)[~nan], expected.view(torch.int16)[~nan])
    assert bool(narrow[nan].isnan().all())
