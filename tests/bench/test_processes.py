"""benchmarks/processes.py: models.py in fresh processes, merged per cell."""
import importlib.util
import json
import os
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _processes():
    spec = importlib.util.spec_from_file_location("tdbg_bench_processes", os.path.join(ROOT, "benchmarks", "processes.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _cell(model, backend, median, ratio, status="ok"):
    return dict(model=model, mode="inference", backend=backend, status=status, error=None if status == "ok" else "x",
                median_s=median, min_s=median, speedup_vs_eager=1.0, time_vs_inductor=ratio, compile_s=1.0,
                first_call_s=2.0, runs_s=[median], noisy=None)


def _payload(tdbg_a, ind_a, tdbg_b, ind_b, b_status="ok"):
    cells = [_cell("a", "torch:inductor", ind_a, 1.0), _cell("a", "tdbg", tdbg_a, tdbg_a / ind_a),
             _cell("b", "torch:inductor", ind_b, 1.0), _cell("b", "tdbg", tdbg_b, tdbg_b / ind_b, b_status)]
    return dict(machine=dict(date="2026-11-27 11:00 UTC", cpu="cpu", cores=2, torch="2.13.0"),
                settings=dict(threads=2, repeat=10), backends=["torch:inductor", "tdbg"], modes=["inference"], shapes={},
                startup=[], cells=cells, summary={})


def test_merge_takes_each_cells_median_and_the_median_of_the_processes_own_ratios():
    p = _processes()
    payloads = [_payload(9.0, 10.0, 12.0, 10.0), _payload(8.0, 8.0, 11.0, 10.0), _payload(9.5, 10.0, 10.0, 10.0)]
    merged = p.merge(payloads)
    cells = {(c["model"], c["backend"]): c for c in merged["cells"]}
    # a: ratios 0.9, 1.0, 0.95 -> 0.95, though the medians' ratio is 9.0 / 10.0
    assert cells[("a", "tdbg")]["time_vs_inductor"] == pytest.approx(0.95)
    assert cells[("a", "tdbg")]["median_s"] == 9.0 and cells[("a", "torch:inductor")]["median_s"] == 10.0
    assert cells[("a", "tdbg")]["process_ratios"] == pytest.approx([0.9, 1.0, 0.95])
    assert cells[("a", "tdbg")]["runs_s"] == [9.0, 8.0, 9.5]
    assert merged["processes"] == 3 and len(merged["process_summaries"]) == 3
    s = merged["summary"]["inference"]
    assert s["median_vs_inductor"] == pytest.approx((0.95 + 1.1) / 2)
    assert s["worst"] == {"model": "b", "time_vs_inductor": pytest.approx(1.1)}
    assert p.spread_lines(merged) == [
        "a inference: tdbg/inductor 0.95x, processes 0.90-1.00x (0.900, 1.000, 0.950)",
        "b inference: tdbg/inductor 1.10x, processes 1.00-1.20x (1.200, 1.100, 1.000)"]


def test_a_cell_failed_in_any_process_is_failed():
    p = _processes()
    merged = p.merge([_payload(9.0, 10.0, 12.0, 10.0), _payload(9.0, 10.0, 12.0, 10.0, b_status="mismatch")])
    [b] = [c for c in merged["cells"] if (c["model"], c["backend"]) == ("b", "tdbg")]
    assert b["status"] == "mismatch" and b["process_ratios"] == pytest.approx([1.2, 1.2])
    assert merged["summary"]["inference"]["not_ok"] == {"b": "mismatch: x"}


def test_each_process_is_models_py_with_its_own_json(tmp_path, capsys):
    p = _processes()
    calls = []

    def fake_run(cmd, stdout=None):
        assert stdout is not None    # the processes' own tables are not shown
        calls.append(cmd)
        payload = _payload(9.0 + len(calls), 10.0, 12.0, 10.0)
        with open(cmd[-1], "w") as f:
            json.dump(dict(schema="tdbg.models", version=1, **payload), f)
        return types.SimpleNamespace(returncode=0)
    out = tmp_path / "merged.json"
    merged = p.main(["-n", "2", "--json", str(out), "--", "--only", "electra", "--modes", "inference"], run=fake_run)
    assert [c[1:-2] for c in calls] == [[os.path.join(ROOT, "benchmarks", "models.py"), "--only", "electra",
                                         "--modes", "inference"]] * 2
    assert all(c[-2] == "--json" for c in calls) and calls[0][-1] != calls[1][-1]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "tdbg.models.processes" and doc["processes"] == 2
    assert [c for c in doc["cells"] if c["backend"] == "tdbg"][0]["process_ratios"] == pytest.approx([1.0, 1.1])
    assert "a inference: tdbg/inductor 1.05x, processes 1.00-1.10x" in capsys.readouterr().out
    assert merged["cells"][1]["median_s"] == pytest.approx(10.5)


@pytest.mark.parametrize("argv, message", [
    (["-n", "1", "--", "--only", "electra"], "-n must be at least 2"),
    (["--", "--only", "electra", "--json", "x.json"], "give --json before `--`"),
])
def test_bad_arguments_are_one_usage_error(argv, message, capsys):
    p = _processes()
    with pytest.raises(SystemExit) as e:
        p.main(argv, run=lambda cmd, **kw: pytest.fail("nothing may run"))
    assert e.value.code == 2 and message in capsys.readouterr().err
