"""Accuracy of a compiled result against eager, judged with a float64 reference.

A result passes when it is close to eager within the dtype's tolerance, or when its error
against the float64 reference is no worse than `multiplier` times eager's own error (eager is
not exact either: this is what keeps fused, reordered float math from false alarms). The
reference excuses only elements where eager itself is within REFERENCE_TRUST of it (times the
dtype's tolerance): where they are further apart, float64 computed something else than eager's
semantics (a low-precision scalar eager rounds first, a comparison on the other side of a
boundary: PyTorch #185517), so it cannot say the compiled value is right.
Non-float outputs compare exactly unless `ignore_non_fp`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

# dtype -> (rtol, atol)
TOLERANCES = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
    torch.float32: (1.3e-6 * 10, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
FP64_MULTIPLIER = 2.0
REFERENCE_TRUST = 4.0    # eager within this many dtype tolerances of float64: the reference can judge there


@dataclass(frozen=True)
class Mismatch:
    """One output that failed: where, how far off, and the evidence."""
    output: str            # path into the outputs, e.g. "out[0]"
    dtype: str
    shape: tuple
    max_abs_error: float
    eager_error: Optional[float]  # eager vs float64 reference, when known
    message: str

    def to_dict(self) -> dict:
        return dict(self.__dict__, shape=list(self.shape))


def flatten(outputs: Any, prefix: str = "out") -> list:
    """[(path, value)] for tensors and scalars inside nested tuples/lists/dicts."""
    if isinstance(outputs, (list, tuple)):
        return [p for i, o in enumerate(outputs) for p in flatten(o, f"{prefix}[{i}]")]
    if isinstance(outputs, dict):
        return [p for k, o in outputs.items() for p in flatten(o, f"{prefix}[{k!r}]")]
    return [(prefix, outputs)]


def to_fp64(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64)
    if isinstance(value, (list, tuple)):
        return type(value)(to_fp64(v) for v in value)
    if isinstance(value, dict):
        return {k: to_fp64(v) for k, v in value.items()}
    return value


def fp64_reference(fn: Callable, inputs: list) -> Optional[Any]:
    """Run `fn` (a function or nn.Module/GraphModule) in float64; None when that is impossible."""
    try:
        if isinstance(fn, torch.nn.Module):
            fn = copy.deepcopy(fn).to(torch.float64)
        with torch.no_grad():
            return fn(*to_fp64(list(inputs)))
    except Exception:
        return None


def compare(expected: Any, actual: Any, reference: Optional[Any] = None, *,
            tolerance: Optional[float] = None, ignore_non_fp: bool = False,
            names: Optional[list] = None) -> list:
    """Mismatches of `actual` against `expected` (eager), using `reference` (float64) if given.

    `tolerance` overrides both rtol and atol for every float dtype. `names`, one per flattened
    value, replace the paths ("out[0]") in the mismatches (e.g. "grad of x").
    """
    exp, act = flatten(expected), flatten(actual)
    if names is not None and len(names) == len(exp):
        exp = [(name, e) for name, (_, e) in zip(names, exp)]
    if len(exp) != len(act):
        return [Mismatch("out", "", (), float("inf"), None,
                         f"expected {len(exp)} outputs, got {len(act)}")]
    refs = flatten(reference) if reference is not None else [(p, None) for p, _ in exp]
    if len(refs) != len(exp):
        refs = [(p, None) for p, _ in exp]
    found = []
    for (path, e), (_, a), (_, r) in zip(exp, act, refs):
        m = _compare_one(path, e, a, r, tolerance, ignore_non_fp)
        if m is not None:
            found.append(m)
    return found


def _compare_one(path, e, a, r, tolerance, ignore_non_fp) -> Optional[Mismatch]:
    if not isinstance(e, torch.Tensor):
        if isinstance(a, torch.Tensor) or e == a or ignore_non_fp:
            return None
        return Mismatch(path, type(e).__name__, (), float("nan"), None, f"expected {e!r}, got {a!r}")
    if not isinstance(a, torch.Tensor):
        return Mismatch(path, str(e.dtype), tuple(e.shape), float("inf"), None, f"expected a tensor, got {type(a).__name__}")
    if e.shape != a.shape or e.dtype != a.dtype:
        return Mismatch(path, str(e.dtype), tuple(e.shape), float("inf"), None,
                        f"expected {tuple(e.shape)} {e.dtype}, got {tuple(a.shape)} {a.dtype}")
    e, a = e.detach(), a.detach()
    if not e.is_floating_point():
        if ignore_non_fp or torch.equal(e, a):
            return None
        bad = (e != a).nonzero()
        first = tuple(bad[0].tolist()) if len(bad) else ()
        return Mismatch(path, str(e.dtype), tuple(e.shape), float((e.double() - a.double()).abs().max()), None,
                        f"{len(bad)} of {e.numel()} elements differ; first at {first}: expected {e[first].item()}, got {a[first].item()}")
    rtol, atol = TOLERANCES.get(e.dtype, (1e-5, 1e-5)) if tolerance is None else (tolerance, tolerance)
    if e.numel() == 0 or torch.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
        return None
    err = abs_diff(a.double(), e.double())
    max_err = float(err.max())
    eager_err = None
    if isinstance(r, torch.Tensor) and r.shape == e.shape:
        r64 = r.detach().double()
        eager_err = _finite_max(abs_diff(e.double(), r64), e.double(), r64)
        if reference_excuses(e, a, r64, rtol, atol):
            return None
    idx = tuple(int(i) for i in torch.unravel_index(err.argmax(), e.shape)) if e.dim() else ()
    return Mismatch(path, str(e.dtype), tuple(e.shape), max_err, eager_err,
                    f"max abs error {max_err:.6g} at {idx}: expected {e[idx].item():.6g}, got {a[idx].item():.6g}"
                    f" (rtol={rtol:g}, atol={atol:g})" + _outside(e, a, err, idx, rtol, atol))


def abs_diff(x64, y64):
    """|x - y| per element of two float64 tensors: 0 where they are equal (equal infinities too)
    or both NaN, inf where one alone is NaN (inf - inf gave NaN: an overflow eager and the
    compiled value share read as the largest error)."""
    d = torch.sub(x64, y64).abs_()
    d = d.masked_fill_((x64 == y64) | (x64.isnan() & y64.isnan()), 0.0)
    return d.nan_to_num_(nan=float("inf"), posinf=float("inf"))


def _finite_max(d, e64, r64) -> float:
    """max of `d` where eager and the reference are both finite (0.0 where none is)."""
    kept = d[e64.isfinite() & r64.isfinite()]
    return float(kept.max()) if kept.numel() else 0.0


def reference_excuses(e, a, r64, rtol: float, atol: float, dtype=None) -> bool:
    """Whether the float64 reference `r64` excuses `a`'s differences from eager `e`: where eager
    and the reference are finite, `a`'s error against the reference is at most FP64_MULTIPLIER
    times eager's (plus atol), with the same NaNs, and reference_judges trusts it; where either
    is not finite (eager overflowed to inf: its error is infinite and excused anything, so fp16
    outputs with one overflow passed whatever the rest held), `a` must be close to eager."""
    e64, a64 = e.double(), a.double()
    finite = e64.isfinite() & r64.isfinite()
    if not bool(torch.isclose(a64[~finite], e64[~finite], rtol=rtol, atol=atol, equal_nan=True).all()):
        return False
    eager_err = _finite_max(abs_diff(e64, r64), e64, r64)
    res_err = _finite_max(abs_diff(a64, r64), e64, r64)
    return (torch.equal(a.isnan(), r64.isnan()) and res_err <= FP64_MULTIPLIER * eager_err + atol
            and reference_judges(e, a, r64, rtol, atol, dtype))


def reference_judges(e, a, r64, rtol: float, atol: float, dtype=None) -> bool:
    """Whether the float64 reference may excuse every element where `a` is not close to eager:
    at each of them eager must be within REFERENCE_TRUST of the reference, in the tolerance of
    `dtype` (default: eager's own; not an override: a tolerance of 0 must not make every reference
    untrustworthy)."""
    d_rtol, d_atol = TOLERANCES.get(dtype or e.dtype, (1e-5, 1e-5))
    e64 = e.double()
    unclose = ~torch.isclose(a.double(), e64, rtol=rtol, atol=atol, equal_nan=True)
    trusted = (e64 - r64).abs() <= REFERENCE_TRUST * (d_atol + d_rtol * r64.abs())
    trusted |= (e64 == r64) | (e64.isnan() & r64.isnan())    # equal infinities and NaNs agree
    return not bool((unclose & ~trusted).any())


def _outside(e, a, err, idx: tuple, rtol: float, atol: float) -> str:
    """When the largest absolute error is within tolerance (a large value), the elements that are
    not, and the worst of them relative to its tolerance: '161.913 vs 161.913' alone named no
    failure (a BertModel gradient failed on a near-zero element)."""
    allowed = atol + rtol * e.double().abs()
    over = (err > allowed) & ~(e.isnan() & a.isnan())
    if not bool(over.any()) or bool(over[idx] if idx else over):
        return ""
    worst = (err - allowed).masked_fill(~over, float("-inf"))
    w = tuple(int(i) for i in torch.unravel_index(worst.argmax(), e.shape)) if e.dim() else ()
    return (f"; within tolerance there; outside it: {int(over.sum())} element(s), worst at {w}: expected "
            f"{e[w].item():.6g}, got {a[w].item():.6g} (|error| {float(err[w]):.3g} > {float(allowed[w]):.3g} allowed)")
