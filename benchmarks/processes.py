"""The model zoo in several fresh processes, merged: one process's ratio is one sample.

    python benchmarks/processes.py -n 3 [--json PATH] -- --set held-out --modes inference --threads 2

Runs `benchmarks/models.py` with the arguments after `--` in N fresh processes, one after the
other, and merges their JSON: per model, mode and backend the median of the processes' medians,
and as "time / inductor" the median of the processes' own ratios (each taken within one process,
where the backends' runs interleave). Why: where a process's allocations land moves a backend's
time by several percent for that whole process, and tdbg reads its own packed copies while eager
and Inductor share the model's weights, so the ratio moves with it (2026-11-27, this 2-core Xeon:
ELECTRA 0.94, 1.01 and 0.96x in three fresh processes of the same code). Each merged cell keeps
every process's ratio (`process_ratios`); a line per model shows their range, and the summary
lines are models.py's over the merged cells.
A cell that failed in any process is reported failed. Exit status: models.py's, the first that
is not 0.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (benchmarks/ is not a package)

JSON_SCHEMA = "tdbg.models.processes"
MEDIAN_FIELDS = ("median_s", "min_s", "speedup_vs_eager", "time_vs_inductor", "compile_s", "first_call_s")


def _key(cell: dict) -> tuple:
    return cell["model"], cell["mode"], cell["backend"]


def merge(payloads: list) -> dict:
    """One payload from several models.py payloads of the same command: per cell the median of
    MEDIAN_FIELDS over the processes (a failed cell wins), `process_ratios` the processes' own
    time / inductor, and the summary recomputed."""
    first = payloads[0]
    cells = {}
    for p in payloads:
        for c in p["cells"]:
            cells.setdefault(_key(c), []).append(c)
    merged = []
    for key in (_key(c) for c in first["cells"]):
        seen = cells[key]
        failed = [c for c in seen if c["status"] != "ok"]
        if failed:
            merged.append(dict(failed[0], process_ratios=[c.get("time_vs_inductor") for c in seen]))
            continue
        cell = copy.deepcopy(seen[0])
        for field in MEDIAN_FIELDS:
            values = [c[field] for c in seen if c.get(field) is not None]
            cell[field] = statistics.median(values) if values else None
        cell["runs_s"] = [s for c in seen for s in c["runs_s"]]
        cell["process_ratios"] = [c.get("time_vs_inductor") for c in seen]
        cell["noisy"] = "; ".join(dict.fromkeys(c["noisy"] for c in seen if c.get("noisy"))) or None
        merged.append(cell)
    return dict(first, cells=merged, processes=len(payloads), summary=models.summary(merged, first["modes"]),
                process_summaries=[p["summary"] for p in payloads])


def spread_lines(payload: dict) -> list:
    """Per cell of the goal backend: the processes' ratios, e.g.
    `electra inference: tdbg/inductor 0.96x, processes 0.94-1.01x (0.942, 1.009, 0.956)`."""
    lines = []
    for c in payload["cells"]:
        ratios = [r for r in c.get("process_ratios") or [] if r is not None]
        if c["backend"] != models.harness.GOAL_BACKEND or not ratios:
            continue
        lines.append(f"{c['model']} {c['mode']}: tdbg/inductor {c['time_vs_inductor']:.2f}x, "
                     f"processes {min(ratios):.2f}-{max(ratios):.2f}x ({', '.join(f'{r:.3f}' for r in ratios)})")
    return lines


def run_processes(n: int, args: list, run=subprocess.run) -> tuple:
    """(payloads, exit status): models.py with `args` in `n` fresh processes, one after the other."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models.py")
    payloads, status = [], 0
    with tempfile.TemporaryDirectory(prefix="tdbg-processes-") as tmp:
        for i in range(n):
            path = os.path.join(tmp, f"process_{i}.json")
            print(f"process {i + 1}/{n}: models.py {' '.join(args)}", file=sys.stderr, flush=True)
            # each process's own table is replaced by the merged one; its progress lines (stderr) show
            done = run([sys.executable, script, *args, "--json", path], stdout=subprocess.DEVNULL)
            status = status or done.returncode
            if done.returncode == 0:
                payloads.append(_load(path))
    return payloads, status


def _load(path: str) -> dict:
    with open(path) as f:
        doc = json.load(f)
    return {k: v for k, v in doc.items() if k not in ("schema", "version")}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--processes", type=int, default=3, help="fresh processes to run (default 3)")
    p.add_argument("--json", dest="json_path", help="write the merged results as JSON")
    p.add_argument("models_args", nargs=argparse.REMAINDER, help="-- then models.py's own arguments")
    args = p.parse_args(argv)
    if args.models_args[:1] == ["--"]:
        args.models_args = args.models_args[1:]
    if args.processes < 2:
        p.error("-n must be at least 2 (one process is models.py itself)")
    if "--json" in args.models_args:
        p.error("give --json before `--`: each process writes its own JSON, processes.py the merged one")
    return args


def main(argv=None, run=subprocess.run) -> dict:
    args = parse_args(argv)
    if args.json_path:
        from tdbg.cli.common import check_output_file
        check_output_file(args.json_path, "--json")
    payloads, status = run_processes(args.processes, args.models_args, run)
    if not payloads:
        sys.exit(status or 1)
    merged = merge(payloads)
    print(f"merged from {len(payloads)} processes of models.py {' '.join(args.models_args)}")
    models.render(merged)
    for line in spread_lines(merged):
        print(line)
    if args.json_path:
        from tdbg.cli.console import write_json
        write_json(args.json_path, merged, JSON_SCHEMA)
    if status:
        sys.exit(status)
    return merged


if __name__ == "__main__":
    main()
