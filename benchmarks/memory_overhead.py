"""What `tdbg memory`'s measurement costs per call.

    python benchmarks/memory_overhead.py [--size 512] [--layers 4] [--repeat 20] [--backend inductor] [--threads N]

Compiles an MLP (--layers Linear+GELU pairs of width --size, batch --size) with --backend, then
times, per call (medians over --repeat rounds after a warm-up, the three run in turn):

  plain      the compiled call alone
  tracked    the compiled call inside `memory.track` (torch.profiler with the CPU allocator's
             memory events: what every measured call pays)
  measured   what `tdbg memory` does for one measured call: the eager graph and the compiled one,
             each tracked (the MemoryRecorder's call), against `plain`

Only a graph's first --calls calls (default 3) are measured; later calls cost nothing extra.
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--backend", default="inductor")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    a = p.parse_args()
    import torch
    if a.threads:
        torch.set_num_threads(a.threads)

    from tdbg.minifier.diagnose.memory import track
    from tdbg.minifier.runs.backends import resolve
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.size, a.size), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(a.size, a.size)
    compiled = torch.compile(model, backend=resolve(a.backend).compiler_fn)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
            track(lambda: compiled(x))
        plain, tracked, measured = _alternating([
            lambda: compiled(x), lambda: track(lambda: compiled(x)),
            lambda: (track(lambda: model(x)), track(lambda: compiled(x)))], a.repeat)
    print(f"{a.layers} x (Linear({a.size}) + GELU), batch {a.size}, backend {a.backend}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"plain call      {plain * 1e3:8.3f} ms")
    print(f"tracked call    {tracked * 1e3:8.3f} ms  (+{(tracked - plain) * 1e3:.3f} ms, {tracked / plain:.2f}x)")
    print(f"measured call   {measured * 1e3:8.3f} ms  (eager + compiled, both tracked: {measured / plain:.2f}x plain)")


def _alternating(fns: list, repeat: int) -> list:
    """Median seconds of each callable, run in turn (a, b, c, a, b, c, ...): a busy machine's
    slow moments fall on all of them alike."""
    times: list = [[] for _ in fns]
    for _ in range(repeat):
        for fn, out in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


if __name__ == "__main__":
    main()
