"""`tdbg bisect --backend NAME` on real failures: a user backend (chain eager -> it) and the real
Inductor's uint8 amin bug (chain up to torch:inductor, then torch's compiler bisector down to the
lowering of the amin node). Each scenario runs once; the Inductor one is long (marked slow)."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

from tdbg.cli.console import exit_code

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
S = "tests/scenarios/scripts"
USER = f"{S}/user_backends.py:wrong_below_minus_one"


def run_tdbg(args):
    """(exit code, stdout + stderr, JSON document or None) of the real CLI."""
    with tempfile.TemporaryDirectory(prefix="tdbg-scenario-") as tmp:
        path = os.path.join(tmp, "out.json")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TDBG_", "TORCH_BISECT_"))
               or k == "TDBG_CACHE_DIR"}
        proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", *args, "--json", path], cwd=ROOT,
                              env=dict(env, COLUMNS="200"), capture_output=True, text=True, timeout=1800)
        doc = json.load(open(path)) if os.path.exists(path) else None
    return proc.returncode, proc.stdout + proc.stderr, doc


@pytest.fixture(scope="module")
def user_backend():
    return run_tdbg(["bisect", f"{S}/third_call.py", "--backend", USER])


def test_user_backend_chain_is_eager_then_the_backend(user_backend):
    code, output, doc = user_backend
    assert code == exit_code("accuracy"), output
    assert doc["chain"] == ["eager", USER]
    assert [(b["backend"], b["status"]) for b in doc["backends"]] == [("eager", "ok"), (USER, "failed")]
    assert doc["first_failing_backend"] == USER and doc["verdict"]["level"] == "backend"
    assert doc["verdict"]["summary"].startswith(f"backend {USER} fails (accuracy) while eager passes")
    assert doc["subsystems"] == [] and doc["culprits"] == []
    assert doc["reproduce"]["argv"] == ["tdbg", "run", f"{S}/third_call.py", "--backend", USER, "--check-accuracy"]
    assert doc["minify_command"] == f"tdbg minify {S}/third_call.py --after dynamo --level 4 --backend {USER}"
    assert "every backend" not in output


def test_unknown_backend_is_refused_with_a_json_document():
    code, output, doc = run_tdbg(["bisect", f"{S}/third_call.py", "--backend", "no_colon"])
    assert code == exit_code("bad_input"), output
    assert doc["verdict"]["level"] == "bad_input" and "unknown backend 'no_colon'" in doc["verdict"]["summary"]
    assert doc["runs"] == []


@pytest.mark.slow
def test_real_inductor_amin_bug_reaches_the_amin_lowering():
    code, output, doc = run_tdbg(["bisect", f"{S}/amin_uint8.py", "--backend", "torch:inductor"])
    assert code == exit_code("accuracy"), output
    assert [(b["backend"], b["status"]) for b in doc["backends"]] == [
        ("eager", "ok"), ("torch:aot_eager", "ok"), ("torch:aot_eager_decomp_partition", "ok"),
        ("torch:inductor", "failed")]
    rows = {r["name"]: r["result"] for r in doc["subsystems"]}
    assert rows["lowerings"] == "passes"
    assert {rows[n] for n in ("pre_grad_passes", "joint_graph_passes", "post_grad_passes")} == {"still fails"}
    (culprit,) = doc["culprits"]
    # which amin is wrong depends on the CPU's vector width (see the script): amin(x) is lowered
    # first (#0, node amin), amin(neg(x)) last (#2 of 3, node amin_1)
    assert (culprit["subsystem"], culprit["of"], culprit["target"]) == ("lowerings", 3, "aten.amin.default")
    assert (culprit["index"], culprit["applied"]) in ((0, "amin"), (2, "amin_1"))
    assert culprit["kernels"] and all("amin" in k.split("_") for k in culprit["kernels"])
    assert doc["reproduce"]["env"]["TORCH_BISECT_SUBSYSTEM"] == "lowerings"
    assert doc["reproduce"]["env"]["TORCH_BISECT_MAX"] == str(culprit["index"])
    assert doc["reproduce"]["checked"] == "fails the same way"
    assert f"the lowering of FX node {culprit['applied']} (aten.amin.default)" in doc["verdict"]["summary"]
