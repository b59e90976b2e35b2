"""`tdbg bisect`: stops at eager for a Dynamo failure, ends at the `neg` node for injected bugs."""
import pytest

from tdbg.cli.console import exit_code
from tdbg.minifier.diagnose.bisect import SUBSYSTEMS


@pytest.mark.scenario("bisect_dynamo")
def test_dynamo_failure_stops_at_eager(scenarios):
    r = scenarios["bisect_dynamo"]
    assert r.code == exit_code("dynamo"), r.output
    doc = r.json
    assert (doc["schema"], doc["version"]) == ("tdbg.bisect", 2)
    assert doc["first_failing_backend"] == "eager"
    assert [b["backend"] for b in doc["backends"]] == ["eager"]
    assert doc["verdict"]["level"] == "dynamo" and doc["subsystems"] == [] and doc["culprits"] == []
    assert "Dynamo (capturing the program) is at fault" in r.stdout
    assert [run["label"] for run in doc["runs"]] == ["uncompiled", "backend eager"]


@pytest.mark.scenario("bisect_script_fails")
def test_script_failing_uncompiled_is_blamed_on_the_script(scenarios):
    r = scenarios["bisect_script_fails"]
    assert r.code == 7, r.output
    assert r.json["verdict"]["level"] == "script" and r.json["backends"] == []
    assert "the script fails without torch.compile" in r.stdout


def _assert_ends_at_neg(r, stage):
    assert r.code == exit_code(stage), r.output
    doc = r.json
    assert [(b["backend"], b["status"]) for b in doc["backends"]] == [
        ("eager", "ok"), ("aot_eager", "ok"), ("inductor", "failed")]
    # every subsystem row, in the table's order (a new row is probed without a change here)
    assert [row["name"] for row in doc["subsystems"]] == [name for name, _, _ in SUBSYSTEMS]
    assert {"prepack", "fusion", "vectorization", "linear GELU"} <= {row["name"] for row in doc["subsystems"]}
    assert all(row["result"] == "still fails" for row in doc["subsystems"])
    culprit = doc["culprits"][0]
    assert (culprit["kind"], culprit["fx_node"], culprit["count"], culprit["passes_with"]) == (
        "lowered op", "neg", 1, 0)
    assert "neg" in culprit["kernel"]
    assert doc["graph"]["index"] == 0
    repro = doc["reproduce"]
    assert '"max_lowered_ops": 1' in repro["env"]["TDBG_CONFIG"]
    assert f'"inject_bug": ["neg", "{ {"accuracy": "accuracy", "cpp_build": "compile_error", "crash": "crash"}[stage]}"]' \
        in repro["env"]["TDBG_CONFIG"]
    assert "Verdict:" in r.stdout and "culprit lowered op #0: FX node neg" in r.stdout
    return doc


@pytest.mark.scenario("bisect_foo2_accuracy")
def test_foo2_accuracy_bug_ends_at_neg(scenarios):
    doc = _assert_ends_at_neg(scenarios["bisect_foo2_accuracy"], "accuracy")
    assert doc["culprits"][0]["target"] == "aten.neg.default"
    assert doc["workaround"] == {"fallback_ops": ["aten.neg.default"], "passes": True, "stage": None,
                                 "env": {"TDBG_FALLBACK_OPS": "aten.neg.default"}}
    assert doc["minify_command"] == "tdbg minify examples/foo2.py --after aot --level 4 --backend inductor"
    # --backend replaced the script's own torch.compile default, and bisect says so
    assert doc["replaced"] == ["torch:inductor (torch.compile's default)"]
    assert ("replaced: your script asked for torch:inductor (torch.compile's default); the chain runs up to tdbg's compiler "
            "(inductor) instead (--backend inductor)") in scenarios["bisect_foo2_accuracy"].stdout


@pytest.mark.slow
@pytest.mark.scenario("bisect_foo1_compile_error")
def test_foo1_compile_error_ends_at_neg(scenarios):
    doc = _assert_ends_at_neg(scenarios["bisect_foo1_compile_error"], "cpp_build")
    assert doc["minify_command"] == "tdbg minify examples/foo1.py --after aot --level 2 --backend inductor"


@pytest.mark.slow
@pytest.mark.scenario("bisect_foo2_crash")
def test_foo2_segfault_is_bisected_not_fatal(scenarios):
    doc = _assert_ends_at_neg(scenarios["bisect_foo2_crash"], "crash")
    assert doc["graph"] == {"index": 0, "frame": "foo2", "ops": None, "of": None}
    assert doc["workaround"]["passes"] is True


def test_json_path_that_is_a_directory_fails_before_any_run(tmp_path):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", "bisect", "examples/foo2.py", "--backend",
                           "torch:inductor", "--json", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == exit_code("usage"), proc.stderr
    assert "that is a directory" in proc.stderr and "run uncompiled" not in proc.stderr
