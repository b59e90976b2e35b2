"""How long tdbg's minifier takes next to PyTorch's, on the same failing programs.

Command cases (`tdbg minify SCRIPT` vs PyTorch's `TORCHDYNAMO_REPRO_AFTER=... TORCHDYNAMO_REPRO_LEVEL=...`
run of the script, then `minifier_launcher.py minify`, isolated as by default or `--no-isolate` for
pytorch-inproc; all from cold compile caches):
  compile_small  a 7-op graph whose relu fails to compile (tdbg: TDBG_INJECT_BUG=relu:compile_error
                 on tdbg's compiler; PyTorch: Inductor's inject_relu_bug_TESTING_ONLY=compile_error)
  amin_dynamo    the real Inductor uint8 amin bug (tests/scenarios/scripts/amin_uint8.py), after
  amin_aot       dynamo / after aot, level 4, backend torch:inductor (PyTorch: --strict-accuracy)
  bert_relu      12 BERT layers (transformers config, >= 500 aten nodes after AOT) and one relu on
                 the pooled output that is wrong (relu:accuracy / inject_relu_bug=accuracy), level 4
For each: wall and CPU seconds (children's user+sys, which the machine's load changes less than
the wall), exit status, and for tdbg the queries, cache hits and seconds per query from --json.

Engine cases (the library alone, one warm worker, no capture run):
  aot11   an 11-node aten graph (2 inputs, 8 ops) compiled by tdbg with an injected C++ compile
          error in `neg` (every query runs the real compiler and g++; fresh compile cache)
  chain40 the 40-op chain with two culprits far apart (neg at op 7, mul at op 31) and a user
          backend that refuses graphs holding both

For each: wall time of the whole minification (including starting the warm worker), number of
queries, mean seconds per query, and the cost of one query in a fresh interpreter (what an
interpreter-per-query minifier pays each time). PyTorch's minifier needs 157 s for an 11-node
graph with isolation.

Run: python benchmarks/minifier_bench.py [--case NAME ...] [--tool tdbg pytorch pytorch-inproc | all]
     [--cap SECONDS] [--json PATH]      (default: every case, tdbg and pytorch)
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

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


ENGINE_CASES = {"aot11": aot11, "chain40": chain40}


def fresh_query_seconds(directory: str) -> float:
    """One query in a new interpreter: import torch and tdbg, load the dump, compile, run."""
    code = ("from tdbg.minifier.artifacts.repro import load; from tdbg.minifier.reduce.oracle import evaluate; "
            f"d = load({directory!r}); evaluate(d.case.gm, d.store.values(d.case.inputs), d.spec)")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def bench(name: str, work: str) -> dict:
    gm, inputs, spec = ENGINE_CASES[name]()
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
    queries = r.stats.queries + 2   # + signature, reproduce (the minimized graph is checked by running repro.py)
    return {"case": name, "status": report.status, "nodes": f"{r.original.num_nodes} -> {r.minimized.num_nodes}",
            "wall_s": wall, "queries": queries, "engine_s": r.stats.seconds,
            "per_query_s": r.stats.seconds / max(r.stats.queries, 1), "fresh_query_s": fresh_query_seconds(dump_dir)}


# ---------------------------------------------------------------- command cases

SCENARIOS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "scenarios", "scripts")
INDUCTOR_BUG = """import os
import torch
if os.environ.get("BENCH_INDUCTOR_BUG"):   # PyTorch's own bug injection, for its minifier
    import torch._inductor.config
    torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = os.environ["BENCH_INDUCTOR_BUG"]
"""
SMALL = INDUCTOR_BUG + """

def f(x, y):
    a = torch.sin(x) * y
    b = torch.relu(a + 1)
    return torch.cos(b).sum(1), (b * 2).exp()


torch.manual_seed(0)
print(torch.compile(f)(torch.randn(8, 16), torch.randn(8, 16))[0].sum().item())
"""
BERT = INDUCTOR_BUG + """from transformers import BertConfig, BertModel

torch.manual_seed(0)
config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=12, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=16, hidden_act="gelu")
model = BertModel(config).eval()


def f(ids):
    return torch.relu(model(ids).pooler_output)   # the one relu of the graph


ids = torch.randint(0, 64, (2, 8))
with torch.no_grad():
    print(torch.compile(f)(ids).sum().item())
"""


@dataclass
class Command:
    """One failing program: how each minifier is pointed at it."""
    script: str                 # a file under SCENARIOS, or the source of a script to write
    tdbg_args: tuple
    tdbg_env: dict
    after: str                  # PyTorch's TORCHDYNAMO_REPRO_AFTER
    level: int
    pytorch_env: dict
    pytorch_flags: tuple = ()


COMMAND_CASES = {
    # tdbg's compiler named: every command now runs the script's own backend (Inductor here) by default
    "compile_small": Command(SMALL, ("--backend", "inductor", "--after", "aot", "--level", "2"),
                             {"TDBG_INJECT_BUG": "relu:compile_error"},
                             "aot", 2, {"BENCH_INDUCTOR_BUG": "compile_error"}),
    "amin_dynamo": Command("amin_uint8.py", ("--backend", "torch:inductor", "--after", "dynamo", "--level", "4"), {},
                           "dynamo", 4, {}),
    "amin_aot": Command("amin_uint8.py", ("--backend", "torch:inductor", "--after", "aot", "--level", "4"), {},
                        "aot", 4, {}, ("--strict-accuracy",)),
    "bert_relu": Command(BERT, ("--backend", "inductor", "--after", "aot", "--level", "4"),
                         {"TDBG_INJECT_BUG": "relu:accuracy"},
                         "aot", 4, {"BENCH_INDUCTOR_BUG": "accuracy"}, ("--strict-accuracy",)),
}


def script_path(case: Command, name: str, work: str) -> str:
    if "\n" not in case.script:
        return os.path.abspath(os.path.join(SCENARIOS, case.script))
    path = os.path.join(work, f"{name}.py")
    with open(path, "w") as f:
        f.write(case.script)
    return path


def timed(argv: list, env: dict, cwd: str, cap: float) -> dict:
    """Run argv; wall and children's CPU seconds, exit code (None past `cap` seconds), output tail."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True,
                              timeout=cap, start_new_session=True)
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired as e:
        code, tail = None, f"stopped after {cap:g} s: {str(e.stderr or '')[-500:]}"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu, "code": code, "load": load, "tail": tail}


def fresh_caches(work: str, tag: str) -> dict:
    return {"TDBG_CACHE_DIR": os.path.join(work, f"tdbg-cache-{tag}"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(work, f"inductor-cache-{tag}"),
            "TORCHINDUCTOR_FX_GRAPH_CACHE": "0", "TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}


def run_tdbg(name: str, case: Command, work: str, cap: float) -> dict:
    folder = os.path.join(work, f"tdbg-{name}")
    os.makedirs(folder)
    out, report = os.path.join(folder, "out"), os.path.join(folder, "report.json")
    argv = [sys.executable, "-m", "tdbg.cli.main", "minify", script_path(case, name, work), *case.tdbg_args,
            "--out", out, "--json", report]
    row = timed(argv, {**fresh_caches(work, f"t-{name}"), **case.tdbg_env}, folder, cap)
    try:
        with open(report) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = {}
    stats = doc.get("stats") or {}
    row.update(tool="tdbg", case=name, status=doc.get("status") or f"exit {row['code']}",
               nodes=_nodes(doc), queries=stats.get("queries"), cache_hits=stats.get("cache_hits"),
               per_query_s=stats["seconds"] / max(stats["queries"], 1) if stats else None)
    return row


def _nodes(doc: dict) -> str:
    if "original" not in doc:
        return "-"
    return f"{doc['original']['nodes']} -> {doc['minimized']['nodes']}"


def run_pytorch(name: str, case: Command, work: str, cap: float, isolate: bool = True) -> dict:
    tool = "pytorch" if isolate else "pytorch-inproc"
    folder = os.path.join(work, f"{tool}-{name}")
    os.makedirs(folder)
    env = {**fresh_caches(work, f"p-{name}"), **case.pytorch_env, "TORCHDYNAMO_REPRO_AFTER": case.after,
           "TORCHDYNAMO_REPRO_LEVEL": str(case.level), "TORCH_COMPILE_DEBUG_DIR": folder}
    dump = timed([sys.executable, script_path(case, name, work)], env, folder, cap)
    launchers = glob.glob(os.path.join(folder, "**", "minifier_launcher.py"), recursive=True)
    row = {"tool": tool, "case": name, "queries": None, "cache_hits": None, "per_query_s": None,
           "nodes": "-", "load": dump["load"]}
    if not launchers:
        return {**row, **{k: dump[k] for k in ("wall_s", "cpu_s", "code", "tail")}, "status": "no dump"}
    env = {k: v for k, v in env.items() if not k.startswith("TORCHDYNAMO_REPRO")}
    left = max(cap - dump["wall_s"], 1.0)
    flags = (*case.pytorch_flags, *(() if isolate else ("--no-isolate",)))
    minify = timed([sys.executable, launchers[0], "minify", *flags], env, folder, left)
    repro = [p for p in glob.glob(os.path.join(folder, "**", "repro.py"), recursive=True)]
    status = ("stopped at cap" if minify["code"] is None else
              "minified" if minify["code"] == 0 and repro else f"exit {minify['code']}")
    # PyTorch's minifier writes checkpoints/<nodes>.py as it shrinks
    sizes = [int(os.path.basename(p)[:-3]) for p in glob.glob(os.path.join(folder, "**", "checkpoints", "*.py"),
                                                               recursive=True) if os.path.basename(p)[:-3].isdigit()]
    if sizes:
        row["nodes"] = f"{max(sizes)} -> {min(sizes)}"
    return {**row, "wall_s": dump["wall_s"] + minify["wall_s"], "cpu_s": dump["cpu_s"] + minify["cpu_s"],
            "code": minify["code"], "tail": minify["tail"], "status": status,
            "dump_s": dump["wall_s"]}


# pytorch: the launcher's default, one fresh interpreter per query; pytorch-inproc: --no-isolate
RUNNERS = {"tdbg": run_tdbg, "pytorch": run_pytorch,
           "pytorch-inproc": lambda name, case, work, cap: run_pytorch(name, case, work, cap, isolate=False)}


def command_table(rows: list) -> str:
    lines = [f"{'case':14} {'tool':14} {'status':16} {'nodes':10} {'wall s':>7} {'cpu s':>6} {'queries':>7} "
             f"{'cached':>6} {'s/query':>7} {'load':>5} {'tdbg wall / this':>16}"]
    walls = {(r["case"], r["tool"]): r["wall_s"] for r in rows}
    for r in rows:
        ratio = ""
        if r["tool"] != "tdbg" and (r["case"], "tdbg") in walls:
            ratio = f"{walls[(r['case'], 'tdbg')] / r['wall_s']:.2f}x"
        q = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
        lines.append(f"{r['case']:14} {r['tool']:14} {r['status'][:16]:16} {r['nodes']:10} {r['wall_s']:7.1f} "
                     f"{r['cpu_s']:6.1f} {q(r['queries'], 'd'):>7} {q(r['cache_hits'], 'd'):>6} "
                     f"{q(r['per_query_s'], '.2f'):>7} {r['load']:5.1f} {ratio:>16}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs="+", choices=[*COMMAND_CASES, *ENGINE_CASES, "all"], default=["all"])
    parser.add_argument("--tool", nargs="+", choices=[*RUNNERS, "all"], default=["tdbg", "pytorch"])
    parser.add_argument("--cap", type=float, default=1800.0, help="seconds one minifier may take on one case")
    parser.add_argument("--json", metavar="PATH", help="also write the rows (with output tails) as JSON")
    args = parser.parse_args()
    names = [*COMMAND_CASES, *ENGINE_CASES] if "all" in args.case else args.case
    tools = list(RUNNERS) if "all" in args.tool else args.tool
    work = tempfile.mkdtemp(prefix="tdbg-minbench-")
    try:
        rows = [RUNNERS[t](n, COMMAND_CASES[n], work, args.cap) for n in names if n in COMMAND_CASES for t in tools]
        if rows:
            print(command_table(rows))
        engine = [n for n in names if n in ENGINE_CASES]
        if engine:
            os.environ["TDBG_CACHE_DIR"] = os.path.join(work, "cache")  # cold g++ for every new kernel
            print(engine_table([bench(n, work) for n in engine]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"(load average {os.getloadavg()[0]:.1f} now, {os.cpu_count()} cores; load column: at each run's start)")


def engine_table(rows: list) -> str:
    lines = [f"{'case':8} {'status':9} {'nodes':9} {'wall s':>7} {'queries':>7} {'engine s':>8} "
             f"{'s/query':>7} {'fresh-interpreter s/query':>26} {'est. interpreter-per-query s':>29}"]
    for r in rows:
        lines.append(f"{r['case']:8} {r['status']:9} {r['nodes']:9} {r['wall_s']:7.1f} {r['queries']:7d} "
                     f"{r['engine_s']:8.1f} {r['per_query_s']:7.2f} {r['fresh_query_s']:26.1f} "
                     f"{r['fresh_query_s'] * r['queries']:29.0f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
