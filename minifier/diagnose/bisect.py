"""Find where a compiled program goes wrong: first the backend layer, then inside the compiler.

`bisect(script, argv, config, backend=NAME, ...)` runs, each in its own child process with a timeout:
  1. the script uncompiled (the reference: it must succeed, else the script itself is at fault);
  2. the backends chain up to NAME (`chain_for`: eager -> aot_eager -> inductor for tdbg's
     compiler; eager -> torch:aot_eager -> torch:aot_eager_decomp_partition -> torch:inductor
     for the real Inductor; eager -> NAME for any other backend), every compiled graph's first call checked
     against eager (float64 reference, per-dtype tolerances). A backend fails when its run fails
     in any way (error, crash, timeout, accuracy mismatch, or the script failing where the
     reference succeeded). The script's printed values are not compared: timing or random
     prints would make that flaky; the per-graph check compares what the compiler produced.
  3. when inductor (tdbg's compiler) is the first to fail: each compiler subsystem switched off
     in turn (SUBSYSTEMS rows) says which ones the failure depends on; then the counted
     applications (COUNTED rows: lowered ops, accepted fusions) are bisected to the smallest
     count that still fails the same way, and the report lines (Config.report_path) name the FX
     node and kernel of the last application. Finally the culprit forced to aten is confirmed.
  3'. when a layer of torch's own chain is the first to fail (torch:aot_eager_decomp_partition,
     torch:inductor): torch's compiler bisector (torch._inductor.compiler_bisector) drives that
     layer's subsystems (TORCH_SUBSYSTEMS rows) inside warm forked probes (see `torch_probe`):
     each switched off in turn, then the counted ones that fix the failure bisected to the one
     application (e.g. the lowering of one FX node) whose enabling makes the program fail.
     Any other first failing layer (Dynamo, AOTAutograd, a user backend) ends the bisect with a
     verdict naming it and the chain's backends that never ran; a backend that cannot be run
     at all (bad input) ends it with level "unreachable".

Children fork from warm servers (runner.zygote_pool, see forkserver.py), so a probe does not
pay for importing torch. Library code: no printing. `on_step(dict)` is called after each child
run. Every run uses a temporary directory removed before returning; nothing persists between
invocations.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from tdbg.minifier.diagnose.torch_probe import PROBE_ENV, torch_probe  # noqa: F401 - the probe's names
from tdbg.minifier.runs.backends import CHAIN, OWN
from tdbg.minifier.runs.names import backend_label, canonical_backend, frame_label
from tdbg.minifier.runs.runner import RunRequest, read_jsonl, run_script, zygote_pool

# name, Config change that switches the subsystem off, what it is
SUBSYSTEMS = (
    ("decompositions", {"decompose": False}, "tdbg's decompositions in AOTAutograd"),
    ("layout", {"layout_optimization": False}, "channels_last layout planning of convolution graphs"),
    ("prepack", {"pack_weights": False}, "packed weights for inference linears and convolutions (MKL, oneDNN)"),
    ("hoist", {"hoist_weights": False}, "inference work on weights alone run once per weight version"),
    ("bias epilogue", {"bias_epilogue": False}, "inference linears' biases added by the kernels after them"),
    ("linear GELU", {"linear_gelu": False}, "inference linears of many rows with GELU as oneDNN's post-op"),
    ("concat linears", {"concat_linears": False}, "inference linears reading one input run as one GEMM"),
    ("fusion", {"fusion": False}, "fusing nodes into one kernel"),
    ("parallelization", {"parallel": False}, "OpenMP parallel loops"),
    ("vectorization", {"vectorize": False}, "SIMD vectorized loops"),
    ("random", {"fallback_random": True}, "tdbg's own random numbers (fallback_random=True uses aten's)"),
    ("symbolic shapes", {"dynamic": "specialize"},
     "kernels generic in symbolic sizes (dynamic='specialize' compiles one static copy per call signature)"),
)
# name, Config field bounding the count, report-line key, subsystem it belongs to (None: always)
COUNTED = (
    ("lowered op", "max_lowered_ops", "lowered", None),
    ("fusion", "max_fusions", "fusions", "fusion"),
)
# Config fields never shown in a reproduction command (machine-specific or set by bisect itself).
_PRIVATE_FIELDS = ("cache_dir", "report_path")

# The layers of torch's own chain, in the order torch._inductor.compiler_bisector.BACKENDS walks
# them (its `aot_eager_decomp_partition_crossref` is left out: it checks fake tensors against
# real ones, it is not a layer the chosen backend runs).
TORCH_LAYERS = ("aot_eager", "aot_eager_decomp_partition", "inductor")
# backend -> what it adds to the previous row of its chain (shown in the chain table)
LAYER_WORDS = {
    "eager": "Dynamo capture; FX graphs run by PyTorch",
    "aot_eager": "+ AOTAutograd with tdbg's decompositions",
    "inductor": "+ tdbg's compiler (generated C++)",
    "torch:eager": "Dynamo capture; FX graphs run by PyTorch (Dynamo's eager)",
    "torch:aot_eager": "+ AOTAutograd (functionalization, no decompositions)",
    "torch:aot_eager_decomp_partition": "+ Inductor's decompositions and partitioner",
    "torch:inductor": "+ Inductor (lowering, scheduling, code generation)",
}
# torch layer -> its subsystems as torch._inductor.compiler_bisector.BACKENDS lists them:
# (name, kind, what switching it off changes, what it is). kind "counted": applied N times,
# bisectable; "config": one config change; "cuda": exists only on CUDA (nothing to switch off on CPU).
TORCH_SUBSYSTEMS = {
    "aot_eager_decomp_partition": (
        ("aot_eager_decomp_partition_cse", "config", {"cse": False}, "common-subexpression elimination"),
        ("decomposition", "counted", None, "decompositions applied while tracing to aten"),
    ),
    "inductor": (
        ("pre_grad_passes", "counted", None, "passes on the pre-grad (Dynamo) graph"),
        ("joint_graph_passes", "counted", None, "passes on the joint forward+backward graph"),
        ("post_grad_passes", "counted", None, "passes on each forward/backward aten graph"),
        ("inductor_fallback_random", "config", {"fallback_random": True}, "Inductor's own random numbers"),
        ("inductor_emulate_precision_casts", "config", {"emulate_precision_casts": True},
         "low-precision rounding of intermediates as eager does"),
        ("inductor_layout_optimization", "config", {"layout_optimization": False}, "layout (channels-last) choice"),
        ("inductor_comprehensive_padding", "config", {"comprehensive_padding": False}, "stride padding"),
        ("cudagraphs", "cuda", None, "CUDA graph wrapping of compiled graphs"),
        ("lowerings", "counted", None, "aten ops lowered to Inductor IR (off: run by aten as fallback kernels)"),
    ),
}
# the probe backend: resolved in the child as a module:function backend (torch_probe.py)
PROBE_BACKEND = "tdbg.minifier.diagnose.torch_probe:torch_probe"


def chain_for(backend: str) -> tuple:
    """The backends chain ending at `backend`: each row adds one layer to the previous one."""
    if backend in CHAIN:
        return CHAIN[:CHAIN.index(backend) + 1]
    head, _, name = backend.rpartition(":")
    if head == "torch" and name in TORCH_LAYERS:
        return ("eager",) + tuple(f"torch:{n}" for n in TORCH_LAYERS[:TORCH_LAYERS.index(name) + 1])
    if backend == "torch:eager":
        return ("torch:eager",)
    return ("eager", backend)


def layer_words(backend: str) -> str:
    return LAYER_WORDS.get(backend) or ("+ a Dynamo-registered backend" if backend.startswith("torch:")
                                        else "+ the user's backend")


class _Prober:
    """Runs the script in child processes and remembers the runs (for the JSON and the count)."""

    def __init__(self, script: str, argv: list, changes: dict, timeout: float, on_step: Optional[Callable],
                 tmp: str, pool=None):
        self.script, self.argv, self.changes, self.timeout, self.pool = script, argv, changes, timeout, pool
        self.on_step, self.tmp, self.runs = on_step, tmp, []
        self.base: dict = {}     # the reference run's verdict

    def run(self, label: str, backend: Optional[str], changes: Optional[dict] = None,
            env: Optional[dict] = None) -> dict:
        report = os.path.join(self.tmp, f"report-{len(self.runs)}-{time.monotonic_ns()}.jsonl")
        verdict = run_script(RunRequest(script=self.script, argv=self.argv, backend=backend,
                                        check_accuracy=backend is not None,
                                        config_changes={**self.changes, **(changes or {}), "report_path": report},
                                        timeout=self.timeout, capture=True, env=dict(env or {})), pool=self.pool)
        verdict["report"] = read_jsonl(report)
        record = {"label": label, "backend": backend, "changes": changes or {}, "env": env or {},
                  "status": verdict["status"],
                  "stage": verdict.get("stage"), "duration_s": verdict.get("duration_s"),
                  "error": _short(verdict.get("error"))}
        self.runs.append(record)
        if self.on_step:
            self.on_step(record)
        return verdict


def _short(error: Optional[dict]) -> Optional[dict]:
    if not error:
        return None
    return {k: error.get(k) for k in ("stage", "type", "message", "source", "fx_node", "kernel", "graph", "frame")}


def _fails(verdict: dict, stage: Optional[str] = None) -> bool:
    return verdict["status"] != "ok" and (stage is None or verdict.get("stage") == stage)


def bisect(script: str, argv: list, changes: Optional[dict] = None, *, backend: str = "inductor",
           timeout: float = 300.0, jobs: int = 2, on_step: Optional[Callable] = None) -> dict:
    """The bisection result (see module docstring) for the chain ending at `backend`; `changes`
    apply to the config every child builds from its environment (so TDBG_* variables, e.g. an
    injected bug, carry through)."""
    backend = canonical_backend(backend)   # `tdbg` is `inductor`: its chain and its subsystems
    tmp = tempfile.mkdtemp(prefix="tdbg-bisect-")
    start = time.monotonic()
    try:
        with zygote_pool(jobs) as pool:
            prober = _Prober(script, list(argv), dict(changes or {}), timeout, on_step, tmp, pool)
            result = _bisect(prober, jobs, backend)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.update(runs=prober.runs, duration_s=round(time.monotonic() - start, 1))
    return result


def _bisect(prober: _Prober, jobs: int, chosen: str = "inductor") -> dict:
    reference = prober.run("uncompiled", None)
    own = _own_backend(reference) if chosen == OWN else None
    chosen = own["backend"] if own else chosen
    chain = chain_for(chosen) if chosen else ()
    result = {"backend": chosen, "own": own, "replaced": _replaced(reference, chosen) if not own else [],
              "chain": list(chain), "reference": None, "backends": [],
              "first_failing_backend": None, "graph": None, "subsystems": [], "culprits": [], "workaround": None,
              "reproduce": None, "verdict": None, "source": None}
    result["reference"] = _short_run(reference)
    if _fails(reference):
        result["verdict"] = {"level": "script", "stage": reference.get("stage"),
                             "summary": "the script fails without torch.compile; fix the script first"}
        return result
    if reference.get("compile_calls") == 0:
        result["verdict"] = {"level": "bad_input", "stage": "bad_input",
                             "summary": "the script never calls torch.compile; there is nothing to bisect"}
        return result
    if not chosen:
        result["verdict"] = {"level": "bad_input", "stage": "bad_input", "summary": own["problem"]}
        return result
    failing = None
    for backend in chain:
        verdict = prober.run(f"backend {backend_label(backend)}", backend)
        result["backends"].append({"backend": backend, "adds": layer_words(backend), **_short_run(verdict)})
        if not _fails(verdict) and verdict.get("compile_calls") and verdict.get("graphs") == []:
            # a pass over no graph says nothing: the next backends would compile nothing either
            from tdbg.minifier.runs.own_backend import NO_GRAPH_REASON
            result["verdict"] = {"level": "bad_input", "stage": "bad_input", "summary": (
                f"the script's {verdict['compile_calls']} torch.compile call(s) compiled no graph under "
                f"{backend_label(backend)} ({NO_GRAPH_REASON}); there is nothing to bisect")}
            return result
        if _fails(verdict):
            failing = verdict
            result["first_failing_backend"] = backend
            break
    if failing is None:
        result["verdict"] = {"level": "none", "stage": None,
                             "summary": f"every backend of the chain {_chain_words(chain)} matches the uncompiled "
                                        "run: the failure did not happen under bisect"}
        return result
    backend = result["first_failing_backend"]
    prober.base = reference   # its config is every run's config before the probe's changes
    result["reproduce"] = reproduce(prober, backend, {})
    # bad input, or tdbg itself failing (e.g. this torch lacks an internal it needs): no culprit
    # in the user's program can be hunted from that
    if failing.get("stage") in ("bad_input", "internal"):
        result["verdict"] = _unreachable(chain, backend, failing)
    elif backend == "inductor":
        _into_compiler(prober, failing, result, jobs)
    elif backend.startswith("torch:") and backend[6:] in TORCH_SUBSYSTEMS:
        _into_torch(prober, failing, result, jobs)
    else:
        result["verdict"] = _chain_verdict(backend, failing, chain)
    result["source"] = _source(result, failing)
    return result


def _replaced(reference: dict, chosen: str) -> list:
    """What the script's own torch.compile calls asked for that --backend `chosen` replaced."""
    rows = (reference.get("compile_backends") or {}).get("rows") or []
    return sorted({r["asked"] for r in rows if r.get("asked_name") != chosen or r.get("mode") not in (None, "default")
                   or r.get("options")})


def _own_backend(reference: dict) -> dict:
    """The backend `own` stands for, from the uncompiled run's record of each torch.compile call:
    {"backend": the one name every call asked for (or "own" when the one backend asked for has no
    name: the chain is then eager -> own), "asked": the calls' own words, "note": the mode/options
    bisect's named runs leave out, "problem": why no one backend can be bisected}."""
    own = reference.get("compile_backends") or {}
    names, unnamed, rows = own.get("names") or [], own.get("unnamed") or [], own.get("rows") or []
    asked = sorted({r["asked"] for r in rows})
    extras = sorted({r["asked"] for r in rows if r.get("mode") not in (None, "default") or r.get("options")})
    result = {"backend": None, "asked": asked, "note": None, "problem": None}
    if len(names) + len(unnamed) > 1:
        result["problem"] = (f"the script's torch.compile calls ask for several backends ({', '.join(asked)}); "
                             "bisect follows one chain: choose the backend with --backend NAME")
    elif names:
        result["backend"] = names[0]
    elif unnamed:
        result["backend"] = OWN
    if extras and result["backend"] not in (None, OWN):
        result["note"] = (f"the script asks for {', '.join(extras)}; the chain's runs use "
                          f"{backend_label(result['backend'])} with its defaults, and only the script's own run "
                          "(tdbg run) keeps the mode/options")
    return result


def _source(result: dict, failing: dict) -> Optional[str]:
    """The user line of the verdict: the culprit op's own line (its FX node's), else the failing
    run's (for an accuracy failure, the line of the graph output whose value differs)."""
    found = next((c["source"] for c in result["culprits"] if c.get("source")), None)
    return found or (failing.get("error") or {}).get("source")


def _unreachable(chain: tuple, backend: str, failing: dict) -> dict:
    message = _first((failing.get("error") or {}).get("message"))
    later = chain[chain.index(backend) + 1:]
    rest = f"; nothing is known about {_chain_words(later, ', ')}" if later else ""
    return {"level": "unreachable", "stage": failing.get("stage"),
            "summary": f"could not run backend {backend_label(backend)} of the chain ({message}){rest}"}


def _chain_words(chain, sep: str = " -> ") -> str:
    """Backends of a chain as output names them (tdbg's compiler never a bare "inductor")."""
    return sep.join(backend_label(b) for b in chain)


def _first(text) -> str:
    return next((ln.strip() for ln in str(text or "").splitlines() if ln.strip()), "no message")


def _short_run(verdict: dict) -> dict:
    return {"status": verdict["status"], "stage": verdict.get("stage"),
            "script_exit_code": verdict.get("script_exit_code"),
            "error": _short(verdict.get("error")),
            "graphs": len(verdict.get("graphs") or []), "duration_s": verdict.get("duration_s")}


# first failing backend -> (level, what is at fault); {b} is the backend, {prev} the row before it
_CHAIN_BLAME = {
    "eager": ("dynamo", "the eager backend fails: Dynamo (capturing the program) is at fault, not a compiler; "
                        "see `tdbg explain` for graph breaks, or report it to PyTorch"),
    "torch:eager": ("dynamo", "Dynamo's eager backend fails: Dynamo (capturing the program) is at fault, not a "
                              "compiler; see `tdbg explain` for graph breaks, or report it to PyTorch"),
    "aot_eager": ("aot_autograd", "aot_eager fails while eager passes: AOTAutograd with tdbg's decompositions is "
                                  "at fault (tracing to aten, a decomposition, or partitioning)"),
    "torch:aot_eager": ("aot_autograd", "torch:aot_eager fails while eager passes: AOTAutograd (tracing to aten, "
                                        "functionalization) is at fault, before any decomposition or Inductor code"),
}


def _chain_verdict(backend: str, failing: dict, chain: tuple = CHAIN) -> dict:
    stage = failing.get("stage")
    later = chain[chain.index(backend) + 1:]
    if backend in _CHAIN_BLAME:
        level, summary = _CHAIN_BLAME[backend]
        if later:   # the chosen backend was never run: say so rather than let the verdict read as its
            summary += f"; the chain stopped there, so {_chain_words(later, ', ')} did not run"
        return {"level": level, "stage": stage, "summary": summary}
    prev = chain[chain.index(backend) - 1] if chain.index(backend) else None
    where = f" while {backend_label(prev)} passes" if prev else ""
    return {"level": "backend", "stage": stage,
            "summary": f"backend {backend_label(backend)} fails ({stage}){where}: the bug is in that backend or what it calls; "
                       f"tdbg cannot look inside it ({_NEXT_STEP.get(stage, _NEXT_STEP[None])})"}


# failure stage -> what to do next about a backend tdbg cannot look inside
_NEXT_STEP = {
    "script": "every checked call of its graphs matched eager (the first calls and each new input signature), "
              "yet the script failed after them: a later call may differ, and a minifier checks no more calls "
              "than that; check more calls with `tdbg run --check-accuracy --check-calls N`",
    None: "minify the failing graph with `tdbg minify --backend`",
}


def _into_compiler(prober: _Prober, failing: dict, result: dict, jobs: int) -> None:
    stage = failing.get("stage")
    result["graph"] = _failing_graph(failing)
    result["subsystems"] = _subsystems(prober, stage, jobs)
    fixed_by = {row["name"] for row in result["subsystems"] if row["result"] == "passes"}
    for name, knob, key, subsystem in COUNTED:
        if subsystem is not None and subsystem not in fixed_by:
            continue
        culprit = _bisect_count(prober, stage, failing, name, knob, key)
        if culprit:
            result["culprits"].append(culprit)
    lowered = next((c for c in result["culprits"] if c["kind"] == "lowered op"), None)
    if lowered:
        result["reproduce"] = reproduce(prober, "inductor", {lowered["knob"]: lowered["count"]})
        result["workaround"] = _confirm(prober, lowered)
    result["verdict"] = _compiler_verdict(stage, result, fixed_by)


def _failing_graph(failing: dict) -> Optional[dict]:
    err = failing.get("error") or {}
    graphs = failing.get("graphs") or []
    if err.get("graph") is not None and err["graph"] < len(graphs):
        g = graphs[err["graph"]]
        return {"index": g["index"], "frame": g["frame"], "ops": g["ops"], "of": len(graphs)}
    if err.get("graph") is not None:   # a dead child: only its events named the graph
        return {"index": err["graph"], "frame": err.get("frame"), "ops": None, "of": None}
    return None


def _graph_words(graph: Optional[dict]) -> str:
    if not graph:
        return ""
    of = f" of {graph['of']}" if graph["of"] else ""
    return f" in graph {graph['index']}{of} (frame {frame_label(graph['frame'])})"


def _subsystems(prober: _Prober, stage: str, jobs: int) -> list:
    def probe(row):
        name, changes, what = row
        verdict = prober.run(f"without {name}", "inductor", changes)
        if not _fails(verdict):
            outcome = "passes"
        elif _fails(verdict, stage):
            outcome = "still fails"
        else:
            outcome = f"fails differently ({verdict.get('stage')})"
        return {"name": name, "change": changes, "what": what, "result": outcome}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(probe, SUBSYSTEMS))


def _bisect_count(prober: _Prober, stage: str, failing: dict, name: str, knob: str, key: str) -> Optional[dict]:
    """Smallest count N of `knob` that still fails with `stage`; the application N-1 is the culprit."""
    probes: dict = {}

    def fails(n: int) -> bool:
        probes[n] = prober.run(f"{knob}={n}", "inductor", {knob: n})
        return _fails(probes[n], stage)

    total = sum(len(line.get(key) or []) for line in failing.get("report") or [])
    if fails(0):
        return None   # the failure does not depend on these applications at all
    lo, hi = 0, total if total and fails(total) else _grow(fails)
    if hi is None:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fails(mid) else (mid, hi)
    culprit = {"kind": name, "knob": knob, "count": hi, "index": hi - 1, "passes_with": lo}
    culprit.update(_describe_application(probes.get(hi) or failing, key, hi - 1))
    return culprit


def _grow(fails: Callable, limit: int = 1 << 16) -> Optional[int]:
    """Exponential search for a failing count when the report does not give the total."""
    n = 1
    while n <= limit:
        if fails(n):
            return n
        n *= 2
    return None


def _describe_application(verdict: dict, key: str, index: int) -> dict:
    """FX node, target, kernel, graph and the node's own user line (`source`, from its stack
    trace: never the line of the graph output where a wrong value shows) of application `index`,
    from report lines or the error."""
    for line in verdict.get("report") or []:
        for entry in line.get(key) or []:
            if entry.get("index") == index:
                nodes = [n for n in entry.get("nodes") or [entry.get("fx_node")] if n]
                traces = line.get("traces") or {}
                return {"fx_node": ", ".join(nodes), "target": entry.get("target"),
                        "kernel": entry.get("kernel"), "graph": line.get("graph"), "graph_kind": line.get("kind"),
                        "source": next((s for s in (user_line(traces.get(n)) for n in nodes) if s), None)}
    err = verdict.get("error") or {}
    return {"fx_node": err.get("fx_node"), "target": None, "kernel": err.get("kernel"),
            "graph": err.get("graph"), "graph_kind": None, "source": None}


def user_line(trace: Optional[str]) -> Optional[str]:
    """'file:line in fn: code' (file relative to the working folder, as runs print it) of the user
    frame of an FX node's stack trace, or None."""
    from tdbg.minifier.runs.runner import source_of
    return source_of(trace) if trace else None


def _confirm(prober: _Prober, culprit: dict) -> Optional[dict]:
    """Force the culprit's op to aten everywhere: does the whole program pass then?"""
    target = culprit.get("target")
    if not target:
        return None
    op = str(target)
    ops = sorted(set((prober.base.get("config") or {}).get("fallback_ops") or []) | {op})
    verdict = prober.run(f"fallback_ops={op}", "inductor", {"fallback_ops": ops})
    return {"fallback_ops": ops, "passes": not _fails(verdict), "stage": verdict.get("stage"),
            "env": {"TDBG_FALLBACK_OPS": ",".join(ops)}}


def _compiler_verdict(stage: str, result: dict, fixed_by: set) -> dict:
    parts = [f"tdbg's compiler fails ({stage}){_graph_words(result['graph'])}"]
    if fixed_by:
        parts.append("; the failure goes away without " + ", ".join(sorted(fixed_by)))
    for c in result["culprits"]:
        parts.append(f"; culprit {c['kind']} #{c['index']}: FX node {c['fx_node']}"
                     + (f" ({c['target']})" if c.get("target") else "")
                     + (f", kernel {c['kernel']}" if c.get("kernel") else ""))
    if not result["culprits"]:
        parts.append("; no single lowered op or fusion is to blame (the failure persists with none lowered)")
    return {"level": "compiler", "stage": stage, "summary": " ".join(parts).replace(" ;", ";")}


def reproduce(prober: _Prober, backend: str, changes: dict) -> dict:
    """The command and environment that reproduce a verdict: the runs' common config (read from
    the reference run: a crashed child reports none) with `changes`, as TDBG_CONFIG holding only
    the non-default fields."""
    mine = {**(prober.base.get("config") or {}), **prober.changes, **changes}
    default = prober.base.get("default_config") or {}
    diff = {k: v for k, v in mine.items() if v != default.get(k) and k not in _PRIVATE_FIELDS}
    env = {"TDBG_CONFIG": json.dumps(diff, sort_keys=True)} if diff else {}
    argv = ["tdbg", "run", prober.script, "--backend", backend, "--check-accuracy"]
    if prober.argv:
        argv += ["--", *prober.argv]
    return {"env": env, "argv": argv}


# -- torch's own layers (driven by torch._inductor.compiler_bisector) ------------------------------
# counted subsystem -> how one of its applications reads ({0}: the bisector's debug info)
_APPLICATION_WORDS = {
    "lowerings": "the lowering of FX node {0}",
    "decomposition": "the decomposition of {0}",
}


def _into_torch(prober: _Prober, failing: dict, result: dict, jobs: int) -> None:
    """Probe the subsystems of the failing torch layer, then bisect the counted ones that fix it."""
    backend = result["first_failing_backend"]
    layer, stage = backend[len("torch:"):], failing.get("stage")
    result["graph"] = _failing_graph(failing)

    def probe(row):
        name, kind, change, what = row
        entry = {"name": name, "kind": kind, "change": change or {}, "what": what}
        if kind == "cuda":
            return {**entry, "result": "not probed: it exists only for CUDA graphs and this run is on CPU"}
        verdict, out = _torch_probe(prober, layer, name, "disable")
        return {**entry, "result": _probe_outcome(verdict, out, stage)}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        result["subsystems"] = list(pool.map(probe, TORCH_SUBSYSTEMS[layer]))
    for row in result["subsystems"]:
        if row["kind"] == "counted" and row["result"] == "passes":
            result["culprits"].append(_bisect_torch_count(prober, layer, row["name"], stage))
    found = next((c for c in result["culprits"] if c.get("index") is not None), None)
    if found:
        result["reproduce"] = _torch_reproduce(prober, layer, found, stage)
    result["verdict"] = _torch_verdict(result, stage)


def _torch_probe(prober: _Prober, layer: str, subsystem: str, mode: str, at: Optional[int] = None):
    """(verdict, what the probe backend wrote or None) of one run with `subsystem` in `mode`."""
    out = os.path.join(prober.tmp, f"probe-{time.monotonic_ns()}.json")
    spec = {"backend": layer, "subsystem": subsystem, "mode": mode, "at": at, "out": out}
    label = {"disable": f"without {subsystem}", "count": f"count {subsystem}",
             "upto": f"{subsystem} #0..{at}"}[mode]
    verdict = prober.run(label, PROBE_BACKEND, env={PROBE_ENV: json.dumps(spec)})
    try:
        with open(out) as f:
            return verdict, json.load(f)
    except (OSError, ValueError):
        return verdict, None


def _probe_outcome(verdict: dict, out: Optional[dict], stage: str) -> str:
    if verdict.get("stage") in ("internal", "bad_input") or (out is None and verdict.get("stage") != stage):
        return f"could not be probed: {_first((verdict.get('error') or {}).get('message'))}"
    if not _fails(verdict):
        return "passes"
    return "still fails" if _fails(verdict, stage) else f"fails differently ({verdict.get('stage')})"


def _bisect_torch_count(prober: _Prober, layer: str, subsystem: str, stage: str) -> dict:
    """The smallest number N of `subsystem`'s applications (0..N-1 on, the rest off) that still
    fails with `stage`: application N-1 is the culprit, with the bisector's debug info for it."""
    base = {"kind": f"{subsystem} application", "subsystem": subsystem, "index": None}
    verdict, out = _torch_probe(prober, layer, subsystem, "count")
    total = (out or {}).get("count")
    if not _fails(verdict, stage):
        return {**base, "note": f"with every {subsystem} application counted the run no longer fails "
                                f"({verdict.get('stage') or 'passes'}): not bisectable"}
    if not total:
        return {**base, "note": f"the failing run applied no {subsystem} the bisector could count"}
    probes: dict = {}

    def fails(n: int) -> bool:
        probes[n] = _torch_probe(prober, layer, subsystem, "upto", n - 1)
        return _fails(probes[n][0], stage)
    lo, hi = 0, total
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fails(mid) else (mid, hi)
    if hi not in probes and not fails(hi):
        return {**base, "note": f"{subsystem} #0..{hi - 1} passed once and failed once: the failure is flaky"}
    out = probes[hi][1] or {}
    applied = _readable(out.get("debug"))
    target = (out.get("nodes") or {}).get(applied)
    return {**base, "index": hi - 1, "count": hi, "passes_with": lo, "of": total, "applied": applied,
            # a kernel that did not compile is not among the compiled ones: the error names it
            "target": target, "kernels": _kernels_of(target, out.get("kernels") or [])
            or [k for k in [((probes[hi][0].get("error") or {}).get("kernel"))] if k],
            "fx_node": applied if target else None, "source": user_line((out.get("traces") or {}).get(applied))}


def _readable(debug: Optional[str]) -> Optional[str]:
    """The bisector's debug info with ops spelled as in FX graphs: the decomposition subsystem
    records repr(op), <OpOverload(op='aten.add', overload='Tensor')> -> aten.add.Tensor."""
    return None if debug is None else re.sub(r"<OpOverload\(op='([\w.]+)', overload='(\w+)'\)>", r"\1.\2", debug)


def _kernels_of(target: Optional[str], kernels: list) -> list:
    """The failing probe's kernels Inductor named after the culprit's op (aten.amin.default ->
    cpp_fused_amin_0): Inductor names a kernel by the ops fused into it."""
    op = str(target or "").split(".")[1] if str(target or "").count(".") >= 1 else None
    return [k for k in kernels if op and op in k.split("_")]


def _application_words(culprit: dict) -> str:
    words = _APPLICATION_WORDS.get(culprit["subsystem"], culprit["subsystem"] + " {0}")
    text = words.format(culprit.get("applied") or "(not recorded by the bisector)")
    text += f" ({culprit['target']})" if culprit.get("target") else ""
    return text + (f", kernel {', '.join(culprit['kernels'])}" if culprit.get("kernels") else "")


def _torch_reproduce(prober: _Prober, layer: str, culprit: dict, stage: str) -> dict:
    """The plain backend with torch's bisector environment (applications 0..index on) reproduces
    the failure; checked by running exactly that once."""
    env = {"TORCH_BISECT_BACKEND": layer, "TORCH_BISECT_SUBSYSTEM": culprit["subsystem"],
           "TORCH_BISECT_MAX": str(culprit["index"])}
    repro = reproduce(prober, f"torch:{layer}", {})
    verdict = prober.run(f"reproduce {culprit['subsystem']} #0..{culprit['index']}", f"torch:{layer}", env=env)
    checked = "fails the same way" if _fails(verdict, stage) else \
        f"did not reproduce when checked ({verdict.get('stage') or 'passed'})"
    return {"env": {**repro["env"], **env}, "argv": repro["argv"], "checked": checked}


def _torch_verdict(result: dict, stage: str) -> dict:
    chain, backend = result["chain"], result["first_failing_backend"]
    prev = chain[chain.index(backend) - 1]
    parts = [f"{backend_label(backend)} fails ({stage}) where {backend_label(prev)} passes"
             f"{_graph_words(result['graph'])}"]
    fixed = [r["name"] for r in result["subsystems"] if r["result"] == "passes"]
    unprobed = [f"{r['name']} ({r['result']})" for r in result["subsystems"]
                if r["result"].startswith(("not probed", "could not"))]
    if fixed:
        parts.append("; switching off " + ", ".join(fixed) + " makes it pass")
    else:
        parts.append("; no subsystem torch's bisector can switch off makes it pass")
    for c in result["culprits"]:
        if c["index"] is None:
            parts.append(f"; {c['subsystem']}: {c['note']}")
        else:
            parts.append(f"; culprit: {c['subsystem']} #{c['index']} of {c['of']}, {_application_words(c)}")
    if unprobed:
        parts.append("; " + "; ".join(unprobed))
    return {"level": "torch_" + backend[len("torch:"):], "stage": stage, "summary": "".join(parts)}
