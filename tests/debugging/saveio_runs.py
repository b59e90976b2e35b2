"""Shared runs for the save-io, replay and diff tests: `tdbg run --save-io` on
tests/debugging/scripts/deep_mlp.py, healthy (with --profile) and under an injected accuracy bug in
sigmoid (an op of the forward graph only), plus two small ones, started once per test process, two
at a time, the first time a test asks for any of them (the `saved_runs` fixture).

A helper module, not conftest.py: test modules of several folders do `from conftest import ...`,
and pytest keeps only the last conftest it loaded under that name."""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEEP_MLP = os.path.join("tests", "debugging", "scripts", "deep_mlp.py")
TWO_SHAPES = os.path.join("tests", "debugging", "scripts", "two_shapes.py")
INJECTED = {"TDBG_INJECT_BUG": "sigmoid:accuracy"}


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    json: dict

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def clean_env(extra=None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TDBG_", "TORCHDYNAMO_")) or k == "TDBG_CACHE_DIR"}
    env.update(extra or {}, COLUMNS="200")
    return env


def tdbg(args, env=None, json_path=None, timeout=600) -> Ran:
    """Run the real CLI (`--json` added before any `--` when json_path is given)."""
    args = list(args)
    if json_path:
        cut = args.index("--") if "--" in args else len(args)
        args[cut:cut] = ["--json", str(json_path)]
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", *map(str, args)], cwd=ROOT, env=clean_env(env),
                          capture_output=True, text=True, timeout=timeout)
    doc = json.load(open(json_path)) if json_path and os.path.exists(json_path) else {}
    return Ran(proc.returncode, proc.stdout, proc.stderr, doc)


class SavedRuns:
    """name -> (Ran, saved folder) of one `tdbg run ... --save-io`, run once per session."""
    COMMANDS = {
        "healthy": (["--backend", "inductor", "--profile"], {}),
        "injected": (["--backend", "inductor"], INJECTED),
        "eager": (["--backend", "eager"], {}),
        "two_shapes": (["--backend", "aot_eager"], {}),
    }

    def __init__(self, base):
        self.base = base
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.futures = {}

    def start(self, *names):
        for name in names:
            if name not in self.futures:
                self.futures[name] = self.pool.submit(self._run, name)

    def _run(self, name):
        extra, env = self.COMMANDS[name]
        folder = os.path.join(self.base, name)
        script = TWO_SHAPES if name == "two_shapes" else DEEP_MLP
        # replay and diff judge these folders; the run itself saves them without comparing (as before
        # accuracy checking became run's default: a checked call is one more timed call)
        ran = tdbg(["run", script, "--no-check-accuracy", "--save-io", folder, *extra], env,
                   json_path=os.path.join(self.base, f"{name}.json"))
        return ran, folder

    def __call__(self, name):
        self.start(name)
        return self.futures[name].result()


_RUNS = []


def _shared() -> SavedRuns:
    if not _RUNS:
        runs = SavedRuns(tempfile.mkdtemp(prefix="tdbg-saveio-tests-"))
        runs.start("healthy", "injected", "eager", "two_shapes")
        atexit.register(shutil.rmtree, runs.base, True)
        atexit.register(runs.pool.shutdown, True, cancel_futures=True)
        _RUNS.append(runs)
    return _RUNS[0]


@pytest.fixture
def saved_runs():
    """The shared SavedRuns (one per test process, whichever module asks first)."""
    return _shared()
