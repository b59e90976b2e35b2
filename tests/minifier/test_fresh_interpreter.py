"""The interpreter that checks a written repro.py as its reader runs it: warmed ahead through
stdin ("module" and "module:function" lines), then the file runs as `python PATH` would, from an
empty folder, with nothing of tdbg imported that the file did not import itself."""
import os

from tdbg.minifier.artifacts.repro import FreshInterpreter

PROBE = """
import json, os, sys
print("argv", sys.argv[0] == __file__, "path0", sys.path[0] == os.path.dirname(__file__))
print("warmed", "json" in sys.modules, "colorsys" in sys.modules)
print("tdbg", sorted(m for m in sys.modules if m.startswith("tdbg")))
print("cwd", os.getcwd() != os.path.dirname(__file__), os.listdir("."))
sys.exit(7)
"""


def test_warmed_then_runs_the_file_as_python_path_does(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    fresh = FreshInterpreter(["json"])
    fresh.warm(["colorsys:no_such_function", "tdbg_no_such_module"])   # failures stay the file's to meet
    run = fresh.run(str(path), timeout=120)
    assert run.code == 7
    assert run.lines == ["argv True path0 True", "warmed True True", "tdbg []", "cwd True []"]
    assert not os.path.exists(run.cwd)     # its empty folder is removed once it ran
    fresh.close()                          # a second close is harmless


def test_an_unused_interpreter_closes_without_running_anything(tmp_path):
    fresh = FreshInterpreter(["json"])
    fresh.close()
    assert fresh.proc.poll() is not None and not os.path.exists(fresh.cwd)
