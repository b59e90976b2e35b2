"""`tdbg explain --caches` end to end with torch:inductor, in a fresh Inductor cache directory (so
the answer never depends on what an earlier test or session cached): the same script twice hits
both of Inductor's caches on the second run; the script run once more with one Inductor config key
changed, `--against` the first document, misses each cache for exactly that key. Three runs of a
tiny script in all (the first one cold)."""
import json
import os
import subprocess
import sys

import pytest

from tdbg.cli.console import exit_code

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = "tests/scenarios/scripts/caches_config.py"
# three runs with a cold Inductor cache: 40-90 s on the 2-core CI machine, past the default suite's
# budget; tests/minifier/test_caches.py covers the parsing, wording and comparison in the default run
pytestmark = pytest.mark.slow


def explain(tmp, args, json_name):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TDBG_", "TORCHINDUCTOR_"))
           or k == "TDBG_CACHE_DIR"}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"), COLUMNS="200")
    path = tmp / json_name
    cut = args.index("--") if "--" in args else len(args)
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", "explain", *args[:cut], "--json", str(path),
                           *args[cut:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr, json.loads(path.read_text()) if path.exists() else None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("caches")
    same = explain(tmp, ["--caches", "--backend", "torch:inductor", SCRIPT], "same.json")
    changed = explain(tmp, ["--against", str(tmp / "same.json"), "--backend", "torch:inductor", SCRIPT,
                            "--", "--no-size-asserts"], "changed.json")
    return same, changed, tmp


def states(doc):
    return [(g["compile_id"], r["layer"], r["part"], r["state"]) for g in doc["caches"]["graphs"]
            for r in g["lookups"]]


def test_an_unchanged_script_hits_every_cache_on_its_second_run(runs):
    (code, output, doc), _, tmp = runs
    assert code == exit_code("ok"), output
    c = doc["caches"]
    assert c["first_run"]["status"] == "ok" and c["against"] == "the first run of this command"
    assert c["cache_dirs"]["inductor"] == str(tmp / "inductor")
    assert sorted(states(doc)) == [("0/0", "aot_autograd", None, "hit"),
                                   ("0/0", "inductor_fx_graph", "backward", "hit"),
                                   ("0/0", "inductor_fx_graph", "forward", "hit")]
    assert c["totals"] == {"inductor_fx_graph": {"hit": 2, "miss": 0, "bypass": 0},
                           "aot_autograd": {"hit": 1, "miss": 0, "bypass": 0}}
    assert "Inductor FX graph cache: 2 hit; AOTAutograd cache: 1 hit" in output
    assert all(r["differences"] == [] and r["why"] is None for g in c["graphs"] for r in g["lookups"])
    # every lookup's key components are kept for a later --against (Inductor's and AOTAutograd's)
    assert all(any(n == "inductor_config[size_asserts]" for n, _, _ in e["components"]) for e in c["lookups"])


def test_a_changed_config_key_is_named_as_the_only_difference(runs):
    _, (code, output, doc), tmp = runs
    assert code == exit_code("ok"), output
    c = doc["caches"]
    assert c["first_run"] is None and c["against"] == str(tmp / "same.json")
    assert sorted(states(doc)) == [("0/0", "aot_autograd", None, "miss"),
                                   ("0/0", "inductor_fx_graph", "backward", "miss"),
                                   ("0/0", "inductor_fx_graph", "forward", "miss")]
    for g in c["graphs"]:
        for r in g["lookups"]:
            assert r["compared_with"] == "0/0"
            assert [(d["component"], d["kind"], d["before"], d["after"]) for d in r["differences"]] == [
                ("inductor_config[size_asserts]", "config", "True", "False")], r
            assert r["why"] == "torch._inductor.config.size_asserts changed True -> False"
    assert output.count("why: torch._inductor.config.size_asserts changed True -> False (vs 0/0)") == 3, output
