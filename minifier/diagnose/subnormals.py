"""Subnormal values: how many a call's ops read, and how much of its time they cost.

A subnormal (denormal) value is a nonzero one smaller in magnitude than its dtype's smallest
normal number (float32 and bfloat16: 1.18e-38, float64: 2.2e-308). x86 CPUs do arithmetic on
them in microcode, 10-100x slower than on normal values, and that holds for eager's ops, for
MKL's and oneDNN's GEMMs and convolutions and for every compiler's kernels alike. Activations of
randomly initialised models often decay into them, and weights trained with weight decay carry
them; the symptom is a model that is slow for every backend and no profiler names the reason.

    census(fn)        runs `fn()` once under a dispatch mode and counts, per aten op, the
                      floating values its tensor arguments hold and how many are subnormal.
                      float16 is not counted: the CPU converts it to float32, where its
                      subnormals are normal numbers. Ops in MOVES only move or alias values
                      (moving a subnormal costs nothing) and are skipped.
    flushed()         context manager: flush-to-zero and denormals-are-zero (FTZ/DAZ) on this
                      thread and every OpenMP thread torch, MKL and oneDNN run on, restored on
                      exit (set_flush(on) without the restore). Inside it subnormal operands
                      and results are 0.
    flush_supported() whether flushed() can work here (x86 and a C++ compiler for its helper).

The helper is one small C++ function built like the compiler's kernels (its cache, its flags):
an OpenMP parallel region sets MXCSR in each thread of the pool. Threads started later inherit
the creating thread's mode, so `torch.set_flush_denormal(True)` before torch starts its threads
(at the top of a script) flushes in every thread; called later it reaches the calling thread only.
"""
from __future__ import annotations

import contextlib
import ctypes
import platform
from dataclasses import dataclass, field
from typing import Callable, Optional

# aten ops (overload packet names) that move, alias or allocate values without arithmetic on them
MOVES = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "permute", "transpose", "t",
    "clone", "copy_", "contiguous", "detach", "alias", "lift_fresh", "select", "slice", "narrow",
    "unsqueeze", "squeeze", "flatten", "unflatten", "as_strided", "unfold", "cat", "stack",
    "split", "split_with_sizes", "chunk", "unbind", "index_select", "embedding", "gather",
    "_to_copy", "to", "empty_like", "zeros_like", "ones_like", "new_empty", "new_zeros",
    "constant_pad_nd", "pixel_shuffle", "pixel_unshuffle", "im2col", "col2im", "roll", "flip",
    "repeat", "expand_as", "view_as", "type_as", "masked_fill", "fill_", "zero_",
})

COUNTED_DTYPES = ("float32", "float64", "bfloat16")

_SOURCE = r'''
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
// FTZ (bit 15) flushes subnormal results to 0, DAZ (bit 6) reads subnormal operands as 0
static const unsigned FLUSH_BITS = 0x8040u;
extern "C" int tdbg_flush_subnormals(int on) {
  int before = (_mm_getcsr() & FLUSH_BITS) == FLUSH_BITS;
  #pragma omp parallel
  {
    unsigned csr = _mm_getcsr();
    _mm_setcsr(on ? (csr | FLUSH_BITS) : (csr & ~FLUSH_BITS));
  }
  return before;
}
#else
extern "C" int tdbg_flush_subnormals(int on) { return -1; }
#endif
'''
_SYMBOL = "tdbg_flush_subnormals"
_helper: dict = {}    # "fn" -> ctypes function, or "error" -> why it cannot be built


@dataclass
class OpCount:
    """One aten op's reads: values its floating tensor arguments held, and how many were subnormal."""
    op: str
    calls: int = 0
    values: int = 0
    subnormal: int = 0


@dataclass
class Census:
    """What one call's ops read (arithmetic ops only, MOVES skipped)."""
    values: int = 0
    subnormal: int = 0
    ops: list = field(default_factory=list)    # OpCount, most subnormal values first

    @property
    def share(self) -> float:
        return self.subnormal / self.values if self.values else 0.0

    def top(self, n: int = 3) -> list:
        return [o for o in self.ops if o.subnormal][:n]

    def to_dict(self) -> dict:
        return {"values": self.values, "subnormal": self.subnormal, "share": self.share,
                "ops": [vars(o) for o in self.ops if o.subnormal]}


# dtype name -> (integer dtype of its width, exponent bits, mantissa bits): tested on the bits, so
# the count is right when this thread already flushes (DAZ compares a subnormal as 0)
_BITS = {"float32": ("int32", 0x7F800000, 0x007FFFFF), "bfloat16": ("int16", 0x7F80, 0x007F),
         "float64": ("int64", 0x7FF0000000000000, 0x000FFFFFFFFFFFFF)}


def count_subnormal(t) -> int:
    """Nonzero values of tensor `t` (a COUNTED_DTYPES dtype) whose exponent bits are all zero."""
    import torch
    as_int, exponent, mantissa = _BITS[str(t.dtype).removeprefix("torch.")]
    bits = t.detach().view(getattr(torch, as_int))
    return int((((bits & exponent) == 0) & ((bits & mantissa) != 0)).sum())


def census(fn: Callable[[], object]) -> Census:
    """Call `fn()` once, counting what each aten op reads (see the module docstring)."""
    import torch

    from tdbg.compiler.torch_compat import TorchDispatchMode, pytree

    counted = tuple(getattr(torch, name) for name in COUNTED_DTYPES)
    per_op: dict = {}

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name not in MOVES:
                tensors = [x for x in pytree.tree_leaves((args, kwargs or {})) if isinstance(x, torch.Tensor)
                           and x.dtype in counted and x.layout == torch.strided and x.device.type != "meta"]
                if tensors:
                    row = per_op.setdefault(name, OpCount(name))
                    row.calls += 1
                    row.values += sum(x.numel() for x in tensors)
                    row.subnormal += sum(count_subnormal(x) for x in tensors)
            return func(*args, **(kwargs or {}))

    with _Count():
        fn()
    ops = sorted(per_op.values(), key=lambda o: (-o.subnormal, -o.values, o.op))
    return Census(sum(o.values for o in ops), sum(o.subnormal for o in ops), ops)


def _build_helper():
    if "fn" in _helper or "error" in _helper:
        return _helper.get("fn")
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        _helper["error"] = f"this CPU ({platform.machine()}) has no x86 flush-to-zero mode"
        return None
    from tdbg.compiler import build, config
    try:
        path = build.build_kernels({_SYMBOL: _SOURCE}, config.current())[_SYMBOL]
        fn = build.load_kernel(path, _SYMBOL)
    except Exception as e:   # no g++, a cache that cannot be written: the cost is then not measured
        _helper["error"] = f"its helper could not be built ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    _helper["fn"] = fn
    return fn


def flush_supported() -> Optional[str]:
    """None when flushed() works here, else why not (one line)."""
    return None if _build_helper() is not None else _helper["error"]


def set_flush(on: bool) -> bool:
    """FTZ/DAZ on (or off) in this thread and every OpenMP thread; whether this thread had it on
    before. Raises RuntimeError where flush_supported() says why not."""
    fn = _build_helper()
    if fn is None:
        raise RuntimeError(f"cannot flush subnormals: {_helper['error']}")
    return bool(fn(int(on)))


@contextlib.contextmanager
def flushed():
    """FTZ/DAZ on in this thread and every OpenMP thread for the body; after it, every thread
    gets this thread's previous mode back."""
    before = set_flush(True)
    try:
        yield
    finally:
        set_flush(before)


def already_flushed() -> bool:
    """Whether this thread already runs with FTZ/DAZ (the user called torch.set_flush_denormal).
    Where it does, every OpenMP thread is left flushing too (what the user asked for)."""
    if _build_helper() is None:
        return False
    before = set_flush(True)
    set_flush(before)
    return before


# ---------------------------------------------------------------- one callable, for `tdbg profile`

FLAG_COST = 0.05      # flag when flushing saves at least this share of eager's or compiled's time
FLAG_SHARE = 0.01     # ... or, where flushing cannot be measured, this share of the values read
COST_SAMPLES = 5


def flush_cost(runs: dict, samples: int = COST_SAMPLES) -> dict:
    """name -> {"as_is_s", "flushed_s", "noisy"}: medians of `samples` timed runs of each callable
    as it is and inside flushed(), all alternating, after one untimed call each."""
    from .timing import alternate, calls_per_sample, median, noisy_reason, timed

    def inside(fn):
        def run():
            with flushed():
                fn()
        return run

    variants = {(name, flush): (inside(fn) if flush else fn) for name, fn in runs.items() for flush in (False, True)}
    number = {key: calls_per_sample(timed(fn)[0]) for key, fn in variants.items()}
    times = alternate(variants, samples, number)
    out = {}
    for name in runs:
        as_is, flush = times[(name, False)]["seconds"], times[(name, True)]["seconds"]
        noisy = noisy_reason(as_is) or noisy_reason(flush)
        out[name] = {"as_is_s": median(as_is), "flushed_s": median(flush), "noisy": noisy}
    return out


def examine(eager: Callable, compiled: Optional[Callable]) -> dict:
    """Census of one eager call and, when it read subnormal values, what flushing them saves for
    eager and compiled (`flush_cost`). What `tdbg profile` records per callable:
    {"census": Census.to_dict() | None when the count failed, "already_flushed": bool, "cost": {"eager": ..., "compiled": ...} | None,
    "not_measured": why the cost was not measured | None}."""
    try:
        found = census(eager)
    except Exception as e:   # an op a Python dispatch mode cannot run: no census, no verdict
        return {"census": None, "already_flushed": False, "cost": None,
                "not_measured": f"the count failed ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"}
    out = {"census": found.to_dict(), "already_flushed": False, "cost": None, "not_measured": None}
    if not found.subnormal:
        return out
    out["not_measured"] = flush_supported()
    if out["not_measured"] is None and already_flushed():
        out["already_flushed"] = True
        out["not_measured"] = "this thread already flushes subnormals (torch.set_flush_denormal(True))"
    if out["not_measured"] is None:
        out["cost"] = flush_cost({"eager": eager, **({"compiled": compiled} if compiled else {})})
    return out


def saved_share(cost: dict) -> float:
    """The largest share of a run's time that flushing saved."""
    return max((1 - c["flushed_s"] / c["as_is_s"] for c in cost.values() if c["as_is_s"]), default=0.0)


def flag_message(label: str, found: dict) -> Optional[str]:
    """The `subnormals` lost-speed line for one callable's `examine` result; None when flushing
    saves under FLAG_COST of the time (or, unmeasured, under FLAG_SHARE of the values are subnormal)."""
    c, cost = found["census"], found["cost"]
    if not c or not c["subnormal"] or found["already_flushed"]:
        return None
    if (saved_share(cost) < FLAG_COST) if cost is not None else (c["share"] < FLAG_SHARE):
        return None
    ops = ", ".join(f"{o['op']} {o['subnormal']:,}" for o in c["ops"][:3])
    text = (f"{label}: {c['share']:.1%} of the values its ops read are subnormal (nonzero, below the smallest "
            f"normal number, 1.2e-38 in float32; "
            f"most in {ops}); CPUs do arithmetic on them in microcode, for eager and every backend alike")
    if cost is None:
        return f"{text} (the cost was not measured: {found['not_measured']}){_ADVICE}"
    times = "; ".join(f"{name} {v['as_is_s'] * 1e3:.3f} ms, {v['flushed_s'] * 1e3:.3f} ms with them flushed to zero"
                      + (f" (noisy: {v['noisy']})" if v["noisy"] else "") for name, v in cost.items())
    return f"{text}: {times}{_ADVICE}"


_ADVICE = ("; torch.set_flush_denormal(True) at the top of the script, before torch starts its threads, "
           "flushes them in every thread (it changes values below 1.2e-38 to 0)")
