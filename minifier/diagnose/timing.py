"""Timings a user or CI compares: warm-up left out, enough samples for a stable median, and a
NOISY verdict when they cannot be trusted. One implementation for `tdbg run --save-io --profile`
(runs/instrument.py), `tdbg profile` (profiling.py), `tdbg diff` (diff.py) and benchmarks/.

    measure(fn)     warm `fn` up until WARMUP_WINDOW calls in a row agree within WARMUP_AGREE
                    (at most WARMUP_MAX_S / WARMUP_MAX_CALLS), then time it until there are
                    MIN_SAMPLES samples and MIN_SECONDS of timing (at most MAX_SECONDS, MAX_SAMPLES);
                    a sample is one call, or several when one call is shorter than SAMPLE_MIN_S
                    (the figure is per call). Returns a `Timing`.
    alternate       several callables timed run by run (a, b, a, b, ...), each run after SETTLE_CALLS
                    untimed calls of its own, so no callable is timed on caches another one warmed.
    CpuWatch        what share of the machine's CPU time other processes took while we timed
                    (/proc/stat minus this process's own CPU time; unknown without /proc/stat).
    noisy_reason    NOISY, and why: the machine was busy (others took >= BUSY_SHARE of it), the
                    samples spread too widely (interquartile range >= NOISY_SPREAD of the median),
                    or there are fewer than FEW_SAMPLES of them.
    compare_times   two timings -> "slower" | "faster" | "same" | "noisy": never slower or faster
                    when either side is NOISY, or when the middle halves of their samples overlap
                    (the difference is within the runs' own spread).

Nothing here prints; `Timing.to_dict()` is what saved folders and JSON documents hold.
"""
from __future__ import annotations

import os
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

WARMUP_WINDOW = 3          # consecutive warm-up calls that must agree
WARMUP_AGREE = 0.25        # ... within this fraction of their smallest
WARMUP_MIN_CALLS = 2       # first calls load code, fault pages in, start thread pools: never timed
WARMUP_MAX_CALLS = 50
WARMUP_MAX_S = 1.0
MIN_SAMPLES = 10
MIN_SECONDS = 0.1
MAX_SECONDS = 2.0
MAX_SAMPLES = 200
SAMPLE_MIN_S = 0.001       # a sample of calls this short batches calls (perf_counter and Python overhead)
FEW_SAMPLES = 5            # fewer samples than this say nothing about a median
NOISY_SPREAD = 0.2         # interquartile range / median at or above this: NOISY
BUSY_SHARE = 0.25          # other processes' share of all CPUs at or above this: NOISY
# Untimed calls before each alternating run. Eager and Inductor read the same weights and tdbg its
# packed copy, so a callable timed right after another starts on caches that favour one of them:
# transformers ELECTRA, 2026-11-27, tdbg/Inductor 1.07 timed after eager and Inductor, 1.02 with
# one settling call per run.
SETTLE_CALLS = 1


# ---------------------------------------------------------------- small helpers

def minor_faults() -> int:
    """Minor page faults of this process so far (first touches of freshly mapped memory)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def median(values: list) -> Optional[float]:
    return statistics.median(values) if values else None


def quartiles(values: list) -> tuple:
    """(first quartile, third quartile) of `values` (both the value itself when there is one)."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (None, None)
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def timed(fn: Callable, *args, **kwargs) -> tuple:
    """(seconds, minor faults, result) of one call."""
    f0, t0 = minor_faults(), time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - t0, minor_faults() - f0, result


def alternate(callables: dict, repeat: int, number=1, settle: int = SETTLE_CALLS) -> dict:
    """Time the callables run by run (a, b, c, a, b, c, ...): name -> per-call seconds and faults.

    Each run makes `number` calls (an int, or a dict name -> int); the recorded figures are per call.
    Before each run, `settle` untimed calls of the same callable: each is timed on the caches its own
    calls leave, never on the ones the callable before it warmed.
    """
    samples = {name: {"seconds": [], "faults": []} for name in callables}
    for _ in range(repeat):
        for name, fn in callables.items():
            for _ in range(settle):
                fn()
            n = number[name] if isinstance(number, dict) else number
            f0, t0 = minor_faults(), time.perf_counter()
            for _ in range(n):
                fn()
            samples[name]["seconds"].append((time.perf_counter() - t0) / n)
            samples[name]["faults"].append((minor_faults() - f0) / n)
    return samples


# ---------------------------------------------------------------- is the machine busy?

def _proc_stat() -> Optional[tuple]:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user/nice]
    total = sum(fields[:8])
    return total - fields[3] - (fields[4] if len(fields) > 4 else 0), total


def _own_ticks() -> float:
    """CPU ticks of this process's threads and its finished children (g++ builds are ours too)."""
    t = os.times()
    return (t.user + t.system + t.children_user + t.children_system) * os.sysconf("SC_CLK_TCK")


class CpuWatch:
    """Other processes' share of the machine's CPU time between `start()` and `share()`.

    On Linux: /proc/stat's busy ticks of all CPUs minus this process's own, over all ticks (idle
    included). Ticks are 10 ms, so a window of fewer than 4 ticks per CPU says nothing, and
    neither does a system without /proc/stat: `share` is None then (only the spread judges)."""

    def __init__(self):
        self.start()

    def start(self) -> "CpuWatch":
        self.stat, self.own = _proc_stat(), _own_ticks()
        return self

    def share(self) -> Optional[float]:
        stat = _proc_stat()
        if stat is None or self.stat is None:
            return None
        busy, total = stat[0] - self.stat[0], stat[1] - self.stat[1]
        if total < 4 * (os.cpu_count() or 1):
            return None
        return max(0.0, min(1.0, (busy - (_own_ticks() - self.own)) / total))


# ---------------------------------------------------------------- one measurement

@dataclass
class Timing:
    """Per-call times of one callable after warm-up, and whether they can be compared."""
    times_s: list                       # per-call seconds, one per sample
    warmup_calls: int = 0
    calls_per_sample: int = 1
    busy_share: Optional[float] = None  # other processes' share of the CPUs while timing
    noisy: Optional[str] = None         # why these timings cannot be compared (None: they can)
    median_s: Optional[float] = field(init=False, default=None)
    min_s: Optional[float] = field(init=False, default=None)
    q1_s: Optional[float] = field(init=False, default=None)
    q3_s: Optional[float] = field(init=False, default=None)

    def __post_init__(self):
        self.median_s = median(self.times_s)
        self.min_s = min(self.times_s) if self.times_s else None
        self.q1_s, self.q3_s = quartiles(self.times_s)
        if self.noisy is None:
            self.noisy = noisy_reason(self.times_s, self.busy_share)

    @property
    def samples(self) -> int:
        return len(self.times_s)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["times_s"] = [round(t, 9) for t in self.times_s]
        d["samples"] = self.samples
        return d


def noisy_reason(times_s: list, busy_share: Optional[float] = None) -> Optional[str]:
    """Why these samples cannot be compared with others, in words; None when they can."""
    if busy_share is not None and busy_share >= BUSY_SHARE:
        return f"the machine was busy: other processes used {busy_share:.0%} of the CPUs while timing"
    if len(times_s) < FEW_SAMPLES:
        return f"only {len(times_s)} sample(s) (at least {FEW_SAMPLES} are needed for a median)"
    mid = median(times_s)
    q1, q3 = quartiles(times_s)
    if mid and (q3 - q1) / mid >= NOISY_SPREAD:
        return f"the samples spread {(q3 - q1) / mid:.0%} of their median (interquartile range)"
    return None


def warm_up(fn: Callable, *, setup: Optional[Callable] = None, max_calls: int = WARMUP_MAX_CALLS,
            max_s: float = WARMUP_MAX_S) -> tuple:
    """Call `fn` until WARMUP_WINDOW calls in a row agree within WARMUP_AGREE (after at least
    WARMUP_MIN_CALLS), or the limits pass: (calls made, seconds of the last call). With `setup`,
    each call is `fn(*setup())`, setup untimed."""
    times: list = []
    start = time.perf_counter()
    while True:
        times.append(_call(fn, setup))
        window = times[-WARMUP_WINDOW:]
        stable = len(times) >= WARMUP_MIN_CALLS + WARMUP_WINDOW - 1 and len(window) == WARMUP_WINDOW \
            and max(window) <= min(window) * (1 + WARMUP_AGREE)
        if stable or len(times) >= max_calls or time.perf_counter() - start >= max_s:
            return len(times), times[-1]


def _call(fn: Callable, setup: Optional[Callable]) -> float:
    args = setup() if setup is not None else ()
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def calls_per_sample(call_s: float) -> int:
    """How many calls one sample makes so that it lasts SAMPLE_MIN_S (at least 1)."""
    return max(1, int(SAMPLE_MIN_S / max(call_s, 1e-9)))


def measure(fn: Callable, *, setup: Optional[Callable] = None, min_samples: int = MIN_SAMPLES,
            min_seconds: float = MIN_SECONDS, max_seconds: float = MAX_SECONDS, max_samples: int = MAX_SAMPLES,
            warmup_max_s: float = WARMUP_MAX_S, watch: Optional[CpuWatch] = None) -> Timing:
    """Warm `fn` up, then time it (see the module docstring). With `setup`, each call is
    `fn(*setup())` with setup untimed, one call per sample (fresh arguments each call); else `fn()`.
    `watch`: a CpuWatch started earlier, when the busy share should cover more than this."""
    watch = watch or CpuWatch()
    warmups, last = warm_up(fn, setup=setup, max_s=warmup_max_s)
    number = 1 if setup is not None else calls_per_sample(last)
    times: list = []
    start = time.perf_counter()
    while True:
        if number == 1:
            times.append(_call(fn, setup))
        else:
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            times.append((time.perf_counter() - t0) / number)
        spent = time.perf_counter() - start
        enough = len(times) >= min_samples and spent >= min_seconds
        if enough or len(times) >= max_samples or (spent >= max_seconds and len(times) >= FEW_SAMPLES):
            break
    return Timing(times, warmup_calls=warmups, calls_per_sample=number, busy_share=watch.share())


def from_saved(record: Optional[dict]) -> Optional[Timing]:
    """A Timing from a saved record ({"times_s", ...}: Timing.to_dict, or an older folder's record
    with times but no warm-up, judged on its samples alone); None when it holds no times."""
    if not record or not record.get("times_s"):
        return None
    return Timing(list(record["times_s"]), warmup_calls=record.get("warmup_calls", 0),
                  calls_per_sample=record.get("calls_per_sample", 1), busy_share=record.get("busy_share"),
                  noisy=record.get("noisy") if "noisy" in record else None)


# ---------------------------------------------------------------- comparing two

def compare_times(a: Timing, b: Timing, ratio: float) -> dict:
    """{"verdict": "slower" | "faster" | "same" | "noisy", "ratio": b/a medians, "why": words}.

    slower/faster needs both sides trusted (not NOISY), medians apart by `ratio`, and the middle
    halves of the samples apart (B's first quartile above A's third, or the reverse)."""
    r = b.median_s / a.median_s if a.median_s else None
    noisy = [f"{side}: {t.noisy}" for side, t in (("A", a), ("B", b)) if t.noisy]
    if noisy:
        return {"verdict": "noisy", "ratio": r, "why": "; ".join(noisy)}
    if r is not None and r >= ratio and b.q1_s > a.q3_s:
        return {"verdict": "slower", "ratio": r, "why": None}
    if r is not None and r <= 1 / ratio and b.q3_s < a.q1_s:
        return {"verdict": "faster", "ratio": r, "why": None}
    within = r is not None and (r >= ratio or r <= 1 / ratio)
    return {"verdict": "same", "ratio": r,
            "why": "the difference is within the runs' spread (their middle halves overlap)" if within else None}
