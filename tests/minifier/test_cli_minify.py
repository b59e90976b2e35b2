"""`tdbg minify` end to end (real CLI in a subprocess). The seed-script cases are slow."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

from tdbg.cli.console import exit_code
from tdbg.minifier.artifacts.repro import Dump, write
from mincases import chain_fn, make_case

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
BOTH = """
def both(gm, example_inputs):
    targets = {n.target for n in gm.graph.nodes}
    if torch.neg in targets and torch.mul in targets:
        raise RuntimeError("cannot compile neg together with mul")
    return gm
"""


def tdbg(*args, cwd=None, env=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "tdbg.cli.main", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def chain_dump(directory):
    torch.manual_seed(0)
    case, store = make_case(chain_fn, torch.randn(4, 8), torch.randn(4, 8))
    spec = {"after": "dynamo", "backend": {"kind": "source", "name": "both", "source": BOTH}, "config": {}}
    write(str(directory), Dump(case, store, spec, title="a 40-op chain"))


def test_minify_a_dump_dir_two_far_apart_culprits(tmp_path):
    chain_dump(tmp_path / "dump")
    proc = tdbg("minify", str(tmp_path / "dump"), "--out", str(tmp_path / "out"), "--json", str(tmp_path / "m.json"))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "Started off with 43 nodes" in proc.stderr
    assert "Strategy: Delta debugging (G: " in proc.stderr and "SUCCESS: Went from " in proc.stderr
    doc = json.loads((tmp_path / "m.json").read_text())
    assert (doc["schema"], doc["version"], doc["status"]) == ("tdbg.minify", 1, "minified")
    assert doc["original"] == {"nodes": 43, "inputs": 2}
    assert doc["minimized"]["nodes"] == 6  # 3 inputs, neg, mul, output
    assert "torch.neg(" in doc["minimized"]["code"] and "torch.mul(" in doc["minimized"]["code"]
    # the document names the files where they end up, not in the hidden work folder
    assert sorted(doc["files"]) == [str(tmp_path / "out" / n) for n in ("minifier_launcher.py", "repro.py")]
    log = (tmp_path / "out" / "minify.jsonl").read_text().splitlines()
    # + signature, reproduce; the minimized graph is not queried again: repro.py itself is run instead
    assert len(log) == doc["stats"]["queries"] + 2
    check = doc["repro_check"]
    assert (check["code"], check["expected_code"], check["reproduced"]) == (exit_code("backend"),) * 2 + (True,)
    shutil.move(str(tmp_path / "out"), str(tmp_path / "moved"))
    run = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "moved", capture_output=True, text=True)
    assert run.returncode == exit_code("backend")
    assert "cannot compile neg together with mul" in run.stdout
    again = tdbg("minify", str(tmp_path / "dump"), "--out", str(tmp_path / "moved"))
    assert again.returncode == exit_code("usage") and "not empty" in again.stderr


def test_help_does_not_import_torch():
    code = ("import sys; from click.testing import CliRunner; from tdbg.cli.main import cli; "
            "r = CliRunner().invoke(cli, ['minify', '--help']); assert r.exit_code == 0, r.output; "
            "assert '--check-str' in r.output; assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_foo2_accuracy_after_aot_level_4_minifies_to_neg(tmp_path):
    proc = tdbg("minify", os.path.join(EXAMPLES, "foo2.py"), "--backend", "inductor", "--after", "aot", "--level", "4",
                "--out", str(tmp_path / "out"), "--json", str(tmp_path / "m.json"),
                env={"TDBG_INJECT_BUG": "neg:accuracy"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["signature"]["kind"] == "accuracy"
    code = doc["minimized"]["code"]
    assert code.count("torch.ops.aten.") == 1 and "torch.ops.aten.neg.default(" in code
    shutil.move(str(tmp_path / "out"), str(tmp_path / "moved"))
    run = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "moved", capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "TDBG_INJECT_BUG"})
    assert run.returncode == exit_code("accuracy"), run.stdout + run.stderr
    assert run.stdout.startswith("Reproduced: accuracy mismatch in out[0]")
    assert sorted(os.listdir(tmp_path)) == ["m.json", "moved"]  # nothing else in the cwd


@pytest.mark.slow
def test_foo1_compile_error_minifies_to_neg(tmp_path):
    proc = tdbg("minify", os.path.join(EXAMPLES, "foo1.py"), "--backend", "inductor", "--after", "aot", "--out", str(tmp_path / "out"),
                "--json", str(tmp_path / "m.json"), env={"TDBG_INJECT_BUG": "neg:compile_error"})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads((tmp_path / "m.json").read_text())
    assert (doc["signature"]["kind"], doc["signature"]["exc_type"]) == ("compile_error", "CppCompileError")
    assert doc["minimized"]["code"].count("torch.ops.aten.") == 1 and "aten.neg.default(" in doc["minimized"]["code"]
    run = subprocess.run([sys.executable, str(tmp_path / "out" / "repro.py")], capture_output=True, text=True)
    assert run.returncode == exit_code("cpp_build"), run.stdout + run.stderr


@pytest.mark.slow
def test_toy_compiler_after_dynamo_minifies_to_relu(tmp_path):
    script = os.path.join(EXAMPLES, "toy_compiler.py")
    proc = tdbg("minify", script, "--after", "dynamo", "--backend", f"{script}:toy_compiler",
                "--out", str(tmp_path / "out"), "--json", str(tmp_path / "m.json"))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["minimized"]["nodes"] == 3
    # Dynamo names a node after the local it is assigned to (`a = torch.relu(z)`; older torch: `relu`)
    assert re.search(r"\n        (a|relu) = torch\.relu\(z\)", doc["minimized"]["code"])
    text = (tmp_path / "out" / "repro.py").read_text()
    assert "def toy_compiler(gm: torch.fx.GraphModule, _):" in text and EXAMPLES not in text


@pytest.mark.slow
def test_a_compiler_segfault_is_minified_not_fatal(tmp_path):
    proc = tdbg("minify", os.path.join(EXAMPLES, "foo2.py"), "--backend", "inductor", "--after", "aot", "--out", str(tmp_path / "out"),
                "--json", str(tmp_path / "m.json"), env={"TDBG_INJECT_BUG": "neg:crash"})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    doc = json.loads((tmp_path / "m.json").read_text())
    assert (doc["signature"]["kind"], doc["signature"]["signal"]) == ("crash", 11)
    assert "aten.neg.default(" in doc["minimized"]["code"] and doc["minimized"]["code"].count("torch.ops.aten.") == 1
    assert doc["workers_replaced"] == 0
    run = subprocess.run([sys.executable, str(tmp_path / "out" / "repro.py")], capture_output=True, text=True)
    assert run.returncode == exit_code("crash"), run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == "Reproduced: crash (SIGSEGV)"


@pytest.mark.slow
def test_launcher_runs_the_minifier(tmp_path):
    chain_dump(tmp_path / "dump")
    proc = subprocess.run([sys.executable, "minifier_launcher.py", "--out", str(tmp_path / "out")],
                          cwd=tmp_path / "dump", capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "Minified 43 -> 6 nodes" in proc.stdout


def test_an_unusable_out_is_refused_before_any_work_and_the_json_says_so(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    proc = tdbg("minify", os.path.join(EXAMPLES, "foo2.py"), "--backend", "inductor", "--out", str(tmp_path / "file" / "sub"),
                "--json", str(tmp_path / "m.json"))
    assert proc.returncode == exit_code("usage"), proc.stderr
    assert "--out" in proc.stderr and "Running" not in proc.stderr
    doc = json.loads((tmp_path / "m.json").read_text())
    assert (doc["status"], doc["exit_code"]) == ("error", exit_code("usage"))


def test_a_script_failing_outside_compiled_graphs_keeps_its_own_code_and_leaves_no_folder(tmp_path):
    script = os.path.join(ROOT, "tests", "cli", "scripts", "exits_seven.py")
    proc = tdbg("minify", script, "--backend", "eager", "--after", "dynamo", "--out", str(tmp_path / "out"),
                "--json", str(tmp_path / "m.json"))
    assert proc.returncode == 7, proc.stderr
    assert "outside any compiled graph" in proc.stderr
    doc = json.loads((tmp_path / "m.json").read_text())
    assert (doc["status"], doc["exit_code"], doc["capture"]["stage"]) == ("error", 7, "script")
    assert sorted(os.listdir(tmp_path)) == ["m.json"]   # neither out/ nor a partial work folder


def test_an_interrupted_minify_leaves_only_a_hidden_work_folder_and_a_rerun_works(tmp_path):
    chain_dump(tmp_path / "dump")
    (tmp_path / "tmp").mkdir()
    from torch._inductor.runtime.cache_dir_utils import cache_dir   # follows TMPDIR: keep the warm one
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "TORCHINDUCTOR_CACHE_DIR": cache_dir()}
    proc = subprocess.Popen([sys.executable, "-m", "tdbg.cli.main", "minify", str(tmp_path / "dump"),
                             "--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    for line in proc.stderr:          # interrupt once the minifier has started querying
        if "Started off with" in line:
            break
    proc.send_signal(subprocess.signal.SIGKILL)
    proc.communicate()
    assert not os.path.exists(tmp_path / "out")
    assert [n for n in os.listdir(tmp_path) if n.startswith(".out.partial-")]
    # the repro check's interpreter outlives the killed minify; it removes its own folder at EOF
    deadline = time.monotonic() + 60
    while os.listdir(tmp_path / "tmp") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert os.listdir(tmp_path / "tmp") == []
    again = tdbg("minify", str(tmp_path / "dump"), "--out", str(tmp_path / "out"), "--max-queries", "3")
    assert again.returncode == 0, again.stderr
    assert sorted(os.listdir(tmp_path / "out")) == ["inputs", "minifier_launcher.py", "minify.jsonl", "repro.py"]
