"""Find where a compiled program goes wrong: first the backend, then inside tdbg's compiler.

`bisect(script, argv, config, ...)` runs, each in its own child process with a timeout:
  1. the script uncompiled (the reference: it must succeed, else the script itself is at fault);
  2. the backends chain eager -> aot_eager -> inductor, every compiled graph's first call checked
     against eager (float64 reference, per-dtype tolerances). A backend fails when its run fails
     in any way (error, crash, timeout, accuracy mismatch, or the script failing where the
     reference succeeded). The script's printed values are not compared: timing or random
     prints would make that flaky; the per-graph check compares what the compiler produced.
  3. when inductor (tdbg's compiler) is the first to fail: each compiler subsystem switched off
     in turn (SUBSYSTEMS rows) says which ones the failure depends on; then the counted
     applications (COUNTED rows: lowered ops, accepted fusions) are bisected to the smallest
     count that still fails the same way, and the report lines (Config.report_path) name the FX
     node and kernel of the last application. Finally the culprit forced to aten is confirmed.

Children fork from warm servers (runner.zygote_pool, see forkserver.py), so a probe does not
pay for importing torch. Library code: no printing. `on_step(dict)` is called after each child
run. Every run uses a temporary directory removed before returning; nothing persists between
invocations.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from tdbg.minifier.runs.backends import CHAIN
from tdbg.minifier.runs.runner import RunRequest, read_jsonl, run_script, zygote_pool

# name, Config change that switches the subsystem off, what it is
SUBSYSTEMS = (
    ("decompositions", {"decompose": False}, "tdbg's decompositions in AOTAutograd"),
    ("fusion", {"fusion": False}, "fusing nodes into one kernel"),
    ("parallelization", {"parallel": False}, "OpenMP parallel loops"),
    ("vectorization", {"vectorize": False}, "SIMD vectorized loops"),
    ("random", {"fallback_random": True}, "tdbg's own random numbers (fallback_random=True uses aten's)"),
)
# name, Config field bounding the count, report-line key, subsystem it belongs to (None: always)
COUNTED = (
    ("lowered op", "max_lowered_ops", "lowered", None),
    ("fusion", "max_fusions", "fusions", "fusion"),
)
# Config fields never shown in a reproduction command (machine-specific or set by bisect itself).
_PRIVATE_FIELDS = ("cache_dir", "report_path")


class _Prober:
    """Runs the script in child processes and remembers the runs (for the JSON and the count)."""

    def __init__(self, script: str, argv: list, changes: dict, timeout: float, on_step: Optional[Callable],
                 tmp: str, pool=None):
        self.script, self.argv, self.changes, self.timeout, self.pool = script, argv, changes, timeout, pool
        self.on_step, self.tmp, self.runs = on_step, tmp, []
        self.base: dict = {}     # the reference run's verdict

    def run(self, label: str, backend: Optional[str], changes: Optional[dict] = None) -> dict:
        report = os.path.join(self.tmp, f"report-{len(self.runs)}-{time.monotonic_ns()}.jsonl")
        verdict = run_script(RunRequest(script=self.script, argv=self.argv, backend=backend,
                                        check_accuracy=backend is not None,
                                        config_changes={**self.changes, **(changes or {}), "report_path": report},
                                        timeout=self.timeout, capture=True), pool=self.pool)
        verdict["report"] = read_jsonl(report)
        record = {"label": label, "backend": backend, "changes": changes or {}, "status": verdict["status"],
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


def bisect(script: str, argv: list, changes: Optional[dict] = None, *, timeout: float = 300.0, jobs: int = 2,
           on_step: Optional[Callable] = None) -> dict:
    """The bisection result (see module docstring); `changes` apply to the config every child
    builds from its environment (so TDBG_* variables, e.g. an injected bug, carry through)."""
    tmp = tempfile.mkdtemp(prefix="tdbg-bisect-")
    start = time.monotonic()
    try:
        with zygote_pool(jobs) as pool:
            prober = _Prober(script, list(argv), dict(changes or {}), timeout, on_step, tmp, pool)
            result = _bisect(prober, jobs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.update(runs=prober.runs, duration_s=round(time.monotonic() - start, 1))
    return result


def _bisect(prober: _Prober, jobs: int) -> dict:
    result = {"reference": None, "backends": [], "first_failing_backend": None, "graph": None,
              "subsystems": [], "culprits": [], "workaround": None, "reproduce": None, "verdict": None}
    reference = prober.run("uncompiled", None)
    result["reference"] = _short_run(reference)
    if _fails(reference):
        result["verdict"] = {"level": "script", "stage": reference.get("stage"),
                             "summary": "the script fails without torch.compile; fix the script first"}
        return result
    if reference.get("compile_calls") == 0:
        result["verdict"] = {"level": "bad_input", "stage": "bad_input",
                             "summary": "the script never calls torch.compile; there is nothing to bisect"}
        return result
    failing = None
    for backend in CHAIN:
        verdict = prober.run(f"backend {backend}", backend)
        result["backends"].append({"backend": backend, **_short_run(verdict)})
        if _fails(verdict):
            failing = verdict
            result["first_failing_backend"] = backend
            break
    if failing is None:
        result["verdict"] = {"level": "none", "stage": None,
                             "summary": "every backend matches the uncompiled run; nothing to bisect"}
        return result
    backend = result["first_failing_backend"]
    prober.base = reference   # its config is every run's config before the probe's changes
    result["reproduce"] = reproduce(prober, backend, {})
    if backend != "inductor":
        result["verdict"] = _chain_verdict(backend, failing)
        return result
    _into_compiler(prober, failing, result, jobs)
    return result


def _short_run(verdict: dict) -> dict:
    return {"status": verdict["status"], "stage": verdict.get("stage"), "exit_code": verdict.get("exit_code"),
            "error": _short(verdict.get("error")),
            "graphs": len(verdict.get("graphs") or []), "duration_s": verdict.get("duration_s")}


def _chain_verdict(backend: str, failing: dict) -> dict:
    stage = failing.get("stage")
    if backend == "eager":
        return {"level": "dynamo", "stage": stage,
                "summary": "the eager backend fails: Dynamo (capturing the program) is at fault, not a compiler; "
                           "see `tdbg explain` for graph breaks, or report it to PyTorch"}
    return {"level": "aot_autograd", "stage": stage,
            "summary": "aot_eager fails while eager passes: AOTAutograd with tdbg's decompositions is at fault "
                       "(tracing to aten, a decomposition, or partitioning)"}


def _into_compiler(prober: _Prober, failing: dict, result: dict, jobs: int) -> None:
    stage = failing.get("stage")
    err = failing.get("error") or {}
    graphs = failing.get("graphs") or []
    if err.get("graph") is not None and err["graph"] < len(graphs):
        g = graphs[err["graph"]]
        result["graph"] = {"index": g["index"], "frame": g["frame"], "ops": g["ops"], "of": len(graphs)}
    elif err.get("graph") is not None:   # a dead child: only its events named the graph
        result["graph"] = {"index": err["graph"], "frame": err.get("frame"), "ops": None, "of": None}
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
    """FX node, target, kernel and graph of application `index`, from report lines or the error."""
    for line in verdict.get("report") or []:
        for entry in line.get(key) or []:
            if entry.get("index") == index:
                nodes = entry.get("nodes") or [entry.get("fx_node")]
                return {"fx_node": ", ".join(n for n in nodes if n), "target": entry.get("target"),
                        "kernel": entry.get("kernel"), "graph": line.get("graph"), "graph_kind": line.get("kind")}
    err = verdict.get("error") or {}
    return {"fx_node": err.get("fx_node"), "target": None, "kernel": err.get("kernel"),
            "graph": err.get("graph"), "graph_kind": None}


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
    parts = [f"tdbg's compiler fails ({stage})"]
    if result["graph"]:
        g = result["graph"]
        of = f" of {g['of']}" if g["of"] else ""
        parts.append(f"in graph {g['index']}{of} (frame {g['frame']})")
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
