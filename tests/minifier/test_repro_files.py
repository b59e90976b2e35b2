"""repro.py / minifier_launcher.py: rendered from templates, standalone, movable."""
import os
import shutil
import string
import subprocess
import sys

import pytest
import torch

from tdbg.cli.console import exit_code
from tdbg.minifier.artifacts import repro
from tdbg.minifier.artifacts.repro import Dump, load, render, write
from mincases import make_case

PICKY = """
def picky(gm, example_inputs):
    if any(n.target is torch.neg for n in gm.graph.nodes):
        raise NotImplementedError("picky does not support neg")
    return gm
"""


def picky_dump(**kw):
    case, store = make_case(lambda x, n: torch.neg(x * n), torch.arange(6.0).reshape(2, 3),
                            torch.tensor([[3], [250]], dtype=torch.uint8))
    spec = {"after": "dynamo", "backend": {"kind": "source", "name": "picky", "source": PICKY},
            "config": {"inject_bug": ["neg", "accuracy"]}, "check_accuracy": False}
    return Dump(case, store, spec, {"kind": "compile_error", "exc_type": "NotImplementedError",
                                    "pattern": "picky does not support neg", "signal": 0, "check_str": ""}, **kw)


def test_a_missing_template_field_raises(monkeypatch):
    monkeypatch.setattr(repro, "template", lambda name: string.Template("$title $not_provided"))
    with pytest.raises(KeyError):
        render(repro.REPRO, picky_dump())


def test_files_are_standalone_and_readable(tmp_path, monkeypatch):
    monkeypatch.setenv("TDBG_SECRET_PROBE", "leak-me-not")
    write(str(tmp_path), picky_dump())
    for name in ("repro.py", "minifier_launcher.py"):
        text = (tmp_path / name).read_text()
        assert "class Repro(torch.nn.Module):" in text
        assert "neg = torch.neg(mul)" in text
        assert "CONFIG = {'inject_bug': ['neg', 'accuracy']}" in text
        assert "# Made by tdbg " in text and "torch " + torch.__version__ in text
        assert str(tmp_path) not in text and os.path.expanduser("~") not in text
        assert "leak-me-not" not in text and os.environ["TDBG_CACHE_DIR"] not in text


def test_round_trip_keeps_graph_inputs_and_integer_values(tmp_path):
    dump = picky_dump()
    write(str(tmp_path), dump)
    back = load(str(tmp_path / "repro.py"))
    assert back.case.key == dump.case.key
    assert back.store.value(back.case.inputs[1]).tolist() == [[3], [250]]
    assert back.spec["config"] == dump.spec["config"] and back.expected == dump.expected


def test_moved_folder_repro_py_still_reproduces(tmp_path):
    write(str(tmp_path / "a"), picky_dump())
    shutil.move(str(tmp_path / "a"), str(tmp_path / "b"))
    proc = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "b", capture_output=True, text=True)
    assert proc.returncode == exit_code("backend"), proc.stderr
    assert proc.stdout.splitlines()[0] == "Reproduced: compile error: NotImplementedError: picky does not support neg"
    assert sorted(os.listdir(tmp_path / "b")) == ["inputs", "minifier_launcher.py", "repro.py"]


def test_out_dir_rules(tmp_path):
    repro.check_out_dir(str(tmp_path / "new"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        repro.check_out_dir(str(tmp_path / "full"))
    first = repro.new_run_dir(str(tmp_path))
    os.makedirs(first)
    assert repro.new_run_dir(str(tmp_path)) != first
