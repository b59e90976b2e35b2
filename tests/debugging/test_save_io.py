"""`tdbg run --save-io DIR`: the saved folder (minifier/artifacts/saved_io.py) end to end, and its
reader's guarantees: relocatable, every tensor file verified, nothing overwritten."""
import json
import os
import shutil

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.minifier.artifacts.saved_io import FORMAT, SavedIOError, Writer, load_graph, load_saved
from tdbg.minifier.diagnose import timing as timing_rules
from tdbg.minifier.runs.instrument import IOSaver

from saveio_runs import DEEP_MLP, saved_runs, tdbg  # noqa: F401 - saved_runs is a fixture


def _small_folder(path):
    def f(x, w):
        return torch.relu(x @ w).sum(1), x.sin()
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    gm = make_fx(f)(x, w)
    writer = Writer(str(path), {"backend": "inductor", "script": "s.py", "after": "aot"})
    expected = list(gm(x, w))
    name = writer.add(kind="forward", graph=0, call=1, gm=gm, inputs=[x, w], expected=expected,
                      compiled=[e + 1 for e in expected], compiled_error=None, node_sources={"mm": "s.py:2 in f: x @ w"},
                      replay={}, signature="sig")
    return name, (x, w), expected


def test_healthy_run_saves_forward_and_backward_aten_graphs(saved_runs):
    ran, folder = saved_runs("healthy")
    assert ran.code == 0, ran.output
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    assert manifest["format"] == FORMAT and manifest["after"] == "aot" and manifest["backend"] == "inductor"
    assert manifest["torch"] == torch.__version__ and manifest["script"] == DEEP_MLP
    assert [(g["name"], g["kind"], g["graph"], g["call"]) for g in manifest["graphs"]] == [
        ("g0_forward_c1", "forward", 0, 1), ("g1_backward_c1", "backward", 1, 1)]
    assert manifest["skipped"] == [] and manifest["timings"] is True
    assert ran.json["verdict"]["save_io"]["graphs"] == ["g0_forward_c1", "g1_backward_c1"]
    assert "saved io: 2 graph call(s)" in ran.stdout


def test_saved_graphs_load_with_sources_inputs_and_both_outputs(saved_runs):
    _, folder = saved_runs("healthy")
    run = load_saved(folder)
    fwd, bwd = run.graphs
    ops = {str(n.target) for n in fwd.gm.graph.nodes if n.op == "call_function"}
    assert {"aten.sigmoid.default", "aten.tanh.default", "aten.erf.default", "aten.addmm.default"} <= ops
    assert len(fwd.gm.graph.nodes) >= 40 and len(fwd.inputs) == 10 and len(fwd.expected) == len(fwd.compiled)
    assert fwd.replay_spec["aot"] == {"family": "tdbg", "graph": "forward"}
    assert bwd.replay_spec["aot"] == {"family": "tdbg", "graph": "backward"}
    assert fwd.node_sources["sigmoid"].endswith("deep_mlp.py:23 in forward: gate = torch.sigmoid(self.fc2(h))")
    # eager outputs re-run on the loaded graph are bit-identical to the saved ones
    with torch.no_grad():
        again = fwd.gm(*fwd.inputs)
    assert all(torch.equal(a, e) for a, e in zip(again, fwd.expected))
    # timed after warm-up (diagnose/timing.measure), to a budget, and judged NOISY or not
    timing = fwd.meta["timing"]
    assert timing["samples"] == len(timing["times_s"]) >= timing_rules.MIN_SAMPLES
    assert timing["warmup_calls"] >= timing_rules.WARMUP_MIN_CALLS + timing_rules.WARMUP_WINDOW - 1
    assert 0 < timing["min_s"] <= timing["q1_s"] <= timing["median_s"] <= timing["q3_s"]
    assert timing["noisy"] == timing_rules.noisy_reason(timing["times_s"], timing["busy_share"])
    # tdbg's kernels are timed one by one too, under the names its wrapper gives them
    kernels = timing["per_kernel"]
    assert any(k.startswith("cpp_fused_") and "sigmoid" in k for k in kernels)
    assert all(v["samples"] == IOSaver.KERNEL_REPEATS and v["median_s"] > 0 for v in kernels.values())


def test_saved_folder_is_relocatable(saved_runs, tmp_path):
    _, folder = saved_runs("healthy")
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(folder, moved)
    a, b = load_graph(os.path.join(folder, "g1_backward_c1")), load_graph(str(moved), "g1_backward_c1")
    assert a.source == b.source and a.meta["inputs"] == b.meta["inputs"]
    assert all(torch.equal(x, y) for x, y in zip(a.inputs, b.inputs))
    assert not any(str(folder) in line for line in open(moved / "g1_backward_c1" / "meta.json"))


def test_backend_without_aot_stage_saves_dynamo_graph_and_says_backward_is_not_saved(saved_runs):
    ran, folder = saved_runs("eager")
    assert ran.code == 0, ran.output
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    assert manifest["after"] == "dynamo"
    assert [(g["name"], g["kind"]) for g in manifest["graphs"]] == [("g0_dynamo_c1", "dynamo")]
    assert "backward graphs were not saved: backend eager has no AOT stage" in ran.stdout
    graph = load_graph(folder, "g0_dynamo_c1")
    assert graph.compiled is not None and all(torch.equal(a, e) for a, e in zip(graph.compiled, graph.expected))


def test_each_new_input_signature_is_saved_once(saved_runs):
    ran, folder = saved_runs("two_shapes")
    assert ran.code == 0, ran.output
    run = load_saved(folder)
    # calls: rows 4 (saved), rows 6 (new signature: saved), rows 4 again (seen: not saved)
    assert [(g.name, g.meta["call"]) for g in run.graphs] == [("g0_inference_c1", 1), ("g0_inference_c2", 2)]
    rows = [[v for v in g.inputs if isinstance(v, torch.Tensor) and v.dim() == 2 and v.shape[1] == 3][0].shape[0]
            for g in run.graphs]
    assert rows == [4, 6]
    assert run.graphs[0].replay_spec["aot"] == {"family": "aot_autograd", "graph": "inference"}


def test_nonempty_folder_is_refused_before_work_and_left_alone(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    ran = tdbg(["run", DEEP_MLP, "--backend", "inductor", "--save-io", folder])
    assert ran.code == 2
    assert "--save-io" in ran.stderr and "not empty" in ran.stderr and "deep_mlp loss" not in ran.output
    assert os.listdir(folder) == ["notes.txt"] and (folder / "notes.txt").read_text() == "keep me"


def test_profile_without_save_io_is_a_usage_error():
    ran = tdbg(["run", DEEP_MLP, "--backend", "inductor", "--profile"])
    assert ran.code == 2 and "--profile times the graphs --save-io saves" in ran.stderr


def test_writer_round_trip_keeps_names_values_and_gives_fresh_inputs(tmp_path):
    name, (x, w), expected = _small_folder(tmp_path / "io")
    graph = load_graph(str(tmp_path / "io" / name))
    assert [n.name for n in graph.gm.graph.nodes if n.op == "call_function"] == ["mm", "relu", "sum_1", "sin"]
    assert graph.node_sources == {"mm": "s.py:2 in f: x @ w"}
    first = graph.inputs
    first[0].add_(100)       # a run that edits its inputs must not change the next run's
    assert torch.equal(graph.inputs[0], x) and torch.equal(graph.inputs[1], w)
    assert all(torch.equal(c, e + 1) for c, e in zip(graph.compiled, expected))


@pytest.mark.parametrize("damage", ["changed", "missing"])
def test_a_changed_or_missing_tensor_file_is_a_saved_io_error_naming_it(tmp_path, damage):
    name, _, _ = _small_folder(tmp_path / "io")
    tensors = tmp_path / "io" / name / "tensors"
    victim = sorted(tensors.iterdir())[0]
    if damage == "changed":
        data = bytearray(victim.read_bytes())
        data[0] ^= 1
        victim.write_bytes(bytes(data))
    else:
        victim.unlink()
    with pytest.raises(SavedIOError) as info:
        load_saved(str(tmp_path / "io"))
    assert victim.name in str(info.value)
    assert ("does not match its SHA-256" if damage == "changed" else "cannot be read") in str(info.value)
    assert info.value.stage == "bad_input"


def test_not_a_saved_folder_is_a_saved_io_error(tmp_path):
    with pytest.raises(SavedIOError, match="manifest.json is missing"):
        load_saved(str(tmp_path))
