"""How long `compare_graph` (tdbg compare's library call) takes on a ~500-node aten graph.

    python benchmarks/compare_bench.py [--nodes 500] [--size 128] [--repeat 2] [--profile]

Builds a forward aten graph of about --nodes compared nodes (a residual block of pointwise ops,
a row reduction and a matmul, repeated) with tdbg's own backend, then times compare_graph with
tdbg's compiler twice: cold (an empty compile cache) and warm (the same cache). Prints the phases
(eager + float64 reference, compiling the original and the realized graph, running them, the
per-node error computation) as compare_graph measures them. --profile prints a cProfile of the
warm run. The graph is built without the injected bug; pass TDBG_INJECT_BUG=neg:accuracy to time
a diverging graph (the local re-checks of diverging nodes then run too).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time


def block(x, w):
    import torch
    h = torch.tanh(x @ w) * 0.5 + x
    h = h - h.mean(dim=-1, keepdim=True)
    h = torch.neg(h) * torch.sigmoid(h) + 0.1 * x
    return torch.relu(h) + torch.exp(-h * h)


def build(nodes: int, size: int):
    """(aten gm, real inputs) of a forward graph with about `nodes` call_function nodes."""
    import torch

    from tdbg.compiler import compile_aten, make_backend
    captured = {}

    def inner(gm, inputs, cfg, *, graph_name, kind):
        compiled = compile_aten(gm, inputs, cfg, graph_name=graph_name, kind=kind)

        def run(*args):
            captured.setdefault("graph", (gm, [a.detach().clone() for a in args]))
            return compiled(*args)
        return run

    per_block = 17    # aten nodes one block lowers to (measured; the count is printed)
    blocks = max(1, nodes // per_block)

    def model(x, w):
        for _ in range(blocks):
            x = block(x, w)
        return x
    torch.manual_seed(0)
    x, w = torch.randn(size, size), torch.randn(size, size) / size ** 0.5
    with torch.no_grad():
        torch.compile(model, backend=make_backend(inner_compile=inner))(x, w)
    return captured["graph"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--repeat", type=int, default=2, help="warm runs (the best is reported)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch and kernel threads (1: on a shared, loaded machine OpenMP threads waiting for "
                        "each other turn milliseconds into seconds)")
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    import torch

    from tdbg.compiler import config as tconfig
    from tdbg.minifier.diagnose.divergence import compare_graph
    torch.set_num_threads(args.threads)
    t = time.perf_counter()
    gm, inputs = build(args.nodes, args.size)
    n = sum(1 for node in gm.graph.nodes if node.op == "call_function")
    print(f"graph: {n} call_function nodes, inputs {[tuple(i.shape) for i in inputs]} "
          f"(built in {time.perf_counter() - t:.1f} s)")
    cache = tempfile.mkdtemp(prefix="tdbg-compare-bench-")
    try:
        cfg = tconfig.current().replace(cache_dir=cache)
        for label in ["cold"] + ["warm"] * args.repeat:
            if label == "warm" and args.profile:
                import cProfile
                import pstats
                prof = cProfile.Profile()
                prof.enable()
            t = time.perf_counter()
            r = compare_graph(gm, inputs, "inductor", kind="forward", config=cfg)
            total = time.perf_counter() - t
            if label == "warm" and args.profile:
                prof.disable()
                pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
            phases = ", ".join(f"{k} {v:.2f}" for k, v in r.seconds.items() if k != "total")
            print(f"{label}: {total:.2f} s end to end ({len(r.nodes)} nodes compared, verdict {r.verdict}); {phases}")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
