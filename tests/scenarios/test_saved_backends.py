"""Saved backends import: a user backend is saved by copying its module beside repro.py, so its
module-level helpers come along, a `module:function` backend works, and repro.py runs from any
folder (with tdbg unimportable: a user backend needs only torch)."""
import json
import os
import subprocess
import sys

from test_repro_exit_codes import run_repro

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "scenarios", "scripts")


def tdbg(args, tmp_path, env=None, timeout=900, cwd=ROOT):
    """The real CLI (from the repository root); the --json document (always written) and the process."""
    path = str(tmp_path / "doc.json")
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", *args, "--json", path], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith(("TDBG_", "TORCHDYNAMO_"))
                                  or k == "TDBG_CACHE_DIR"}, **(env or {})})
    with open(path) as f:
        return proc, json.load(f)


def test_a_file_backend_with_module_helpers_reproduces_from_another_folder(tmp_path):
    """wrong_below_minus_one calls _copied and _swap_relu (and _bad_relu at run time)."""
    out = tmp_path / "repro"
    proc, doc = tdbg(["run", os.path.join(SCRIPTS, "relu_below_minus_one.py"), "--repro-after", "dynamo",
                      "--repro-level", "4",
                      "--backend", os.path.join(SCRIPTS, "user_backends.py") + ":wrong_below_minus_one",
                      "--out", str(out)], tmp_path)
    assert proc.returncode == 16, proc.stdout + proc.stderr
    assert sorted(os.listdir(out)) == ["inputs", "minifier_launcher.py", "repro.py", "user_backends.py"]
    text = (out / "repro.py").read_text()
    assert "'module': 'user_backends'" in text and "'files': ['user_backends.py']" in text
    assert "def _swap_relu" not in text   # the module is imported, not pasted
    run = run_repro(str(out), tmp_path)
    assert run.returncode == 16, run.stdout + run.stderr
    assert run.stdout.startswith("Reproduced: accuracy mismatch in out[0]")


def test_a_module_function_backend_minifies_and_its_repro_runs_without_the_module_path(tmp_path):
    out = tmp_path / "min"
    proc, doc = tdbg(["minify", os.path.join(SCRIPTS, "uses_sin.py"), "--after", "dynamo",
                      "--backend", "mybackends:crashy", "--out", str(out)], tmp_path, env={"PYTHONPATH": SCRIPTS})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (doc["status"], doc["exit_code"], doc["minimized"]["nodes"]) == ("minified", 0, 3)
    assert "torch.sin(" in doc["minimized"]["code"]
    assert sorted(os.listdir(out)) == ["inputs", "minifier_launcher.py", "minify.jsonl", "mybackends", "repro.py"]
    assert os.listdir(out / "mybackends") == ["__init__.py"]
    run = run_repro(str(out), tmp_path)   # no PYTHONPATH: the copy beside repro.py is imported
    assert run.returncode == 19, run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == "Reproduced: compile error: RuntimeError: mybackends cannot compile sin"


SCRIPT_BACKEND = '''
import torch
from torch._dynamo.backends.common import aot_autograd

LIMIT = 2


def _helper(gm):
    return sum(n.target is torch.sin for n in gm.graph.nodes) >= LIMIT - 1


def refuse_sin(gm, example_inputs):
    if _helper(gm):
        raise RuntimeError("refuse_sin cannot compile sin")
    return gm.forward


data = torch.randn(3)
raise SystemExit("the script's own statements must not run when its backend is loaded")
'''


def _saved_script_backend(tmp_path, monkeypatch, text: str, name: str) -> tuple:
    """(backend_spec, the backend runtime.py loads from it) of `name` in a script `text` run as
    __main__ (as minify's run does)."""
    import types

    from tdbg.minifier.reduce.oracle import backend_spec
    from tdbg.minifier.runs.backends import resolve
    from tdbg.repro_templates.runtime import resolve_backend
    script = tmp_path / "script.py"
    script.write_text(text)
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    backend = resolve(f"{script}:{name}", script=str(script))
    spec = backend_spec(backend, backend.name)
    return spec, resolve_backend({"backend": spec}, str(tmp_path))


def test_a_backend_defined_in_the_script_keeps_its_helpers_but_not_the_scripts_work(tmp_path, monkeypatch):
    """Before: only refuse_sin's own source was saved, so every query raised NameError: _helper."""
    import torch
    spec, saved = _saved_script_backend(tmp_path, monkeypatch, SCRIPT_BACKEND, "refuse_sin")
    assert spec["kind"] == "source" and "def _helper(gm):" in spec["source"] and "data =" not in spec["source"]
    gm = torch.fx.symbolic_trace(lambda x: torch.sin(x) + 1)
    try:
        saved(gm, [torch.ones(2)])
    except RuntimeError as e:
        assert str(e) == "refuse_sin cannot compile sin"
    else:
        raise AssertionError("the saved backend did not refuse sin")


SCRIPT_BACKEND_STATE = '''
import logging
import os

import torch

log = logging.getLogger(__name__)
BIAS = float(os.environ.get("NO_SUCH_TDBG_SETTING", "0.5"))


class Biased:
    def __init__(self, bias):
        self.bias = bias

    def __call__(self, gm, example_inputs):
        log.debug("compiling %d nodes", len(gm.graph.nodes))
        return lambda *args: tuple(o + self.bias for o in gm(*args))


my_backend = Biased(BIAS)
data = torch.randn(3)
raise SystemExit("the script's own statements must not run when its backend is loaded")
'''


def test_a_script_backend_keeps_the_module_level_names_it_reads(tmp_path, monkeypatch):
    """A logger, a setting read from the environment and the instance of a backend class, all
    assigned with calls: none was saved, so minify said Not reproduced (NameError: log) or
    refused the instance."""
    import torch
    spec, saved = _saved_script_backend(tmp_path, monkeypatch, SCRIPT_BACKEND_STATE, "my_backend")
    assert spec["kind"] == "source" and "my_backend = Biased(BIAS)" in spec["source"]
    assert "log = logging.getLogger" in spec["source"] and "data =" not in spec["source"]
    gm = torch.fx.symbolic_trace(lambda x: (x * 2,))
    assert torch.equal(saved(gm, [torch.ones(2)])(torch.ones(2))[0], torch.full((2,), 2.5))
