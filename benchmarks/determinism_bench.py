"""What `tdbg run --check-determinism` costs: the same run with and without it.

    python benchmarks/determinism_bench.py [--repeat 3] [--backend inductor] [SCRIPT ...]

For each script (default: examples/mlp_train.py and tests/scenarios/scripts/dropout_mlp.py), runs
`tdbg run SCRIPT --backend B --json` --repeat times each way (alternating, so machine load hits
both alike; the compile cache is warm after the first run) and prints the median wall time of the
whole run each way and the check's own time as the run measured it (the sum of every graph's
`determinism.seconds`: two compiled and two eager runs of its first call, gradients too).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("examples/mlp_train.py", "tests/scenarios/scripts/dropout_mlp.py")


def one_run(script: str, backend: str, check: bool) -> tuple:
    """(wall seconds, check seconds summed over graphs) of one `tdbg run`."""
    with tempfile.TemporaryDirectory() as tmp:
        doc = os.path.join(tmp, "run.json")
        argv = [sys.executable, "-m", "tdbg.cli.main", "run", script, "--backend", backend, "--json", doc]
        start = time.perf_counter()
        proc = subprocess.run(argv + (["--check-determinism"] if check else []), cwd=ROOT, capture_output=True,
                              text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
        graphs = json.load(open(doc))["verdict"]["graphs"]
    return wall, sum((g.get("determinism") or {}).get("seconds", 0.0) for g in graphs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scripts", nargs="*", default=list(SCRIPTS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    one_run(args.scripts[0], args.backend, False)   # warm the compile cache
    print(f"{'script':45} {'without':>9} {'with':>9} {'overhead':>9} {'check':>8}")
    for script in args.scripts:
        plain, checked, inside = [], [], []
        for _ in range(args.repeat):
            plain.append(one_run(script, args.backend, False)[0])
            wall, seconds = one_run(script, args.backend, True)
            checked.append(wall)
            inside.append(seconds)
        a, b = statistics.median(plain), statistics.median(checked)
        print(f"{script:45} {a:8.2f}s {b:8.2f}s {100 * (b - a) / a:8.1f}% {statistics.median(inside):7.3f}s")


if __name__ == "__main__":
    main()
