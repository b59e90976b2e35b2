"""`tdbg diff DIR_A DIR_B` over two --save-io folders."""
import shutil

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.minifier.artifacts.saved_io import Writer
from tdbg.minifier.diagnose.diff import diff_saved

from saveio_runs import saved_runs, tdbg  # noqa: F401 - saved_runs is a fixture


def test_injected_bug_changes_exactly_the_graph_that_computes_it(saved_runs, tmp_path):
    (_, healthy), (ran_b, injected) = saved_runs("healthy"), saved_runs("injected")
    assert ran_b.code == 0, ran_b.output    # the run itself checks nothing: only diff sees the bug
    ran = tdbg(["diff", healthy, injected], json_path=tmp_path / "d.json")
    assert ran.code == 22, ran.output
    rows = {g["name"]: g for g in ran.json["graphs"]}
    assert {n: g["status"] for n, g in rows.items()} == {"g0_forward_c1": "changed", "g1_backward_c1": "same"}
    fwd, bwd = rows["g0_forward_c1"], rows["g1_backward_c1"]
    assert fwd["inputs_match"] is True and fwd["ops_added"] == {} and fwd["ops_removed"] == {}
    assert fwd["a_vs_eager"] == [] and fwd["a_vs_b"] and fwd["b_vs_eager"]
    # out[9] is the sigmoid the forward hands to the backward
    assert "out[9]" in {m["output"] for m in fwd["a_vs_b"]}
    assert bwd["inputs_match"] is False and bwd["a_vs_b"] is None and bwd["b_vs_eager"] == []
    assert "2 graph(s): 1 changed" in ran.stdout and "no timings saved in both folders (a only)" in ran.stdout


def test_same_folder_twice_is_unchanged_with_timings(saved_runs, tmp_path):
    _, healthy = saved_runs("healthy")
    copy = tmp_path / "copy"
    shutil.copytree(healthy, copy)
    result = diff_saved(healthy, str(copy))
    assert not result.changed and result.timings == "both"
    assert [g.status for g in result.graphs] == ["same", "same"]
    assert all(g.timing["ratio"] == 1.0 and not g.timing["slower"] for g in result.graphs)
    kernels = [k for g in result.graphs for k in g.timing["kernels"]]
    assert len(kernels) >= 4 and all(k["ratio"] == 1.0 and not k["slower"] for k in kernels)


def _save(folder, fn, compiled_offset=0.0):
    x, w = torch.ones(4, 3), torch.full((3, 5), 0.5)
    gm = make_fx(fn)(x, w)
    writer = Writer(str(folder), {"backend": "inductor", "script": "s.py", "after": "aot"})
    expected = list(gm(x, w))
    writer.add(kind="forward", graph=0, call=1, gm=gm, inputs=[x, w], expected=expected,
               compiled=[e + compiled_offset for e in expected], compiled_error=None, node_sources={},
               replay={}, signature="sig")


def test_structure_change_lists_the_ops_added_and_removed(tmp_path):
    _save(tmp_path / "a", lambda x, w: (torch.relu(x @ w),))
    _save(tmp_path / "b", lambda x, w: (torch.sigmoid(x @ w) * 2,))
    (g,) = diff_saved(str(tmp_path / "a"), str(tmp_path / "b")).graphs
    assert g.status == "changed" and g.reasons[0].startswith("structure changed")
    assert g.ops_added == {"aten.mul.Tensor": 1, "aten.sigmoid.default": 1}
    assert g.ops_removed == {"aten.relu.default": 1}


def test_output_change_within_tolerance_is_not_a_change(tmp_path):
    fn = lambda x, w: (x @ w,)  # noqa: E731
    _save(tmp_path / "a", fn)
    _save(tmp_path / "b", fn, compiled_offset=1e-7)     # far below float32's atol (1e-5)
    _save(tmp_path / "c", fn, compiled_offset=1e-2)
    assert not diff_saved(str(tmp_path / "a"), str(tmp_path / "b")).changed
    (g,) = diff_saved(str(tmp_path / "a"), str(tmp_path / "c")).graphs
    assert g.status == "changed" and [m["output"] for m in g.a_vs_b] == ["out[0]"]


def test_missing_folder_is_bad_input(tmp_path):
    ran = tdbg(["diff", tmp_path / "nope", tmp_path / "nope2"])
    assert ran.code == 3 and "is not a folder" in ran.stderr
