"""After AOT means the user's backend: `--after aot` (run --repro-after, minify, the
TORCHDYNAMO_REPRO_* variables) captures the aten graphs the chosen backend itself compiles, and
every check, dump and minifier query compiles them with that backend's own compiler."""
import os
import re

import pytest

from test_repro_exit_codes import run_repro
from test_saved_backends import SCRIPTS, tdbg

AMIN = os.path.join(SCRIPTS, "amin_uint8.py")


def test_run_repro_after_aot_catches_the_real_inductor_amin_bug_and_repro_py_needs_only_torch(tmp_path):
    out = tmp_path / "repro"
    proc, doc = tdbg(["run", AMIN, "--backend", "torch:inductor", "--repro-after", "aot", "--repro-level", "4",
                      "--out", str(out)], tmp_path)
    assert proc.returncode == 16, proc.stdout + proc.stderr
    text = (out / "repro.py").read_text()
    assert "AOT = {'family': 'torch:inductor', 'graph': 'inference'}" in text
    assert "torch.ops.aten.amin.default(arg0_1, [1])" in text
    run = run_repro(str(out), tmp_path)   # tdbg unimportable, another folder
    assert run.returncode == 16, run.stdout + run.stderr
    # Which amin Inductor gets wrong, and the wrong value, depend on the CPU's vector width (AVX2:
    # out[0] only, got 1; AVX-512: both, got 0): repro.py must show exactly the mismatches the run
    # reported, with eager's values (3 and 6) as the expected ones.
    reported = doc["verdict"]["error"]["evidence"]["mismatches"]
    eager = {"out[0]": 3, "out[1]": 6}
    assert reported and all(re.fullmatch(rf"1 of 1 elements differ; first at \(0,\): expected {eager[m['output']]}, "
                                         r"got \d+", m["message"]) for m in reported)
    names = ", ".join(m["output"] for m in reported)
    assert run.stdout.splitlines()[:1 + len(reported)] == (
        [f"Reproduced: accuracy mismatch in {names}"] + [f"  {m['output']}: {m['message']}" for m in reported])


@pytest.mark.slow
def test_minify_after_aot_with_torch_inductor_shrinks_to_the_amin_node(tmp_path):
    out = tmp_path / "min"
    proc, doc = tdbg(["minify", AMIN, "--backend", "torch:inductor", "--after", "aot", "--level", "4",
                      "--out", str(out)], tmp_path, timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code = doc["minimized"]["code"]
    assert code.count("torch.ops.aten.") == 1 and "torch.ops.aten.amin.default(" in code
    run = run_repro(str(out), tmp_path)
    assert run.returncode == 16, run.stdout + run.stderr


def test_torchdynamo_repro_variables_check_the_backward_graph_of_an_aot_autograd_backend(tmp_path):
    """user_backends.wrong_backward: right forward, a backward compiler that doubles an output."""
    proc, doc = tdbg(["run", os.path.join(SCRIPTS, "train_mlp.py"), "--backend", "inductor",
                      "--backend", os.path.join(SCRIPTS, "user_backends.py") + ":wrong_backward"], tmp_path,
                     env={"TORCHDYNAMO_REPRO_AFTER": "aot", "TORCHDYNAMO_REPRO_LEVEL": "4"}, cwd=tmp_path)
    assert proc.returncode == 16, proc.stdout + proc.stderr
    folder = doc["verdict"]["repro_dir"]
    assert os.path.dirname(os.path.dirname(folder)) == str(tmp_path)   # tdbg_repro/<time>/ in the cwd
    text = open(os.path.join(folder, "repro.py")).read()
    assert "AOT = {'family': 'aot_autograd', 'graph': 'backward'}" in text
    assert "user_backends.py" in os.listdir(folder)
    run = run_repro(folder, tmp_path)
    assert run.returncode == 16, run.stdout + run.stderr
    assert run.stdout.startswith("Reproduced: accuracy mismatch in out[0]")


def test_a_backend_without_an_aot_stage_is_refused_naming_after_dynamo(tmp_path):
    proc, doc = tdbg(["minify", os.path.join(SCRIPTS, "uses_sin.py"), "--after", "aot",
                      "--backend", "mybackends:crashy", "--out", str(tmp_path / "min")], tmp_path,
                     env={"PYTHONPATH": SCRIPTS})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Use --after dynamo" in proc.stderr and "mybackends:crashy" in proc.stderr
    assert (doc["exit_code"], doc["status"]) == (3, "error") and "Use --after dynamo" in doc["error"]
    assert not os.path.exists(tmp_path / "min")


def test_run_repro_after_aot_refuses_a_backend_without_an_aot_stage_as_bad_input(tmp_path):
    proc, doc = tdbg(["run", os.path.join(SCRIPTS, "uses_sin.py"), "--repro-after", "aot",
                      "--backend", "mybackends:crashy", "--out", str(tmp_path / "dump")], tmp_path,
                     env={"PYTHONPATH": SCRIPTS})
    assert proc.returncode == 3, proc.stdout + proc.stderr    # was 70: "a bug in tdbg"
    assert doc["verdict"]["stage"] == "bad_input" and "Use --after dynamo" in doc["verdict"]["error"]["message"]
