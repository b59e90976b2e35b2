"""tdbg's tools on a program whose compiled graph has symbolic sizes (automatic dynamic: the
second size recompiles the graph with symbols), end to end through the CLI. The backends are
user backends (file.py:function): one right on static graphs and wrong on symbolic ones past 64
rows (a size-generic kernel's tail bug), one wrong on any graph but only for calls past 64 rows."""
import json
import re
import subprocess
import sys

import pytest

SCRIPT = '''
import torch

def f(x, w):
    return torch.relu(x @ w).sum(1) * 2

w = torch.randn(8, 4)
cf = torch.compile(f, backend="eager")
for n in (8, 16, 100):
    print(n, tuple(cf(torch.randn(n, 8), w).shape))
'''
BACKENDS = '''
import torch
from torch._dynamo.backends.common import aot_autograd


def _symbolic(values):
    return any(isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and
               any(isinstance(s, torch.SymInt) for s in v.shape)) for v in values)


def _plus_one_past_64(fn):
    def run(*args):
        out = fn(*args)
        return type(out)(o + 1 if o.dim() and o.shape[0] > 64 else o for o in out)
    return run


def wrong_if_dynamic(gm, example_inputs):
    metas = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    return _plus_one_past_64(gm) if _symbolic(metas) else gm.forward


def wrong_when_big(gm, example_inputs):
    return _plus_one_past_64(gm)


def _aten_wrong_if_dynamic(gm, example_inputs):
    return _plus_one_past_64(gm) if _symbolic(example_inputs) else gm


aot_wrong_if_dynamic = aot_autograd(fw_compiler=_aten_wrong_if_dynamic)
'''


def tdbg(cwd, *args):
    ran = subprocess.run([sys.executable, "-m", "tdbg.cli.main", *args], cwd=cwd, capture_output=True,
                         text=True, timeout=600)
    return ran.returncode, ran.stdout, ran.stderr


@pytest.fixture
def program(tmp_path):
    (tmp_path / "dyn.py").write_text(SCRIPT)
    (tmp_path / "bk.py").write_text(BACKENDS)
    return tmp_path


@pytest.mark.slow
def test_run_checks_the_call_with_the_size_where_the_backend_is_wrong(program):
    code, stdout, _ = tdbg(program, "run", "dyn.py", "--backend", "bk.py:wrong_when_big")
    assert code == 16, stdout
    # graph 1 is the symbolic recompile (sizes 16, 100): its second call is the wrong one, and
    # the line says at which size its symbol was
    assert re.search(r"  graph: 1 \(frame f\) forward, while running \(call 2; symbolic sizes s\d+=100\)\n", stdout)
    assert "out[0] (torch.float32[100]): max abs error 1 at" in stdout


@pytest.mark.slow
@pytest.mark.parametrize("after,backend", [("dynamo", "bk.py:wrong_if_dynamic"), ("aot", "bk.py:aot_wrong_if_dynamic")])
def test_minify_keeps_the_symbolic_sizes_and_repro_py_reproduces(program, after, backend):
    code, stdout, stderr = tdbg(program, "minify", "dyn.py", "--after", after, "--level", "4", "--backend", backend,
                                "--out", "m", "--json", "m.json")
    assert code == 0, stdout + stderr
    doc = json.loads((program / "m.json").read_text())
    assert doc["status"] == "minified" and doc["repro_check"]["reproduced"] is True
    # one input of 100 rows, its rows symbolic (a row count under 65 would not fail)
    ((name, dims),) = doc["minimized"]["dynamic"].items()
    assert dims[0].startswith("s") and dims[1:] == [None]
    assert f"Symbolic sizes (compiled symbolic, as when it failed): {name}: float32[{dims[0]}=100, 1]" in stdout
    run = subprocess.run([sys.executable, "repro.py"], cwd=program / "m", capture_output=True, text=True, timeout=300)
    assert run.returncode == 16 and run.stdout.startswith("Reproduced: accuracy mismatch in out[0]"), run.stdout


@pytest.mark.slow
def test_compare_recompiles_each_saved_size_symbolic_and_finds_the_wrong_one(program):
    code, stdout, _ = tdbg(program, "compare", "dyn.py", "--backend", "bk.py:wrong_if_dynamic")
    assert code == 16, stdout
    assert "g1_dynamo_c1 (dynamo, 1 outputs, backend wrong_if_dynamic): OUTPUTS MATCH" in stdout
    assert "g1_dynamo_c2 (dynamo, 1 outputs, backend wrong_if_dynamic): OUTPUTS DIFFER" in stdout
    assert "3 graph(s): 2 matching (outputs only), 1 with differing outputs" in stdout


@pytest.mark.slow
def test_save_io_then_replay_each_size_with_its_symbols(program):
    code, stdout, _ = tdbg(program, "run", "dyn.py", "--backend", "bk.py:wrong_if_dynamic", "--save-io", "io")
    assert code == 16 and "saved io: 3 graph call(s)" in stdout, stdout
    code, stdout, _ = tdbg(program, "replay", "io", "--json", "r.json")
    assert code == 16, stdout
    doc = json.loads((program / "r.json").read_text())
    assert [(g["graph"], g["status"]) for g in doc["graphs"]] == [
        ("g0_dynamo_c1", "ok"), ("g1_dynamo_c1", "ok"), ("g1_dynamo_c2", "failed")]
    sizes = [g["symbolic_sizes"] for g in doc["graphs"]]
    assert sizes[0] is None and re.fullmatch(r"(s\d+)=16, l_x_: float32\[\1=16, 8\]", sizes[1]), sizes
    assert f"  symbolic sizes: {sizes[2]}\n" in stdout and sizes[2].endswith("=100, 8]")
