"""`tdbg explain` on real scripts: recompiles counted under the real backend (torch:inductor adds a
guard of its own), a NumPy .item() break in the right words, the break that stopped a fullgraph=True
run, and a JSON document on every path. Each scenario runs once, all at the same time."""
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tdbg.cli.console import exit_code
from test_bisect_backend import ROOT, run_tdbg

S = "tests/scenarios/scripts"
SCENARIOS = {
    "recompiles": ["explain", f"{S}/inductor_recompiles.py", "--max-recompiles", "1"],   # torch:inductor
    "fullgraph": ["explain", f"{S}/fullgraph_break.py", "--backend", "eager"],
    "numpy_item": ["explain", f"{S}/numpy_item_break.py", "--backend", "eager"],
    "missing": ["explain", f"{S}/no_such_script.py"],
}


@pytest.fixture(scope="module")
def runs():
    with ThreadPoolExecutor(max_workers=len(SCENARIOS)) as pool:
        futures = {name: pool.submit(run_tdbg, args) for name, args in SCENARIOS.items()}
        yield {name: f.result() for name, f in futures.items()}


def test_recompiles_are_the_real_backends(runs):
    code, output, doc = runs["recompiles"]
    # Dynamo alone (backend eager) recompiles once here: only torch:inductor's run exceeds 1
    assert code == exit_code("threshold"), output
    assert doc["backend"] == "own" and doc["exceeded"] == ["2 recompile(s) > --max-recompiles 1"]
    assert doc["compile_backends"]["names"] == ["torch:inductor"]     # the script's own: torch.compile's default
    assert "under torch:inductor (the script's own)" in output
    (fn,) = doc["functions"]
    assert [r["changed"] for r in fn["recompiles"]] == [
        "argument `x` changed size in dim 0: 2 -> 3",
        "argument `x` left the size range 2..4096 in dim 0 that the compiled graph assumed"]
    assert fn["recompiles"][1]["also"] == ["argument `x` changed size in dim 0: 2 -> 5000"]
    # explain's shapes: the range guard is the backend's (no user line), never put on a line of the script
    size = fn["recompiles"][1]["size"]
    assert (size["failed_guard"], size["kind"], size["created_at"]) == ("2 <= x.size()[0] <= 4096", "backend", None)
    assert fn["guards"]["tensors"] == ["self.fc.weight", "self.fc.bias", "x"]
    assert "tensors checked: self.fc.weight, self.fc.bias, x" in output


def test_numpy_item_break_reads_a_value_into_python(runs):
    code, output, doc = runs["numpy_item"]
    assert code == 0, output
    (fn,) = doc["functions"]
    (b,) = fn["breaks"]
    assert b["line"] == f"{S}/numpy_item_break.py:7  cut = np.quantile(x.numpy(), 0.9).item()"
    assert b["reason"].startswith("reads a tensor value into a Python number")
    assert "output shape" not in output


def test_fullgraph_run_reports_the_break_that_stopped_it(runs):
    code, output, doc = runs["fullgraph"]
    assert code == exit_code("dynamo"), output
    assert doc["stopped_by"]["line"] == f"{S}/fullgraph_break.py:7  if y.sum() > 0:"
    assert doc["stopped_by"]["reason"].startswith("data-dependent branch on a tensor value")
    assert doc["totals"]["graph_breaks"] == 1 and doc["functions"][0]["function"] == "f"
    assert "with fullgraph=True a graph break is an error" in output


def test_bad_input_still_writes_the_json_document(runs):
    code, output, doc = runs["missing"]
    assert code == exit_code("bad_input"), output
    assert (doc["schema"], doc["exit_code"], doc["stage"]) == ("tdbg.explain", 3, "bad_input")
    assert "does not exist" in doc["error"]["message"] and "does not exist" in output


def test_unwritable_json_path_fails_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", "explain", f"{S}/fullgraph_break.py",
                           "--json", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == exit_code("usage") and "that is a directory" in proc.stderr
