"""`tdbg run --check-determinism` beyond a graph's first call: a graph compiled for dynamic sizes
whose reduction turns parallel (nondeterministic) only above a grain size is caught at the call
with the new input shape (it was OK: only call 1 was checked), and the OK line says at which calls
it checked."""
import json
import os

from click.testing import CliRunner

from tdbg.cli.console import exit_code
from tdbg.cli.main import cli
from tdbg.cli.determinism_view import ok_text

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "determinism_grain.py")


def test_a_later_call_with_new_shapes_is_checked_and_named(tmp_path):
    out = tmp_path / "run.json"
    r = CliRunner().invoke(cli, ["run", SCRIPT, "--backend", f"{SCRIPT}:grain_sum", "--check-determinism",
                                 "--no-check-accuracy", "--json", str(out)])
    assert r.exit_code == exit_code("nondeterministic") == 24, r.output
    v = json.loads(out.read_text())["verdict"]
    [g] = v["graphs"]
    assert g["determinism_calls"] == [1, 2]
    d = g["determinism"]
    assert (v["error"]["graph"], v["error"]["call"], d["call"], d["verdict"]) == (0, 2, 2, "backend")
    assert [x["path"] for x in d["compiled"]] == ["out[0]"] and d["compiled"][0]["elements"] == 1
    assert d["first_node"]["source"].endswith("determinism_grain.py:35 in f: return h.sum()")


def test_the_ok_line_says_which_calls_were_checked():
    verdict = {"check_determinism": True, "graphs": [
        {"index": 0, "determinism_calls": [1, 3], "determinism": {"verdict": "deterministic", "grads_checked": True}},
        {"index": 1, "determinism": {"verdict": "deterministic"}}]}
    assert ok_text(verdict) == ("; determinism checked on 2 of 2 graph(s) at 3 call(s) (each graph's first call "
                                "and each call with new input shapes): the same bits on two compiled runs "
                                "(gradients on 1)")
