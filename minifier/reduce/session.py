"""One minification run: fix the failure signature, check it reproduces, shrink, write files.

`minify_dump(dump, out_dir, ...)` is what `tdbg minify` calls. Every query (also the two
initial runs) is logged as one JSON line in `<out_dir>/minify.jsonl`. Events go to `on_event`;
nothing is printed here. Success is claimed only after the written repro.py, run as its reader
runs it (a fresh interpreter, from another folder), gives the reproduced failure's exit code;
otherwise the status is `repro_failed`, with what the file did (`Report.repro_run`).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from tdbg.minifier.reduce import engine
from tdbg.minifier.artifacts.graph_io import Case, case_source, dynamic_table
from tdbg.minifier.reduce.oracle import Outcome, Signature
from tdbg.minifier.artifacts.repro import LAUNCHER, REPRO, Dump, FreshInterpreter, UserRun, warm_modules, write
from tdbg.minifier.reduce.workers import Pool

LOG_NAME = "minify.jsonl"


def with_dynamic(spec: dict, case: Case) -> dict:
    """The spec a query of `case` compiles by: its inputs' symbolic sizes in spec["dynamic"]."""
    table = dynamic_table(case.inputs)
    return dict(spec, dynamic=table) if table else spec


class Oracle:
    """Answers 'does this candidate fail the same way?' through the worker pool, and logs it."""

    def __init__(self, dump: Dump, pool: Pool, log_path: Optional[str] = None):
        self.dump, self.pool = dump, pool
        self.signature: Optional[Signature] = None
        self.queries = 0
        self.failing: dict = {}   # Case.key -> Outcome of each candidate that failed the same way
        self._log = open(log_path, "a") if log_path else None

    def outcome(self, case: Case, purpose: str) -> Outcome:
        self.queries += 1
        outcome = self.pool.query(case_source(case), list(case.inputs), self.dump.store,
                                  with_dynamic(self.dump.spec, case), case.constants)
        if self._log:
            row = {"query": self.queries, "purpose": purpose, "key": case.key[:16],
                   "nodes": case.num_nodes, "inputs": case.num_inputs, "outcome": outcome.kind,
                   "summary": outcome.summary(), "seconds": round(outcome.seconds, 4),
                   "same_failure": bool(self.signature and self.signature.matches(outcome))}
            self._log.write(json.dumps(row) + "\n")
            self._log.flush()
        return outcome

    def test(self, case: Case) -> bool:
        outcome = self.outcome(case, "candidate")
        if self.signature.matches(outcome):
            self.failing[case.key] = outcome
            return True
        return False

    def close(self) -> None:
        if self._log:
            self._log.close()


@dataclass
class Report:
    # minified | flaky | no_failure | different (not the dump's failure) | cannot_run |
    # repro_failed (the written repro.py, run as a user runs it, did not reproduce: `repro_run`)
    status: str
    first: Outcome
    second: Optional[Outcome] = None
    signature: Optional[Signature] = None
    result: Optional[engine.Result] = None
    files: list = field(default_factory=list)
    final: Optional[Outcome] = None  # the minimized graph's failing outcome (its own query)
    seconds: float = 0.0
    workers_replaced: int = 0
    repro_run: Optional[UserRun] = None     # `python repro.py` from another folder, fresh process
    repro_expected: Optional[int] = None    # the exit code it must give: the reproduced failure's

    def to_dict(self) -> dict:
        d = {"status": self.status, "seconds": round(self.seconds, 3),
             "first": self.first.to_dict(), "signature": self.signature.to_dict() if self.signature else None,
             "files": self.files, "workers_replaced": self.workers_replaced}
        if self.second:
            d["second"] = self.second.to_dict()
        if self.result:
            r = self.result
            d["original"] = {"nodes": r.original.num_nodes, "inputs": r.original.num_inputs}
            d["minimized"] = {"nodes": r.minimized.num_nodes, "inputs": r.minimized.num_inputs,
                              "code": case_source(r.minimized),
                              "dynamic": {k: list(v) for k, v in dynamic_table(r.minimized.inputs).items()}}
            d["stats"] = {"queries": r.stats.queries, "cache_hits": r.stats.cache_hits,
                          "adopted": r.stats.adopted, "rounds": r.stats.rounds,
                          "seconds": round(r.stats.seconds, 3), "per_pass": r.stats.per_pass}
        if self.final:
            d["final"] = self.final.to_dict()
        if self.repro_run:
            d["repro_check"] = dict(self.repro_run.to_dict(), expected_code=self.repro_expected,
                                    reproduced=self.status != "repro_failed")
        return d


def minify_dump(dump: Dump, out_dir: str, *, check_str: Optional[str] = None, timeout: float = 60.0,
                on_event: Optional[Callable[[dict], None]] = None, max_queries: Optional[int] = None,
                passes=None, pool: Optional[Pool] = None, fresh: Optional[FreshInterpreter] = None) -> Report:
    """Minify the dump's graph into out_dir (repro.py, minifier_launcher.py, inputs/, minify.jsonl).

    `pool` and `fresh` (the interpreter that checks the written repro.py) may be started early by
    the caller so their warm-up overlaps other work (e.g. the capture run); the caller then closes
    the pool. Without them, they are made here. `fresh` is used up (closed) here either way.
    """
    start = time.perf_counter()
    emit = on_event or (lambda e: None)
    os.makedirs(out_dir, exist_ok=True)
    own = pool is None
    pool = pool or Pool(timeout=timeout)
    oracle = Oracle(dump, pool, os.path.join(out_dir, LOG_NAME))
    # for the check of the written repro.py: its imports overlap every query
    fresh = fresh or FreshInterpreter()
    fresh.warm(warm_modules(dump.spec))
    try:
        report = _run(dump, oracle, out_dir, check_str, emit, max_queries, passes, timeout, fresh)
    finally:
        fresh.close()
        oracle.close()
        if own:
            pool.close()
    report.workers_replaced = pool.replaced
    report.seconds = time.perf_counter() - start
    return report


def _run(dump, oracle, out_dir, check_str, emit, max_queries, passes, timeout, fresh) -> Report:
    emit({"event": "check", "text": "Running the original graph to fix the failure signature"})
    first = oracle.outcome(dump.case, "signature")
    if first.kind == "cannot_run":   # e.g. the backend's module does not import: never minify that
        return Report("cannot_run", first)
    if not first.failed:
        return Report("no_failure", first)
    oracle.signature = Signature.of(first, check_str)
    if check_str and not oracle.signature.matches(first):
        return Report("no_failure", first, signature=oracle.signature)
    if dump.expected and not Signature(**dump.expected).matches(first):
        return Report("different", first, signature=Signature(**dump.expected))
    emit({"event": "signature", "text": f"Failure: {oracle.signature.describe()}"})
    second = oracle.outcome(dump.case, "reproduce")
    if not oracle.signature.matches(second):
        return Report("flaky", first, second, oracle.signature)
    oracle.failing[dump.case.key] = second
    result = engine.minify(dump.case, oracle.test, dump.store, on_event=emit,
                           max_queries=max_queries, passes=passes)
    # The minimized graph's own failing query: running it once more in a warm worker would prove
    # less than the fresh-process run of repro.py below, which replaces it (and pays for itself).
    final = oracle.failing.get(result.minimized.key) or oracle.outcome(result.minimized, "final")
    small = Dump(result.minimized, dump.store, dump.spec, oracle.signature.to_dict(),
                 title=f"minimized from {result.original.num_nodes} to {result.minimized.num_nodes} nodes",
                 failure=final.summary())
    files = write(out_dir, small, files=(REPRO,))
    if not os.path.exists(os.path.join(out_dir, LAUNCHER)):
        original = Dump(dump.case, dump.store, dump.spec, oracle.signature.to_dict(),
                        title="the original failing graph", failure=first.summary())
        files += write(out_dir, original, files=(LAUNCHER,))
    emit({"event": "check", "text": "Running the written repro.py in a fresh process from another folder"})
    expected = repro_exit_code(final, oracle.signature)
    run = fresh.run(files[0], _repro_timeout(timeout))
    status = "minified" if run.code == expected else "repro_failed"
    return Report(status, first, second, oracle.signature, result, files, final,
                  repro_run=run, repro_expected=expected)


def repro_exit_code(final: Outcome, signature: Signature) -> int:
    """The exit code repro.py gives when it reproduces `final` (runtime.verdict's rule)."""
    from tdbg.repro_templates.runtime import verdict
    return verdict(final.to_dict(), signature.to_dict())[0]


def _repro_timeout(query_timeout: float) -> float:
    """A fresh interpreter imports torch (and the backend) before the query's own work; a
    recorded hang makes repro.py wait 60 s for it (runtime.run_repro)."""
    return max(query_timeout, 60.0) + 120.0
