"""Model-zoo benchmark smoke test: one tiny `transformers` model through benchmarks/models.py
(inference and a training step, eager and tdbg), so the zoo harness cannot rot; a backend with a
wrong backward is a mismatch, never a time."""
import importlib.util
import json
import os
import sys
import types

import pytest
import torch

pytest.importorskip("transformers", reason="the model zoo builds its models with transformers "
                                           "(pip install -e '.[test]' or '.[bench]')")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WRONG_GRAD = os.path.join(ROOT, "tests", "scenarios", "scripts", "wrong_param_grad.py") + ":doubles_first_grad"
MODEL = "distilbert"


def _models():
    spec = importlib.util.spec_from_file_location("tdbg_bench_models", os.path.join(ROOT, "benchmarks", "models.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    path = tmp_path_factory.mktemp("zoo") / "zoo.json"
    _models().main(["--tiny", "--only", MODEL, "--backends", "eager,tdbg", "--repeat", "2",
                    "--json", str(path)])
    return json.loads(path.read_text())


def _backend(spec):
    from tdbg.minifier.runs.backends import resolve
    return resolve(spec).compiler_fn


def _cells(doc):
    return {(c["mode"], os.path.basename(c["backend"])): c for c in doc["cells"]}


def test_tiny_model_runs_and_tdbg_matches_eager(doc):
    assert doc["schema"] == "tdbg.models" and doc["version"] == 1
    assert [(c["model"], c["mode"]) for c in doc["cells"]] == [(MODEL, "inference")] * 2 + [(MODEL, "training")] * 2
    assert doc["shapes"]["text"] == [2, 16] and doc["settings"]["threads"] == 2
    cells = _cells(doc)
    for mode in ("inference", "training"):
        eager, tdbg = cells[(mode, "eager")], cells[(mode, "tdbg")]
        assert (eager["status"], tdbg["status"]) == ("ok", "ok"), (eager["error"], tdbg["error"])
        assert len(eager["runs_s"]) == len(tdbg["runs_s"]) == 2
        assert eager["speedup_vs_eager"] == 1.0 and eager["compile_s"] == 0.0
        assert tdbg["speedup_vs_eager"] == pytest.approx(eager["median_s"] / tdbg["median_s"])
        assert tdbg["compile_s"] > 0 and tdbg["time_vs_inductor"] is None
    assert doc["subnormal_share"] == {MODEL: 0.0} and doc["settings"]["flush_subnormals"] is False


def test_wrong_gradient_is_a_mismatch_not_a_time(monkeypatch):
    """run_training on a small MLP (standing in for a zoo model): a backend whose forward is right
    and whose backward doubles the first parameter's gradient fails the gradient check, untimed."""
    m = _models()
    torch.manual_seed(0)
    net = m.Loss(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))).train()
    inputs = [torch.randn(6, 8), torch.tensor([0, 1, 2, 3, 0, 1])]
    monkeypatch.setattr(m, "build", lambda zm, tiny, shapes, training, dtype: (net, inputs))
    settings = m.Settings(repeat=2, warmup=1, quick=True)
    cells = m.run_training(m.BY_NAME[MODEL], ["eager", WRONG_GRAD], settings, m.SHAPES[True])
    eager, wrong = cells
    assert eager.status == "ok" and len(eager.runs_s) == 2
    assert wrong.status == "mismatch" and wrong.median_s is None and wrong.runs_s == []
    assert [mm["output"] for mm in wrong.mismatches] == ["out[1]['net.0.weight']"]
    assert wrong.error.startswith("1 wrong, first out[1]['net.0.weight']: max abs error")
    # the forward alone is right: the same backend passes inference
    with torch.no_grad():
        assert torch.equal(torch.compile(net.net, backend=_backend(WRONG_GRAD))(inputs[0]), net.net(inputs[0]))


def test_summary_without_inductor(doc):
    s = doc["summary"]
    cells = _cells(doc)
    for mode in ("inference", "training"):
        assert s[mode]["compared"] == 0 and s[mode]["time_vs_inductor"] is None
        assert s[mode]["time_vs_eager"] == pytest.approx(1 / cells[(mode, "tdbg")]["speedup_vs_eager"])
        assert s[mode]["not_ok"] == {}


def test_summary_geomeans_and_goal_lines():
    m = _models()
    rows = [dict(model=name, mode="inference", backend=backend, status="ok", error=None, median_s=t,
                 time_vs_inductor=t / ind, speedup_vs_eager=eager / t, compile_s=c)
            for name, eager, ind, tdbg, c_ind, c_tdbg in (("a", 4.0, 1.0, 2.0, 10.0, 2.0),
                                                         ("b", 1.0, 1.0, 2.0, 10.0, 8.0))
            for backend, t, c in (("eager", eager, 0.0), ("torch:inductor", ind, c_ind), ("tdbg", tdbg, c_tdbg))]
    rows.append(dict(model="c", mode="inference", backend="tdbg", status="failed", error="LoweringError: x",
                     median_s=None, time_vs_inductor=None, speedup_vs_eager=None, compile_s=None))
    s = m.summary(rows, ["inference"])["inference"]
    assert s["time_vs_inductor"] == pytest.approx(2.0) and s["compared"] == 2
    assert s["time_vs_eager"] == pytest.approx((0.5 * 2.0) ** 0.5)
    assert s["compile_vs_inductor"] == pytest.approx((0.2 * 0.8) ** 0.5)
    assert s["slower_than_eager"] == ["b"] and s["not_ok"] == {"c": "failed: LoweringError: x"}
    assert m.summary_lines({"inference": s}) == [
        "inference: tdbg/inductor time geomean 2.00x over 2 models (goal <= 0.9), median 2.00x (goal <= 0.9), "
        "worst a 2.00x (goal <= 1.1); tdbg/eager 1.00x; "
        "cold compile tdbg/inductor 0.40x (goal <= 0.4); slower than eager: b; "
        "failed or wrong: c (failed: LoweringError: x)"]


def test_summary_names_the_median_and_the_worst_model():
    """Issue 23's static goal is a median and a worst model, not a geomean one outlier can carry."""
    m = _models()
    rows = [dict(model=name, mode="inference", backend=backend, status="ok", error=None, median_s=t,
                 time_vs_inductor=t / 10.0, speedup_vs_eager=20.0 / t, compile_s=1.0)
            for name, tdbg in (("a", 8.0), ("b", 12.0), ("c", 2.0), ("d", 9.5))
            for backend, t in (("eager", 20.0), ("torch:inductor", 10.0), ("tdbg", tdbg))]
    s = m.summary(rows, ["inference"])["inference"]
    assert s["median_vs_inductor"] == pytest.approx(0.875)
    assert s["worst"] == {"model": "b", "time_vs_inductor": pytest.approx(1.2)}
    assert m.summary_lines({"inference": s})[0].startswith(
        "inference: tdbg/inductor time geomean 0.65x over 4 models (goal <= 0.9), median 0.88x (goal <= 0.9), "
        "worst b 1.20x (goal <= 1.1); ")


def test_missing_transformers_is_one_clear_error(monkeypatch, capsys):
    m = _models()
    monkeypatch.setitem(sys.modules, "transformers", None)   # import transformers -> ImportError
    with pytest.raises(SystemExit) as exit_info:
        m.main(["--tiny", "--only", MODEL, "--backends", "eager"])
    assert exit_info.value.code == 3
    assert "pip install -e '.[bench]'" in capsys.readouterr().err


def test_dynamic_mode_feeds_the_sweep_then_checks_and_times_sizes_not_seen(monkeypatch):
    """run_dynamic on a small embedding + linear model (standing in for a zoo model): each
    backend's own torch.compile is fed the sweep, then the unseen size is checked and timed.
    The counts are today's tdbg: automatic dynamic gives Dynamo a static graph, then a dynamic
    one, which tdbg compiles once per concrete length (12 in the sweep, then 10)."""
    m = _models()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lin = torch.nn.Embedding(32, 8), torch.nn.Linear(8, 4)
            self.model = types.SimpleNamespace(config=None)

        def forward(self, ids):
            return torch.relu(self.lin(self.emb(ids))).softmax(-1)

    torch.manual_seed(0)
    net = Net().eval()
    monkeypatch.setattr(m, "build", lambda zm, tiny, shapes, dtype: (net, None))
    monkeypatch.setattr(m, "_inputs", lambda zm, cfg, shapes, g, dtype: (
        ("input_ids",), [torch.randint(32, shapes["text"], generator=g)], 32))
    monkeypatch.setattr(m, "DYNAMIC_SIZES", {True: {"text": ((8, 12), (10,))}})
    cells = m.run_dynamic(m.BY_NAME[MODEL], ["eager", "tdbg"], m.Settings(repeat=2, warmup=1, quick=True),
                          m.SHAPES[True])
    assert [(c.workload, c.backend, c.status) for c in cells] == [
        (f"{MODEL} len 10", "eager", "ok"), (f"{MODEL} len 10", "tdbg", "ok")], [c.error for c in cells]
    eager, tdbg = (c.dynamic for c in cells)
    assert (eager["seen"], eager["dynamo_graphs"], eager["tdbg_static_compiles"]) == ([8, 12], 0, 0)
    # a static graph for length 8, then one symbolic graph (kernels taking the length) for all
    # others: its forward and its backward (the weights require grad), each compiled once
    assert (tdbg["seen"], tdbg["dynamo_graphs"], tdbg["tdbg_static_compiles"], tdbg["tdbg_symbolic_compiles"],
            tdbg["tdbg_symbolic_fallbacks"]) == ([8, 12], 2, 0, 2, 0)
    assert all(len(c.runs_s) == 2 and c.median_s > 0 for c in cells)
    assert cells[1].speedup_vs_eager == pytest.approx(cells[0].median_s / cells[1].median_s)


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_dtype_casts_weights_and_floating_inputs_only(dtype, torch_dtype):
    m = _models()
    net, (pixels,) = m.build(m.BY_NAME["vit_base"], True, dtype=dtype)
    assert {p.dtype for p in net.parameters()} == {torch_dtype} and pixels.dtype == torch_dtype
    net, (ids,) = m.build(m.BY_NAME[MODEL], True, dtype=dtype)
    assert {p.dtype for p in net.parameters()} == {torch_dtype} and ids.dtype == torch.int64
    assert m.parse_args(["--dtype", dtype, "--dynamic"]).modes == ["dynamic"]


def test_dynamic_summary_judges_compile_cost_by_the_sweep():
    """In the dynamic mode the timed sizes compile nothing; what compiling cost is the sweep's wall
    time, so the summary's compile ratio is the sweep's (tdbg 4 s vs Inductor 10 s: 0.40x)."""
    m = _models()
    rows = [dict(model="a len 77", mode="dynamic", backend=backend, status="ok", error=None, median_s=t,
                 time_vs_inductor=t / 2.0, speedup_vs_eager=3.0 / t, compile_s=0.002,
                 dynamic=dict(seen=[32, 40], sweep_s=sweep))
            for backend, t, sweep in (("eager", 3.0, 0.5), ("torch:inductor", 2.0, 10.0), ("tdbg", 1.5, 4.0))]
    s = m.summary(rows, ["dynamic"])
    assert s["dynamic"]["compile_vs_inductor"] == pytest.approx(0.4)
    assert m.summary_lines(s) == [
        "dynamic: tdbg/inductor time geomean 0.75x over 1 models (goal <= 0.9), median 0.75x, "
        "worst a len 77 0.75x; tdbg/eager 0.50x; "
        "the sweep (compiling) tdbg/inductor 0.40x (goal <= 0.4); slower than eager: none; failed or wrong: none"]


def test_sets_name_disjoint_models_and_every_held_out_model_builds_and_runs():
    """`--set held-out` is models the compiler was not tuned on: none of them is in the zoo, and
    each builds from its tiny config and gives logits in eager."""
    m = _models()
    assert not {z.name for z in m.ZOO} & {z.name for z in m.HELD_OUT}
    assert m.SETS["all"] == m.ZOO + m.HELD_OUT
    with torch.no_grad():
        for zm in m.HELD_OUT:
            net, inputs = m.build(zm, True)
            out = net(*inputs)
            assert out.dim() >= 2 and bool(out.isfinite().all()), zm.name


def test_only_and_set_together_are_one_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _models().parse_args(["--set", "held-out", "--only", MODEL])
    assert exit_info.value.code == 2
    assert "--only and --set both choose the models" in capsys.readouterr().err


def test_progress_line_carries_each_backends_figures():
    """A run cut short by a timeout still leaves every finished model's times on stderr."""
    m = _models()
    Cell = m.harness.Cell
    cells = [Cell("bert_base", "eager", median_s=0.1182), Cell("bert_base", "torch:inductor", median_s=0.1137,
                                                               time_vs_inductor=1.0),
             Cell("bert_base", "tdbg", median_s=0.1029, time_vs_inductor=0.905),
             Cell("bert_base", "x.py:backend", status="mismatch")]
    assert m.progress_line("bert_base inference", 28.84, cells, m.Phases()) == (
        "bert_base inference: 28.8 s; eager 118.2 ms, torch:inductor 113.7 ms, tdbg 102.9 ms 0.91x inductor, "
        "x.py:backend MISMATCH")
    sized = [Cell("gpt2 len 77", "tdbg", median_s=0.05, time_vs_inductor=0.876)]
    assert m.progress_line("gpt2 dynamic", 3.0, sized, m.Phases()) == "gpt2 dynamic: 3.0 s; tdbg len 77 50.0 ms 0.88x inductor"


def test_subnormals_are_counted_and_named_and_can_be_flushed_for_every_backend():
    """Random-init MobileViT's activations decay into subnormal numbers (every backend computes
    on them slowly): the run names the share, and --flush-subnormals times with them flushed."""
    _flush_or_skip()
    m = _models()
    settings = m.Settings(**m.TINY_SETTINGS, quick=True)
    share = m.subnormal_share(m.BY_NAME["mobilevit_small"], settings, m.SHAPES[True])
    assert 0.001 < share < 0.1
    with m.harness.benchmark_state(m.Settings(flush_subnormals=True)):   # counted unflushed all the same
        flushed = m.Settings(**m.TINY_SETTINGS, quick=True, flush_subnormals=True)
        assert m.subnormal_share(m.BY_NAME["mobilevit_small"], flushed, m.SHAPES[True]) == share
        assert (torch.full((1 << 20,), 1e-39) * 1).count_nonzero() == 0     # and flushing again after
    payload = {"subnormal_share": {"mobilevit_small": 0.0082, "gpt2": 0.0}, "settings": {"flush_subnormals": False}}
    assert m.subnormal_line(payload) == (
        "subnormal values among those eager's ops read: mobilevit_small 0.82%; arithmetic on them is the CPU's slow "
        "path for every backend alike, so these models' ratios are diluted (--flush-subnormals times them flushed to zero)")
    payload["settings"]["flush_subnormals"] = True
    assert m.subnormal_line(payload).endswith("mobilevit_small 0.82%; timed with them flushed to zero in every "
                                              "thread (--flush-subnormals)")
    assert m.subnormal_line({"subnormal_share": {"gpt2": 0.0}, "settings": {}}) is None
    assert m.parse_args(["--flush-subnormals"]).flush_subnormals and not m.parse_args([]).flush_subnormals


def _flush_or_skip():
    from tdbg.minifier.diagnose.subnormals import flush_supported
    if flush_supported() is not None:
        pytest.skip(flush_supported())


def test_benchmark_state_flushes_every_thread_and_restores():
    _flush_or_skip()
    m = _models()
    x = torch.full((1 << 20,), 1e-39)
    with m.harness.benchmark_state(m.Settings(flush_subnormals=True)):
        assert (x * 1).count_nonzero() == 0
    assert (x * 1).count_nonzero() == x.numel()
    with m.harness.benchmark_state(m.Settings()):
        assert (x * 1).count_nonzero() == x.numel()


def test_repeated_blocks_are_the_outermost_lists_of_one_class():
    m = _models()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)])

    net = torch.nn.Module()
    net.layers = torch.nn.ModuleList([Block(), Block(), Block()])
    net.mixed = torch.nn.ModuleList([torch.nn.Linear(2, 2), torch.nn.ReLU()])
    net.single = torch.nn.ModuleList([Block()])
    # the layers, not the lists inside them; inside a list of one, the inner list is the repeat
    want = [*net.layers, *net.single[0].inner]
    blocks = m.repeated_blocks(net)
    assert len(blocks) == len(want) and all(a is b for a, b in zip(blocks, want))
    with pytest.raises(ValueError, match="Linear has no repeated blocks"):
        m.regional_runner("tdbg", torch.nn.Linear(2, 2))


def test_regional_mode_compiles_one_graph_for_every_layer_and_matches_eager():
    """--modes regional: each layer of the tiny model compiled by itself, one Dynamo graph shared
    by the layers, each backend on its own copy (eager's model is left uncompiled)."""
    from torch._dynamo.utils import counters
    m = _models()
    torch._dynamo.reset()
    counters.clear()
    try:
        with torch.no_grad():
            cells = m.run_regional(m.BY_NAME[MODEL], ["eager", "tdbg"], m.Settings(repeat=2, warmup=1, quick=True),
                                   m.SHAPES[True])
        assert [(c.backend, c.status) for c in cells] == [("eager", "ok"), ("tdbg", "ok")], [c.error for c in cells]
        assert counters["stats"]["unique_graphs"] == 1 and cells[1].compile_s > 0 and len(cells[1].runs_s) == 2
    finally:
        torch._dynamo.reset()
