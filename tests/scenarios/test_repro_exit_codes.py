"""repro.py tells the truth with its exit code: the failure's own code while it reproduces (17 for a
crash, signal named), 21 when it does not (saying what happened instead), 3 when it cannot run.
Dumps are written in-process with small user backends (no compiler), then run as users run them:
`python repro.py` from another folder, with tdbg made unimportable (a user backend needs only torch)."""
import os
import subprocess
import sys

import torch
import torch.fx as fx

from tdbg.minifier.artifacts.graph_io import TensorStore, from_graph_module
from tdbg.minifier.artifacts.repro import Dump, write

BACKENDS = '''
import ctypes

import torch


def _helper_refuses(gm):
    return any(n.target is torch.neg for n in gm.graph.nodes)


def refuses_neg(gm, example_inputs):
    if _helper_refuses(gm):
        raise NotImplementedError("refuses_neg cannot compile neg")
    return gm.forward


def fine(gm, example_inputs):
    return gm.forward


def segfaults(gm, example_inputs):
    def run(*args):
        ctypes.string_at(0)   # reads address 0: SIGSEGV
    return run
'''
REFUSED = {"kind": "compile_error", "exc_type": "NotImplementedError", "pattern": "refuses_neg cannot compile neg",
           "signal": 0, "check_str": ""}


def shadow_tdbg(tmp_path) -> dict:
    """An environment where `import tdbg` fails, to prove a repro does not need it."""
    folder = tmp_path / "shadow" / "tdbg"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").write_text('raise ImportError("this repro must not import tdbg")\n')
    return {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}


def dump_with(tmp_path, attr: str, expected: dict) -> str:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "mybk.py").write_text(BACKENDS)
    store = TensorStore()
    case = from_graph_module(fx.symbolic_trace(lambda x: torch.neg(x) + 1), [torch.arange(4.0)], store)
    spec = {"after": "dynamo", "config": {}, "check_accuracy": False,
            "backend": {"kind": "import", "module": "mybk", "attr": attr, "files": ["mybk.py"], "root": str(src)}}
    out = tmp_path / f"dump_{attr}"
    write(str(out), Dump(case, store, spec, expected))
    return str(out)


def run_repro(folder: str, tmp_path, env=None):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, os.path.join(folder, "repro.py")], cwd=elsewhere, capture_output=True,
                          text=True, timeout=300, env=env or shadow_tdbg(tmp_path))


def test_reproduced_failure_exits_with_its_stage_code_from_any_folder_without_tdbg(tmp_path):
    folder = dump_with(tmp_path, "refuses_neg", REFUSED)
    assert sorted(os.listdir(folder)) == ["inputs", "minifier_launcher.py", "mybk.py", "repro.py"]
    proc = run_repro(folder, tmp_path)
    assert proc.returncode == 19, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == ("Reproduced: compile error: NotImplementedError: "
                                           "refuses_neg cannot compile neg")


def test_a_fixed_failure_exits_21_and_says_it_passed(tmp_path):
    proc = run_repro(dump_with(tmp_path, "fine", REFUSED), tmp_path)
    assert proc.returncode == 21, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == "Not reproduced: passed: compiled results match eager"


def test_a_different_failure_exits_21_and_names_both(tmp_path):
    other = dict(REFUSED, exc_type="RuntimeError", pattern="something else")
    proc = run_repro(dump_with(tmp_path, "refuses_neg", other), tmp_path)
    assert proc.returncode == 21, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == (
        "Not reproduced: the recorded failure was compile error: RuntimeError: something else; "
        "this run gave compile error: NotImplementedError: refuses_neg cannot compile neg")


def test_a_missing_backend_module_or_input_file_exits_3(tmp_path):
    folder = dump_with(tmp_path, "refuses_neg", REFUSED)
    os.remove(os.path.join(folder, "mybk.py"))
    proc = run_repro(folder, tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith("Cannot run this repro: the backend module 'mybk' does not import")
    assert proc.stdout.count("does not import") == 1     # said once (issue 25)
    (tmp_path / "src" / "mybk.py").rename(os.path.join(folder, "mybk.py"))
    for name in os.listdir(os.path.join(folder, "inputs")):
        with open(os.path.join(folder, "inputs", name), "ab") as f:
            f.write(b"x")
    proc = run_repro(folder, tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "does not match its SHA-256 name" in proc.stdout


def test_a_crash_reproduces_as_17_with_the_signal_named(tmp_path):
    expected = {"kind": "crash", "exc_type": "", "pattern": "", "signal": 11, "check_str": ""}
    proc = run_repro(dump_with(tmp_path, "segfaults", expected), tmp_path)
    assert proc.returncode == 17, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[0] == "Reproduced: crash (SIGSEGV)"


def test_runtime_exit_codes_agree_with_tdbgs_table():
    from tdbg.cli.console import EXIT_CODES
    from tdbg.repro_templates.runtime import EXIT_CODES as RUNTIME_CODES
    assert {name: EXIT_CODES[name][0] for name in RUNTIME_CODES} == RUNTIME_CODES
