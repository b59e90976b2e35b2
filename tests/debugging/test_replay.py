"""`tdbg replay DIR/GRAPH`: one saved graph rerun alone, judged against its saved eager outputs."""
import os
import shutil

import pytest
import torch

from tdbg.minifier.artifacts.saved_io import SavedIOError, load_graph
from tdbg.minifier.diagnose.accuracy import TOLERANCES
from tdbg.minifier.diagnose.replay import replay

from saveio_runs import INJECTED, saved_runs, tdbg  # noqa: F401 - saved_runs is a fixture


def test_eager_replay_of_every_saved_graph_is_bit_identical(saved_runs, tmp_path):
    _, folder = saved_runs("healthy")
    ran = tdbg(["replay", folder, "--backend", "eager"], json_path=tmp_path / "r.json")
    assert ran.code == 0, ran.output
    graphs = ran.json["graphs"]
    assert [(g["graph"], g["status"], g["max_abs_error"]) for g in graphs] == [
        ("g0_forward_c1", "ok", 0.0), ("g1_backward_c1", "ok", 0.0)]
    assert "max abs error 0 (bit-identical)" in ran.stdout and "2 graph(s) replayed: 2 OK, 0 failed" in ran.stdout


def test_replay_with_the_recorded_backend_passes_within_float32_tolerance(saved_runs):
    _, folder = saved_runs("healthy")
    result = replay(load_graph(folder, "g0_forward_c1"))
    assert (result.backend, result.status, result.outputs) == ("inductor", "ok", 13)
    # outputs are O(1): a correct float32 compile stays well inside the float32 tolerance
    assert result.max_abs_error < 10 * TOLERANCES[torch.float32][1]


def test_replay_under_injected_bug_fails_like_tdbg_run_naming_the_node_and_line(saved_runs, tmp_path):
    _, folder = saved_runs("healthy")
    ran = tdbg(["replay", os.path.join(folder, "g0_forward_c1")], INJECTED, json_path=tmp_path / "r.json")
    assert ran.code == 16, ran.output
    (doc,) = ran.json["graphs"]
    assert doc["stage"] == "accuracy" and doc["status"] == "failed"
    assert "sigmoid" in doc["error"]["fx_node"].split(", ")
    assert "FAILED g0_forward_c1 (forward): a compiled graph's results differ from eager (stage accuracy, exit code 16)" \
        in ran.stdout


def test_injected_bug_in_a_forward_op_leaves_the_backward_replay_clean(saved_runs, monkeypatch):
    _, folder = saved_runs("healthy")
    monkeypatch.setenv(*next(iter(INJECTED.items())))
    assert replay(load_graph(folder, "g1_backward_c1")).status == "ok"    # no sigmoid in the backward
    assert replay(load_graph(folder, "g0_forward_c1")).stage == "accuracy"


def test_tampered_tensor_file_is_bad_input_never_a_verdict(saved_runs, tmp_path):
    _, folder = saved_runs("healthy")
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    victim = sorted((copy / "g0_forward_c1" / "tensors").iterdir())[3]
    victim.write_bytes(victim.read_bytes()[:-4] + b"\0\0\0\0")
    ran = tdbg(["replay", copy / "g0_forward_c1", "--backend", "eager"], json_path=tmp_path / "r.json")
    assert ran.code == 3, ran.output
    assert victim.name in ran.stderr and "does not match its SHA-256 name" in ran.stderr
    assert ran.json["status"] == "error" and ran.json["cause"] == "bad_input" and "OK" not in ran.stdout


def test_library_replay_eager_and_aot_eager(saved_runs):
    _, folder = saved_runs("healthy")
    graph = load_graph(folder, "g1_backward_c1")
    eager = replay(graph, "eager")
    assert (eager.status, eager.max_abs_error, eager.outputs) == ("ok", 0.0, len(graph.expected))
    aot = replay(graph, "aot_eager")
    assert aot.status == "ok" and aot.max_abs_error <= TOLERANCES[torch.float32][1]


def test_unknown_graph_name_is_bad_input(saved_runs):
    _, folder = saved_runs("healthy")
    with pytest.raises(SavedIOError, match="meta.json is missing"):
        load_graph(folder, "g9_forward_c1")


def test_replay_uses_the_recorded_config_so_an_injected_run_replays_its_bug(saved_runs):
    _, folder = saved_runs("injected")     # saved under TDBG_INJECT_BUG; this process has none
    result = replay(load_graph(folder, "g0_forward_c1"))
    # a run that saves eager outputs draws eager's random numbers (fallback_random), and replays so
    assert result.stage == "accuracy" and result.config == {"inject_bug": ["sigmoid", "accuracy"],
                                                           "fallback_random": True}
    assert replay(load_graph(folder, "g0_forward_c1"), "eager").max_abs_error == 0.0


def test_a_kernel_that_fails_while_running_is_its_stage_with_kernel_node_and_line(saved_runs, monkeypatch):
    _, folder = saved_runs("healthy")
    monkeypatch.setenv("TDBG_INJECT_BUG", "sigmoid:runtime_error")
    result = replay(load_graph(folder, "g0_forward_c1"))
    assert (result.status, result.stage) == ("failed", "kernel_runtime")
    assert result.error["fx_node"] == "sigmoid" and "sigmoid" in result.error["kernel"]
    assert result.error["source"].endswith("deep_mlp.py:23 in forward: gate = torch.sigmoid(self.fc2(h))")


def test_random_ops_replay_their_saved_draws_and_never_pass_by_a_float64_reference(tmp_path):
    from tdbg.minifier.artifacts.saved_io import Writer

    def f(x):
        return (torch.nn.functional.dropout(x.sin(), 0.5, training=True) * 2,)
    x = torch.randn(6, 5)
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(f)(x)
    rng = torch.get_rng_state()
    expected = list(gm(x))
    writer = Writer(str(tmp_path / "io"), {"backend": "eager", "script": "s.py", "after": "dynamo", "threads": 1})
    writer.add(kind="dynamo", graph=0, call=1, gm=gm, inputs=[x], expected=expected, compiled=expected,
               compiled_error=None, node_sources={}, replay={}, signature="s", rng_state=rng)
    graph = load_graph(str(tmp_path / "io"), "g0_dynamo_c1")
    torch.manual_seed(123)     # the replay starts from the saved state, not from this one
    assert replay(graph, "eager").max_abs_error == 0.0
    # other draws (what a compiler's own random stream gives) fail, and the message says why
    graph.rng_state = None
    result = replay(graph, "eager")
    assert result.stage == "accuracy" and "the graph draws random numbers (aten.bernoulli_" in result.error["message"]


def _running_stat(x, s):
    torch.ops.aten.copy_.default(s, s * 0.9 + x.mean(0) * 0.1)   # an aten graph's in-place update
    return (x * 2,)


def drops_copies(gm, example_inputs):
    """A backend that forgets the graph's in-place copies into its inputs (outputs still right)."""
    graph, env = torch.fx.Graph(), {}
    for n in gm.graph.nodes:
        if n.target is not torch.ops.aten.copy_.default:
            env[n] = graph.node_copy(n, lambda a: env[a])
    return torch.fx.GraphModule(gm, graph).forward


def test_inputs_changed_in_place_are_saved_replayed_and_diffed(tmp_path):
    """A saved call records the inputs it changed in place (eager's and the compiled values after
    it); replay compares them like outputs, so a backend that drops the update fails where the
    outputs alone matched, and diff sees a run whose compiled call dropped it."""
    import json

    from torch.fx.experimental.proxy_tensor import make_fx

    from tdbg.minifier.artifacts.saved_io import Writer
    from tdbg.minifier.diagnose.diff import diff_graph
    from tdbg.minifier.runs.instrument import _in_place
    x, s = torch.randn(6, 3), torch.randn(3)
    gm = make_fx(_running_stat)(x, s.clone())
    before, eager_in, args = [x, s], [x.clone(), s.clone()], [x.clone(), s.clone()]
    expected = list(gm(*eager_in))
    compiled = list(gm(*args))
    in_place = _in_place(before, eager_in, args)
    assert [i for i, _, _ in in_place] == [1]
    for folder, dropped in (("a", False), ("b", True)):
        writer = Writer(str(tmp_path / folder), {"backend": "eager", "script": "s.py", "after": "aot", "threads": 1})
        writer.add(kind="inference", graph=0, call=1, gm=gm, inputs=before, expected=expected, compiled=compiled,
                   compiled_error=None, node_sources={}, replay={}, signature="s",
                   in_place=[(1, in_place[0][1], s if dropped else in_place[0][2])])
    graph = load_graph(str(tmp_path / "a"), "g0_inference_c1")
    ok = replay(graph, "eager")
    assert (ok.status, ok.outputs, ok.in_place) == ("ok", 1, 1)
    bad = replay(graph, f"{os.path.abspath(__file__)}:drops_copies")
    assert (bad.status, [m["output"] for m in bad.mismatches]) == ("failed", ["s_1 (changed in place)"])
    assert "inputs it changes in place differ from the saved eager values" in bad.error["message"]
    d = diff_graph(graph, load_graph(str(tmp_path / "b"), "g0_inference_c1"))
    assert d.status == "changed" and [m["output"] for m in d.b_vs_eager] == ["s_1 (changed in place)"]
    assert d.a_vs_eager == [] and [m["output"] for m in d.a_vs_b] == ["s_1 (changed in place)"]
    # a folder from before in-place values were saved loads, with nothing to compare
    meta = tmp_path / "a" / "g0_inference_c1" / "meta.json"
    doc = json.loads(meta.read_text())
    del doc["in_place"]
    meta.write_text(json.dumps(doc))
    assert load_graph(str(tmp_path / "a"), "g0_inference_c1").in_place == []
