"""The benchmark harness: a wrong backend is reported as a mismatch (never timed), a failing one
as failed, and correct ones get times, ratios and bandwidth figures."""
import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRONG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wrong_backend.py") + ":wrong"
FLAKY = WRONG.replace(":wrong", ":flaky")


def _harness():
    spec = importlib.util.spec_from_file_location("tdbg_bench_harness", os.path.join(ROOT, "benchmarks", "harness.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    payload = _harness().main(["--quick", "--only", "softmax", "--only", "foo1_uint8",
                               "--backends", f"eager,torch:eager,{WRONG},torch:no_such_backend,{FLAKY}",
                               "--json", str(path)])
    return payload, json.loads(path.read_text())


def _cells(doc):
    return {(c["workload"], os.path.basename(c["backend"])): c for c in doc["cells"]}


def test_wrong_backend_is_a_mismatch_not_a_speed(result):
    cells = _cells(result[1])
    for workload in ("softmax", "foo1_uint8"):
        cell = cells[(workload, "wrong_backend.py:wrong")]
        assert cell["status"] == "mismatch"
        assert cell["median_s"] is None and cell["runs_s"] == [] and cell["speedup_vs_eager"] is None
        assert cell["mismatches"][0]["output"] == "out"
    assert cells[("softmax", "wrong_backend.py:wrong")]["mismatches"][0]["max_abs_error"] == pytest.approx(1.0)


def test_failing_backend_is_reported_and_harness_keeps_going(result):
    cells = _cells(result[1])
    for workload in ("softmax", "foo1_uint8"):
        cell = cells[(workload, "torch:no_such_backend")]
        assert cell["status"] == "failed"
        assert "no_such_backend" in cell["error"]
        assert cells[(workload, "torch:eager")]["status"] == "ok"
        flaky = cells[(workload, "wrong_backend.py:flaky")]
        assert flaky["status"] == "failed" and flaky["median_s"] is None
        assert flaky["error"] == "while timing: RuntimeError: kernel fell over on call 3"


def test_correct_backends_get_figures(result):
    doc = result[1]
    assert doc["schema"] == "tdbg.benchmark" and doc["version"] == 1
    assert [c["workload"] for c in doc["cells"]] == ["softmax"] * 5 + ["foo1_uint8"] * 5
    cells = _cells(doc)
    eager, dynamo = cells[("softmax", "eager")], cells[("softmax", "torch:eager")]
    assert len(eager["runs_s"]) == len(dynamo["runs_s"]) == 3
    assert eager["speedup_vs_eager"] == 1.0 and eager["compile_s"] == 0.0
    assert dynamo["speedup_vs_eager"] == pytest.approx(eager["median_s"] / dynamo["median_s"])
    # softmax reads 64x1024 fp32 and writes as much: bandwidth is bytes over the median time
    assert dynamo["gbps"] == pytest.approx(2 * 64 * 1024 * 4 / dynamo["median_s"] / 1e9)
    assert dynamo["bandwidth_fraction"] == pytest.approx(dynamo["gbps"] / doc["bandwidth"]["gbps"])
    assert doc["bandwidth"]["elements"] == 1 << 20 and doc["settings"]["threads"] == 2
    share = dynamo["minor_faults_per_call"] * doc["page_fault"]["seconds_per_fault"] / dynamo["median_s"]
    assert dynamo["fault_share"] == pytest.approx(min(1.0, share))
    assert [s["backend"] for s in doc["startup"]] == ["torch:eager", WRONG, "torch:no_such_backend", FLAKY]
    assert "error" in doc["startup"][2] and "startup_s" in doc["startup"][0]


def test_goal_rows_follow_issue_5():
    h = _harness()
    softmax, mlp = h.BY_NAME["softmax"], h.BY_NAME["mlp"]
    cells = [h.Cell("softmax", "tdbg", time_vs_inductor=0.65, compile_s=0.5, bandwidth_fraction=0.85),
             h.Cell("mlp", "tdbg", status="failed", error="LoweringError: x"),
             h.Cell("reductions", "tdbg", median_s=0.004, time_vs_inductor=2.0, compile_s=0.1,
                    bandwidth_fraction=0.5, minor_faults_per_call=100, fault_share=0.25),
             h.Cell("reductions", "torch:inductor", median_s=0.002, minor_faults_per_call=0, fault_share=0.0)]
    rows = h.goals([softmax, mlp, h.BY_NAME["reductions"]], cells, [{"backend": "tdbg", "startup_s": 2.5}])
    assert [(r["goal"], r["workload"], r["target"], r["measured"], r["met"]) for r in rows] == [
        ("time / inductor", "softmax", 0.7, 0.65, True),
        ("cold compile s", "softmax", 0.3, 0.5, False),
        ("fraction of copy bandwidth", "softmax", 0.8, 0.85, True),
        ("time / inductor", "mlp", 1.0, None, False),
        ("cold compile s", "mlp", 0.3, None, False),
        ("time / inductor", "reductions", 0.7, 2.0, False),
        ("cold compile s", "reductions", 0.3, 0.1, True),
        ("fraction of copy bandwidth", "reductions", 0.8, 0.5, False),
        ("start-up s", "", 2.0, 2.5, False)]
    assert rows[3]["note"] == "failed: LoweringError: x"
    assert rows[5]["note"] == ("4.000 ms vs 2.000 ms; page faults ~25% of the time (100/call); "
                               "inductor's page faults ~0% of the time (0/call)")
    assert rows[7]["note"] == "page faults ~25% of the time (100/call)" and rows[6]["note"] == ""
