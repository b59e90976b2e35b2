"""The kernel prelude's float32 math (compiler/cpp_prelude.h) through real tdbg kernels.

Each function of MATH runs in one `torch.compile(backend="tdbg")` graph over a dense float32
sweep (the whole range, subnormals, overflow edges) plus special values. Against torch's float64
result it must stay within the row's ulp bound; against eager float32 within a few ulps; on
SPECIALS it must equal eager exactly (NaN positions and the sign of zeros included). The
prelude's include list is pinned, and every math helper must vectorize under `#pragma omp simd`
with the compiler's own flags.
"""
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import tdbg.compiler
from tdbg.compiler.build import cxx_available
from tdbg.compiler.config import current
from tdbg.compiler.ops import ROWS, HELPER_SPELLINGS

COMPILER_DIR = Path(tdbg.compiler.__file__).parent
PRELUDE = COMPILER_DIR / "cpp_prelude.h"
INF, NAN = float("inf"), float("nan")

# (name, torch function, max ulp vs float64 measured over the sweep, rounded up)
MATH = [
    ("exp", torch.exp, 1.0),
    ("exp2", torch.exp2, 1.0),
    ("expm1", torch.expm1, 1.5),
    ("log", torch.log, 1.0),
    ("log2", torch.log2, 2.0),
    ("log1p", torch.log1p, 1.5),
    ("erf", torch.erf, 1.5),
    ("tanh", torch.tanh, 1.5),
    ("sigmoid", torch.sigmoid, 2.0),
]
SPECIALS = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 8.0, 1024.0, 88.72283, 88.7228394, 89.0,
            -87.3, -103.97, -104.0, -150.0, 128.0, -149.0, 3.4e38, -3.4e38, 1e-45, -1e-45,
            1.17549435e-38, 1e-8, -1e-8, 3.92, -3.92, 4.0, 5.0, -70.7, 10.0, -10.0, 0.625, 0.9,
            -0.9999999]


def sweep() -> torch.Tensor:
    ends = torch.logspace(-45, 38.5, 40001, dtype=torch.float64).float()
    parts = [torch.tensor(SPECIALS), torch.linspace(-12, 12, 120001), torch.linspace(-110, 130, 24001),
             ends, -ends, torch.linspace(-1, 1, 20001) * 1e-6]
    return torch.cat(parts).float()


def ulp(ref: torch.Tensor) -> torch.Tensor:
    """float32 ulp at each float64 value (2^-149 in the subnormal range)."""
    _, e = torch.frexp(ref.abs())
    return torch.ldexp(torch.ones_like(ref), e - 24).clamp_min(2.0 ** -149)


def all_math(x):
    return tuple(fn(x) for _, fn, _ in MATH)


@pytest.fixture(scope="module")
def results():
    torch._dynamo.reset()
    x = sweep()
    compiled = torch.compile(all_math, backend="tdbg", fullgraph=True)
    return x, dict(zip([m[0] for m in MATH], compiled(x)))


@pytest.mark.parametrize("name,fn,max_ulp", MATH, ids=[m[0] for m in MATH])
def test_math_matches_float64_and_eager(results, name, fn, max_ulp):
    x, got_all = results
    got, eager, ref = got_all[name], fn(x), fn(x.double())
    n = len(SPECIALS)
    # IEEE specials (the first five): exactly eager, NaNs and signed zeros included
    g, e, r = got[:n], eager[:n], ref[:n]
    assert torch.equal(g.isnan(), e.isnan()), (name, g, e)
    ieee = torch.arange(n) < 5
    same = e.isnan() | ((g == e) & (torch.signbit(g) == torch.signbit(e)))
    assert same[ieee].all(), (name, g[:5], e[:5])
    # other specials: exact wherever float32 holds the true answer (exp2(8), tanh(10) == 1, a
    # subnormal log1p(x) == x, ...)
    exact = ~ieee & ~r.isnan() & (r.float().double() == r)
    ok = ~exact | ((g == r.float()) & (torch.signbit(g) == torch.signbit(r)))
    assert ok.all(), [(SPECIALS[i], g[i].item(), r[i].item()) for i in range(n) if not ok[i]]
    # everywhere: non-finite exactly where float64 rounds to non-finite
    ref32 = ref.float()
    assert torch.equal(got.isnan(), ref32.isnan()), name
    assert torch.equal(got.isinf(), ref32.isinf()) and torch.equal(got[got.isinf()], ref32[got.isinf()]), name
    fin = torch.isfinite(ref32)
    err = ((got.double() - ref).abs() / ulp(ref))[fin]
    assert err.max().item() <= max_ulp, (name, err.max().item(), x[fin][err.argmax()].item())
    # against eager float32 (itself within ~1 ulp): a few ulps, absolute slack only for subnormals
    tol = 3 * ulp(eager.double()) + 2.0 ** -126
    diff = (got.double() - eager.double()).abs()
    bad = fin & ~(diff <= tol)
    assert not bad.any(), (name, x[bad][:5], got[bad][:5], eager[bad][:5])


# (name, function, scale, bound). tdbg's error against float64 must stay within `bound` units of
# ulp(reference) + ulp(scale): the ulp(reference) part covers the roundings of the formula itself
# (the prelude's exp/erf/tanh are within 2 ulp, each + * / adds half an ulp, a row sum a few), the
# ulp(scale) part what rounding an input or an intermediate does to a result whose own ulp is
# smaller: a pointwise f(x) with |f'| <= 1.13 moves by ulp(x); softmax's p = exp(x - max) / sum
# by p * ulp(x - max); log_softmax = (x - max) - log(sum) by ulp of either term or of 1; LayerNorm's rounded mean reaches every output
# divided by the row's std. Each bound adds up the generated code's roundings at their worst (softmax:
# exp 2 + row sum of float partials 3 + exp errors in the sum 2 + reciprocal 1 + multiply 1 = 9
# half-ulps), so it holds for any vector width and summation order; tdbg measured at most 3.8.
def _input(x, ref):
    return x.abs()


def _softmax_argument(x, ref):
    return ref * (x - x.amax(-1, keepdim=True)).abs()


def _log_softmax_terms(x, ref):
    shifted = x - x.amax(-1, keepdim=True)
    return shifted.abs() + (shifted - ref).abs() + 1   # the sum's relative error is log's absolute one


def _normalized_range(x, ref):
    centered = (x - x.mean(-1, keepdim=True)).abs()
    return (centered.amax(-1, keepdim=True) / x.std(-1, correction=0, keepdim=True)).expand_as(ref)


COMPOSITES = [
    ("gelu", lambda x: F.gelu(x), _input, 4),
    ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), _input, 4),
    ("silu", F.silu, _input, 4),
    ("mish", F.mish, _input, 4),
    ("softplus", F.softplus, _input, 4),
    ("logsigmoid", F.logsigmoid, _input, 4),
    ("softmax", lambda x: torch.softmax(x, -1), _softmax_argument, 10),
    ("log_softmax", lambda x: torch.log_softmax(x, -1), _log_softmax_terms, 8),
    ("layer_norm", lambda x: F.layer_norm(x, (64,)), _normalized_range, 8),
]
# f(nan), f(inf), f(-inf) on the specials row: the IEEE results of each formula (gelu(-inf) is
# -inf * 0 = nan). Not eager's: its vectorized gelu gives nan for +inf on AVX-512 and inf on AVX2.
# The normalizations see a NaN in the row, so their whole first row is NaN.
SPECIAL_RESULTS = {"gelu": (NAN, INF, NAN), "gelu_tanh": (NAN, INF, NAN), "silu": (NAN, INF, NAN),
                   "mish": (NAN, INF, NAN), "softplus": (NAN, INF, 0.0), "logsigmoid": (NAN, 0.0, -INF),
                   "softmax": (NAN,) * 3, "log_softmax": (NAN,) * 3, "layer_norm": (NAN,) * 3}


def composites(x):
    return tuple(fn(x) for _, fn, _, _ in COMPOSITES)


def composite_errors(x, got, specials=True) -> list:
    """[(name, what, evidence)] for every composite outside its bound (see COMPOSITES); with
    `specials`, x[0, :3] holds nan, inf, -inf whose results must be SPECIAL_RESULTS."""
    bad = []
    xd = x.double()
    for (name, fn, scale, bound), g in zip(COMPOSITES, got):
        ref = fn(xd)
        first = g[0, :3].double().nan_to_num(7.0)
        if specials and not torch.equal(first, torch.tensor(SPECIAL_RESULTS[name]).double().nan_to_num(7.0)):
            bad.append((name, "specials", g[0, :3].tolist()))
        if not (torch.equal(g.isnan(), ref.isnan()) and torch.equal(g.isinf(), ref.isinf())
                and torch.equal(g[g.isinf()].double(), ref[g.isinf()])):
            bad.append((name, "non-finite positions", (g.isnan() != ref.isnan()).nonzero()[:4].tolist()))
        fin = ref.isfinite()
        units = ((g.double() - ref).abs() / (ulp(ref) + ulp(scale(xd, ref))))[fin]
        if units.max().item() > bound or units.isnan().any():
            bad.append((name, "units", units.max().item(), xd[fin][units.argmax()].item()))
    return bad


def test_activations_and_normalizations_match_float64():
    """What GELU / SiLU / softmax / LayerNorm users get: float64's answer within a few float32
    roundings, on any x86-64 CPU (eager's own float32 result depends on the CPU's vector width)."""
    torch._dynamo.reset()
    x = torch.randn(512, 64, generator=torch.Generator().manual_seed(0)) * 4
    x[0, :8] = torch.tensor([NAN, INF, -INF, 0.0, -0.0, 100.0, -100.0, 1e-30])
    got = torch.compile(composites, backend="tdbg", fullgraph=True)(x)
    assert composite_errors(x, got) == []


def test_composite_bound_refuses_a_softmax_eight_ulps_off():
    """Correctly rounded results pass; a softmax 32 ulps off (relative 2**-18) fails."""
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1)) * 4
    rounded = [fn(x.double()).float() for _, fn, _, _ in COMPOSITES]
    assert composite_errors(x, rounded, specials=False) == []
    rounded[6] = rounded[6] * (1 + 2.0 ** -18)
    assert [b[:2] for b in composite_errors(x, rounded, specials=False)] == [("softmax", "units")]


# x ** c for a constant c: eager's pow_tensor_scalar formulas (x*x, x*x*x, sqrt, 1/sqrt, 1/x,
# 1/(x*x)), vectorizable. Products and quotients are bit-exact; sqrt-based ones are within 1 ulp
# (tdbg's sqrt is IEEE, eager's vector sqrt is not always correctly rounded); other exponents go
# through powf like eager's std::pow.
POW_EXACT = [2.0, 3.0, -1.0, -2.0]
POW_CLOSE = [0.5, -0.5, 2.5, -1.5]


def powers(x):
    return tuple(torch.pow(x, c) for c in POW_EXACT + POW_CLOSE)


def test_constant_powers_match_eager():
    torch._dynamo.reset()
    x = torch.cat([torch.tensor(SPECIALS), torch.linspace(-50, 50, 20001), torch.logspace(-40, 38, 2001)])
    got = torch.compile(powers, backend="tdbg", fullgraph=True)(x)
    for c, g, e in zip(POW_EXACT + POW_CLOSE, got, powers(x)):
        assert torch.equal(g.isnan(), e.isnan()), c
        special = e.isinf() | (e == 0)
        assert torch.equal(g[special], e[special]) and torch.equal(g[special].signbit(), e[special].signbit()), c
        if c in POW_EXACT:
            same = e.isnan() | (g == e)
            assert same.all(), (c, x[~same][:5], g[~same][:5], e[~same][:5])
        else:
            assert torch.allclose(g, e, rtol=2.4e-7, atol=2.0 ** -126, equal_nan=True), c  # subnormals: eager is coarse


# ---- the prelude stays cheap to parse ----------------------------------------------------------
# A std header may stay in the prelude only while codegen_cpp.py emits the std:: name it declares.
TRANSITIONAL = {"<limits>": "std::numeric_limits", "<bits/stl_algobase.h>": "std::min"}


def prelude_includes():
    return re.findall(r"^\s*#\s*include\s+(\S+)", PRELUDE.read_text(), re.M)


def test_prelude_includes_no_heavy_header():
    codegen = (COMPILER_DIR / "codegen_cpp.py").read_text()
    needed = {h for h, name in TRANSITIONAL.items() if name in codegen}
    assert set(prelude_includes()) == {"<omp.h>"} | needed
    assert len(prelude_includes()) == 1 + len(needed)


def test_op_spellings_use_no_std_names():
    spellings = [HELPER_SPELLINGS[k] for k in HELPER_SPELLINGS]
    for row in ROWS:
        spellings += [row.cpp] if isinstance(row.cpp, str) else list(row.cpp.values())
        spellings += [row.accuracy_bug] if row.accuracy_bug else []
    assert [s for s in spellings if "std::" in s] == []


# ---- vectorization: every branch-free helper inlines into an `omp simd` loop -----------------
UNARY_F32 = ["tdbg_exp", "tdbg_exp2", "tdbg_expm1", "tdbg_log", "tdbg_log2", "tdbg_log1p", "tdbg_erf",
             "tdbg_tanh", "tdbg_sigmoid", "tdbg_sqrt", "tdbg_rsqrt", "tdbg_reciprocal", "tdbg_abs",
             "tdbg_relu", "tdbg_sign", "tdbg_floor", "tdbg_ceil", "tdbg_trunc", "tdbg_round", "tdbg_frac"]
PREDICATES = ["tdbg_isnan", "tdbg_isinf", "tdbg_signbit"]
BINARY_F32 = ["tdbg_maximum", "tdbg_minimum", "tdbg_fmax", "tdbg_fmin", "tdbg_copysign"]


def simd_source():
    lines = ['#include "tdbg_prelude.h"']
    loop = 'extern "C" void k_{n}({sig}, long n) {{\n#pragma omp simd\n  for (long i = 0; i < n; ++i) {body};\n}}'
    for f in UNARY_F32:
        lines.append(loop.format(n=f, sig="const float* a, float* o", body=f"o[i] = {f}(a[i])"))
    for f in PREDICATES:
        lines.append(loop.format(n=f, sig="const float* a, bool* o", body=f"o[i] = {f}(a[i])"))
    for f in BINARY_F32:
        lines.append(loop.format(n=f, sig="const float* a, const float* b, float* o", body=f"o[i] = {f}(a[i], b[i])"))
    for k, c in enumerate(POW_EXACT + POW_CLOSE[:2]):
        lines.append(loop.format(n=f"pow{k}", sig="const float* a, float* o",
                                 body=f"o[i] = tdbg_pow(a[i], static_cast<float>({c}))"))
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(not cxx_available(), reason="needs a C++ compiler")
def test_math_helpers_vectorize(tmp_path):
    (tmp_path / "tdbg_prelude.h").write_text(PRELUDE.read_text())
    src = tmp_path / "simd.cpp"
    src.write_text(simd_source())
    cfg = current()
    flags = [f for f in cfg.cxx_flags if f != "-w"]
    proc = subprocess.run([cfg.cxx, *flags, "-fopt-info-vec-optimized", "-fno-ipa-icf", f"-I{tmp_path}", str(src),
                           "-o", str(tmp_path / "simd.so")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = src.read_text().splitlines()
    vectorized = {text[int(m) - 1] for m in re.findall(r"simd\.cpp:(\d+):\d+: optimized: loop vectorized", proc.stderr)}
    names = [re.search(r"(tdbg_\w+)\(", line).group(1) for line in vectorized]
    assert sorted(set(names)) == sorted(UNARY_F32 + PREDICATES + BINARY_F32 + ["tdbg_pow"])
    assert sum("tdbg_pow" in line for line in vectorized) == len(POW_EXACT) + 2


# ---- cost: what each vectorized loop body is made of ----------------------------------------
# The loop over `o[i] = f(a[i])` at the compiler's flags, read from g++'s assembly: the widest
# loop body (the simdlen(8) one, ymm on AVX2 and AVX-512 alike). Pinned: no float -> int
# conversion (k is read from the bits of k + 1.5 * 2^23, which a NaN may fill with anything), one
# division at most (sigmoid's correction divides by nothing; erf has none), and a body size
# between what these helpers take now (AVX2, g++ 12: exp 29, exp2 28, erf 46, tanh 43, sigmoid
# 39, log 42, log2 42) and what they took with a NaN fix-up, cvttps2dq, two-product scaling and
# nested special-value selects (34, 33, 61, 50, 44, 49, 49).
LOOP_COST = {  # name: (divisions, max instructions in the vector loop body)
    "tdbg_exp": (0, 31), "tdbg_exp2": (0, 31), "tdbg_erf": (0, 53), "tdbg_tanh": (1, 46), "tdbg_sigmoid": (1, 41),
    "tdbg_log": (1, 45), "tdbg_log2": (1, 45)}


def vector_loop_bodies(asm: str) -> dict:
    """{function: instruction lines of its largest loop that uses ymm/zmm registers}."""
    bodies, fn, lines = {}, None, []
    for raw in asm.splitlines():
        line = raw.strip()
        m = re.match(r"^([A-Za-z_]\w*):$", line)
        if m:
            fn, lines = m.group(1), []
            continue
        if fn is None:
            continue
        lines.append(line)
        if line.startswith(".cfi_endproc"):
            labels = {l[:-1]: i for i, l in enumerate(lines) if re.match(r"^\.L\w+:$", l)}
            best = []
            for i, l in enumerate(lines):
                j = re.match(r"^j\w+\s+(\.L\w+)$", l)
                if j and labels.get(j.group(1), i) < i:   # a backward jump closes a loop
                    body = [b for b in lines[labels[j.group(1)] + 1:i + 1] if b and not b.startswith(".")]
                    if any("%ymm" in b or "%zmm" in b for b in body) and len(body) > len(best):
                        best = body
            bodies[fn], fn = best, None
    return bodies


@pytest.mark.skipif(not cxx_available(), reason="needs a C++ compiler")
def test_math_loops_cost(tmp_path):
    (tmp_path / "tdbg_prelude.h").write_text(PRELUDE.read_text())
    src = tmp_path / "cost.cpp"
    loop = 'extern "C" void k_{f}(const float* a, float* o, long n) {{\n#pragma omp simd simdlen(8)\n  for (long i = 0; i < n; ++i) o[i] = {f}(a[i]);\n}}'
    src.write_text('#include "tdbg_prelude.h"\n' + "\n".join(loop.format(f=f) for f in LOOP_COST) + "\n")
    cfg = current()
    flags = [f for f in cfg.cxx_flags if f not in ("-w", "-shared") and not f.startswith("-Wl,")]
    proc = subprocess.run([cfg.cxx, *flags, "-S", f"-I{tmp_path}", str(src), "-o", str(tmp_path / "cost.s")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    bodies = vector_loop_bodies((tmp_path / "cost.s").read_text())
    if not any(bodies.values()):
        pytest.skip("no ymm/zmm loop: not an x86-64 AVX target")
    for f, (divisions, size) in LOOP_COST.items():
        body = bodies[f"k_{f}"]
        ops = [b.split()[0] for b in body]
        assert sum(op.startswith("vdiv") for op in ops) == divisions, (f, ops)
        assert not [op for op in ops if re.match(r"vcvtt?ps2u?[dq]q", op)], (f, ops)   # float -> int
        assert len(body) <= size, (f, len(body), ops)
