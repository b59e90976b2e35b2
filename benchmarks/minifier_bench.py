"""How long tdbg's minifier takes, with every query isolated from the minifier process.

Cases:
  aot11   an 11-node aten graph (2 inputs, 8 ops) compiled by tdbg with an injected C++ compile
          error in `neg` (every query runs the real compiler and g++; fresh compile cache)
  chain40 the 40-op chain with two culprits far apart (neg at op 7, mul at op 31) and a user
          backend that refuses graphs holding both

For each: wall time of the whole minification (including starting the warm worker), number of
queries, mean seconds per query, and the cost of one query in a fresh interpreter (what an
interpreter-per-query minifier pays each time). PyTorch's minifier needs 157 s for an 11-node
graph with isolation.

Run: python benchmarks/minifier_bench.py [--case aot11|chain40|all]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.fx as fx

from tdbg.minifier.artifacts.graph_io import TensorStore, from_graph_module
from tdbg.minifier.artifacts.repro import Dump, write
from tdbg.minifier.reduce.session import minify_dump

BOTH = """
def both(gm, example_inputs):
    targets = {n.target for n in gm.graph.nodes}
    if torch.neg in targets and torch.mul in targets:
        raise RuntimeError("cannot compile neg together with mul")
    return gm
"""
ATEN = torch.ops.aten


def aot11() -> tuple:
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    a = g.call_function(ATEN.sin.default, (x,))
    b = g.call_function(ATEN.mul.Tensor, (a, y))
    c = g.call_function(ATEN.cos.default, (b,))
    d = g.call_function(ATEN.neg.default, (c,))
    e = g.call_function(ATEN.add.Tensor, (d, x))
    f = g.call_function(ATEN.relu.default, (e,))
    h = g.call_function(ATEN.exp.default, (f,))
    i = g.call_function(ATEN.sub.Tensor, (h, y))
    g.output((i,))
    spec = {"after": "aot", "config": {"inject_bug": ["neg", "compile_error"]}, "backend": None}
    return fx.GraphModule(torch.nn.Module(), g), [torch.randn(64, 32), torch.randn(64, 32)], spec


def chain40() -> tuple:
    ops = (torch.sin, torch.cos, torch.relu, torch.tanh, torch.sigmoid)

    def fn(x, y):
        for i in range(40):
            x = torch.neg(x) if i == 7 else torch.mul(x, y) if i == 31 else ops[i % 5](x)
        return x
    spec = {"after": "dynamo", "config": {}, "backend": {"kind": "source", "name": "both", "source": BOTH}}
    return fx.symbolic_trace(fn), [torch.randn(4, 8), torch.randn(4, 8)], spec


CASES = {"aot11": aot11, "chain40": chain40}


def fresh_query_seconds(directory: str) -> float:
    """One query in a new interpreter: import torch and tdbg, load the dump, compile, run."""
    code = ("from tdbg.minifier.artifacts.repro import load; from tdbg.minifier.reduce.oracle import evaluate; "
            f"d = load({directory!r}); evaluate(d.case.gm, d.store.values(d.case.inputs), d.spec)")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def bench(name: str, work: str) -> dict:
    gm, inputs, spec = CASES[name]()
    store = TensorStore()
    case = from_graph_module(gm, inputs, store)
    dump_dir = os.path.join(work, name, "dump")
    write(dump_dir, Dump(case, store, spec, title=name))
    from tdbg.minifier.artifacts.repro import load
    dump = load(dump_dir)
    start = time.perf_counter()
    report = minify_dump(dump, os.path.join(work, name, "out"), timeout=120)
    wall = time.perf_counter() - start
    r = report.result
    queries = r.stats.queries + 3
    return {"case": name, "status": report.status, "nodes": f"{r.original.num_nodes} -> {r.minimized.num_nodes}",
            "wall_s": wall, "queries": queries, "engine_s": r.stats.seconds,
            "per_query_s": r.stats.seconds / max(r.stats.queries, 1), "fresh_query_s": fresh_query_seconds(dump_dir)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    args = parser.parse_args()
    names = list(CASES) if args.case == "all" else [args.case]
    with tempfile.TemporaryDirectory(prefix="tdbg-minbench-") as work:
        os.environ["TDBG_CACHE_DIR"] = os.path.join(work, "cache")  # cold g++ for every new kernel
        rows = [bench(n, work) for n in names]
    print(f"{'case':8} {'status':9} {'nodes':9} {'wall s':>7} {'queries':>7} {'engine s':>8} "
          f"{'s/query':>7} {'fresh-interpreter s/query':>26} {'est. interpreter-per-query s':>29}")
    for r in rows:
        print(f"{r['case']:8} {r['status']:9} {r['nodes']:9} {r['wall_s']:7.1f} {r['queries']:7d} "
              f"{r['engine_s']:8.1f} {r['per_query_s']:7.2f} {r['fresh_query_s']:26.1f} "
              f"{r['fresh_query_s'] * r['queries']:29.0f}")
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; wall includes starting the warm worker)")


if __name__ == "__main__":
    main()
