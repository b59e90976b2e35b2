"""Drive the real `tdbg` CLI in subprocesses. Every scenario starts at most once per session, a
few at a time, the first time a test asks for any of them; tests then share the results."""
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join("tests", "cli", "scripts")

# name -> (tdbg arguments, extra environment). "{json}" becomes the scenario's JSON path.
SCENARIOS = {
    "run_foo2_accuracy": (["run", "examples/foo2.py", "--backend", "inductor", "--check-accuracy"], {"TDBG_INJECT_BUG": "neg:accuracy"}),
    "run_foo1_compile_error": (["run", "examples/foo1.py", "--backend", "inductor"], {"TDBG_INJECT_BUG": "neg:compile_error"}),
    "run_foo2_crash": (["run", "examples/foo2.py", "--backend", "inductor"], {"TDBG_INJECT_BUG": "neg:crash"}),
    "run_foo2_kernel_runtime": (["run", "examples/foo2.py", "--backend", "inductor", "--debug", "--logs", "compiler"],
                                {"TDBG_INJECT_BUG": "neg:runtime_error", "TDBG_DEBUG_DIR": "{tmp}/dbg"}),
    "run_fullgraph": (["run", "examples/toy_example.py", "--fullgraph", "--backend", "eager"], {}),
    "run_toy_compiler": (["run", "examples/toy_compiler.py", "--backend", "examples/toy_compiler.py:toy_compiler"], {}),
    "run_exits_seven": (["run", f"{SCRIPTS}/exits_seven.py", "--backend", "eager"], {}),
    "run_no_compile": (["run", f"{SCRIPTS}/no_compile.py", "--backend", "inductor"], {}),
    "run_timeout": (["run", f"{SCRIPTS}/sleeps.py", "--backend", "inductor", "--timeout", "2"], {}),
    "run_function": (["run", f"{SCRIPTS}/two_functions.py", "--function", "inner", "--backend", "aot_eager",
                      "--", "--flag"], {}),
    "run_mlp_ok": (["run", "examples/mlp_train.py", "--backend", "inductor", "--check-accuracy"], {}),
    "run_foo2_repro": (["run", "examples/foo2.py", "--backend", "inductor", "--repro-after", "aot", "--repro-level", "4", "--out", "{tmp}/repro"],
                       {"TDBG_INJECT_BUG": "neg:accuracy"}),
    "explain_toy": (["explain", "examples/toy_example.py", "--backend", "eager", "--max-graph-breaks", "2"], {}),
    "explain_toy_tdbg": (["explain", "examples/toy_example.py", "--backend", "tdbg"], {}),
    "run_toy_tdbg_accuracy": (["run", "examples/toy_example.py", "--backend", "tdbg"], {"TDBG_INJECT_BUG": "mul:accuracy"}),
    "explain_recompile": (["explain", "examples/recompile_example.py", "--backend", "eager", "--max-recompiles", "1"], {}),
    "bisect_dynamo": (["bisect", "examples/dynamo_failure.py", "--backend", "inductor"], {}),
    "bisect_script_fails": (["bisect", f"{SCRIPTS}/exits_seven.py", "--backend", "inductor"], {}),
    "bisect_foo2_accuracy": (["bisect", "examples/foo2.py", "--backend", "inductor"], {"TDBG_INJECT_BUG": "neg:accuracy"}),
    "bisect_foo2_crash": (["bisect", "examples/foo2.py", "--backend", "inductor"], {"TDBG_INJECT_BUG": "neg:crash"}),
    "bisect_foo1_compile_error": (["bisect", "examples/foo1.py", "--backend", "inductor"], {"TDBG_INJECT_BUG": "neg:compile_error"}),
}


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str
    json: dict
    files: list      # files the run left in its temporary directory (relative paths)

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def _clean_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TDBG_", "TORCHDYNAMO_"))
           or k == "TDBG_CACHE_DIR"}
    env.update(extra, COLUMNS="200")
    return env


def run_tdbg(args, env=None, timeout=600) -> Result:
    with tempfile.TemporaryDirectory(prefix="tdbg-cli-test-") as tmp:
        json_path = os.path.join(tmp, "out.json")
        cut = args.index("--") if "--" in args else len(args)
        argv = [a.replace("{tmp}", tmp) for a in [*args[:cut], "--json", json_path, *args[cut:]]]
        env = {k: v.replace("{tmp}", tmp) for k, v in (env or {}).items()}
        proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", *argv], cwd=ROOT, env=_clean_env(env),
                              capture_output=True, text=True, timeout=timeout)
        doc = json.load(open(json_path)) if os.path.exists(json_path) else {}
        files = sorted(os.path.relpath(os.path.join(d, f), tmp) for d, _, fs in os.walk(tmp) for f in fs)
    return Result(proc.returncode, proc.stdout, proc.stderr, doc, files)


class _Scenarios:
    def __init__(self, names):
        self.pool = ThreadPoolExecutor(max_workers=3)
        self.futures = {name: self.pool.submit(run_tdbg, *SCENARIOS[name]) for name in names}

    def __getitem__(self, name) -> Result:
        if name not in self.futures:
            self.futures[name] = self.pool.submit(run_tdbg, *SCENARIOS[name])
        return self.futures[name].result()


def _wanted(session) -> list:
    """Scenarios the selected tests use (by `scenario` marker), so -k runs stay short."""
    names = []
    for item in session.items:
        for mark in item.iter_markers("scenario"):
            names += [n for n in mark.args if n not in names]
    return names


def pytest_configure(config):
    config.addinivalue_line("markers", "scenario(*names): CLI scenarios the test reads (started together)")


@pytest.fixture(scope="session")
def scenarios(request):
    runner = _Scenarios(_wanted(request.session))
    yield runner
    runner.pool.shutdown(wait=True, cancel_futures=True)
