"""`tdbg compare`: the first FX node whose compiled value diverges from eager.

Library cases run on the real aten graphs of scripts/compare_chain.py (a 21-op chain, forward 25
compared nodes, backward 50), captured once per module with tdbg's own backend; one end-to-end
case runs the CLI on the script with TDBG_INJECT_BUG.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from tdbg.compiler import config as tconfig
from tdbg.minifier.diagnose.divergence import compare_graph

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
CHAIN = os.path.join(SCRIPTS, "compare_chain.py")
NEG_LINE = f"{CHAIN}:17 in chain: z = torch.neg(y)"
COS_LINE = f"{CHAIN}:21 in chain: z = torch.cos(z)"   # cos's backward is -sin: the backward's neg


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _capture(fn, backend_of, *args, backward=False):
    """{kind: (aten gm, real inputs of its first call)} of `fn` compiled by a capturing backend."""
    graphs = {}

    def inner(gm, kind, compiled):
        def run(*call_args):
            graphs.setdefault(kind, (gm, [a.detach().clone() if isinstance(a, torch.Tensor) else a
                                          for a in call_args]))
            return compiled(*call_args)
        return run
    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend_of(inner))(*args)
    if backward:
        out.sum().backward()
    return graphs


@pytest.fixture(scope="module")
def cli_chain(tmp_path_factory):
    """`tdbg compare compare_chain.py --json` under TDBG_INJECT_BUG=neg:accuracy, started first so
    that its two processes overlap the in-process tests; (process, stdout file, JSON path)."""
    folder = tmp_path_factory.mktemp("compare-cli")
    out, stdout = folder / "compare.json", open(folder / "stdout.txt", "w+")
    env = dict(os.environ, TDBG_INJECT_BUG="neg:accuracy", COLUMNS="120")
    proc = subprocess.Popen([sys.executable, "-m", "tdbg.cli.main", "compare", CHAIN, "--backend", "inductor", "--json", str(out)],
                            stdout=stdout, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    yield proc, stdout, out
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    stdout.close()


@pytest.fixture(scope="module")
def chain_graphs(cli_chain):
    from tdbg.compiler import make_backend

    def backend_of(inner):
        # tdbg's AOT stage (decompositions, partition) with the aten graph run as is: the graphs
        # tdbg compiles, captured without building them (compare_graph builds them)
        def compile_one(gm, inputs, cfg, *, graph_name, kind):
            return inner(gm, kind, gm)
        return make_backend(tconfig.current(), inner_compile=compile_one)
    torch.manual_seed(0)
    x, w = torch.randn(64, 33, requires_grad=True), torch.randn(64, 33, requires_grad=True)
    return _capture(_load("compare_chain").chain, backend_of, x, w, backward=True)


def _neg_bug():
    return tconfig.current().replace(inject_bug=("neg", "accuracy"))


def test_forward_accuracy_bug_is_the_first_diverging_node_with_its_line(chain_graphs):
    gm, inputs = chain_graphs["forward"]
    r = compare_graph(gm, inputs, "inductor", kind="forward", config=_neg_bug())
    assert (r.verdict, r.mode, len(r.nodes)) == ("culprit", "nodes", 25)
    assert r.first_divergence is r.culprit
    assert (r.culprit.index, r.culprit.name, r.culprit.op, r.culprit.source) == (12, "neg", "aten.neg", NEG_LINE)
    assert r.culprit.kernel.startswith("cpp_fused_") and "_neg_" in r.culprit.kernel
    assert not any(n.diverges for n in r.nodes[:12])
    # the injected bug adds 1: the error is 1 against both float64 and eager, eager's own is tiny
    assert r.culprit.abs_eager == pytest.approx(1.0, abs=1e-5) and r.culprit.eager_abs_ref < 1e-6
    assert r.outputs and any(o.diverges for o in r.outputs)


def test_backward_accuracy_bug_names_the_forward_line(chain_graphs):
    gm, inputs = chain_graphs["backward"]
    r = compare_graph(gm, inputs, "inductor", kind="backward", config=_neg_bug())
    assert (r.verdict, len(r.nodes)) == ("culprit", 50)
    assert (r.culprit.index, r.culprit.name, r.culprit.op, r.culprit.source) == (19, "neg_1", "aten.neg", COS_LINE)
    assert r.first_divergence is r.culprit and "_neg_" in r.culprit.kernel


@pytest.mark.parametrize("kind", ["forward", "backward"])
def test_healthy_graph_reports_no_divergence(chain_graphs, kind):
    gm, inputs = chain_graphs[kind]
    r = compare_graph(gm, inputs, "inductor", kind=kind, config=tconfig.current().replace(inject_bug=None))
    assert (r.verdict, r.diverged, r.first_divergence, r.culprit) == ("ok", False, None, None)
    assert r.message == f"{len(r.nodes)} nodes and {len(r.outputs)} outputs within tolerance"
    # a float32 chain of this length: tdbg stays within 2x eager's own error vs float64 (+atol)
    assert all(n.abs_ref <= 2 * n.eager_abs_ref + 1e-5 for n in r.nodes if n.abs_ref is not None)


def test_drift_is_a_curve_not_a_culprit():
    drift = _load("compare_drift")
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def backend_of(inner):
        return aot_autograd(fw_compiler=lambda gm, inputs: make_boxed_func(inner(gm, "inference", gm)))
    gm, inputs = _capture(drift.recurrence, backend_of, torch.linspace(0.5, 1.5, 256))["inference"]
    r = compare_graph(gm, inputs, drift.noisy_compiler, kind="inference")
    assert (r.verdict, r.culprit, len(r.nodes)) == ("drift", None, 60)
    # 2e-6 per op: no op is wrong on its own, the 19th op in is where the sum passes float32's tolerance
    assert (r.first_divergence.index, r.first_divergence.name, r.drift_ops) == (18, "mul_12", 19)
    assert r.message.startswith("error grows over 19 ops; no single op is the culprit")
    assert all(n.local_wrong is False for n in r.nodes if n.diverges)
    curve = [e for _, e in r.curve()]
    assert len(curve) == 60 and curve[59] > curve[18] > curve[2] > 0


def test_divergence_only_when_fused_is_never_ok(chain_graphs):
    """A backend whose bug needs the whole graph (its realized variant, with every node an
    output, is correct): compare must say the outputs diverge only when fused, not OK."""
    gm, inputs = chain_graphs["forward"]
    outputs = len(next(n for n in gm.graph.nodes if n.op == "output").args[0])

    def fused_bug(g, example_inputs):
        whole = len(next(n for n in g.graph.nodes if n.op == "output").args[0]) == outputs

        def run(*args):
            outs = list(g(*args))
            return [outs[0] + 1] + outs[1:] if whole else outs
        return run
    r = compare_graph(gm, inputs, fused_bug, kind="forward")
    assert (r.verdict, r.diverged, r.culprit) == ("fused", True, None)
    assert not any(n.diverges for n in r.nodes)
    assert r.first_divergence.path == "out[0]"
    assert "appears only when nodes are fused" in r.message and "tdbg bisect" in r.message


def test_a_backend_without_an_aot_stage_says_only_outputs_were_observable(chain_graphs):
    gm, inputs = chain_graphs["forward"]
    r = compare_graph(gm, inputs, "eager", kind="forward")
    assert (r.verdict, r.mode, r.nodes) == ("outputs_match", "outputs", [])
    assert r.notes == ["eager compiles Dynamo-level graphs its own way: only the graph's outputs were observable"]


def test_cli_names_the_culprit_of_each_graph_and_exits_with_the_accuracy_code(cli_chain):
    proc, stdout, out = cli_chain
    code = proc.wait(timeout=600)
    stdout.seek(0)
    text = stdout.read()
    assert code == 16, text
    doc = json.loads(out.read_text())
    assert (doc["schema"], doc["exit_code"], doc["message"]) == (
        "tdbg.compare", 16, "2 graph(s): 2 with a diverging op; g0_dynamo_c1: the compiled graph differs from the "
                            "Dynamo graph")
    # the Dynamo graph's stages: the aten graph matches eager, the compiled one does not
    assert [(s["name"], s["verdict"], s["culprit"]) for s in doc["stages"]] == [("g0_dynamo_c1", "compiled", None)]
    got = [(g["name"], g["verdict"], g["culprit"]["name"], g["culprit"]["source"]) for g in doc["graphs"]]
    assert got == [("g0_forward_c1", "culprit", "neg", NEG_LINE), ("g1_backward_c1", "culprit", "neg_1", COS_LINE)]
    shown = os.path.relpath(CHAIN, ROOT)   # the report names files relative to the working directory
    for line in ("first diverging op: neg (aten.neg)", f"source: {shown}:17 in chain: z = torch.neg(y)",
                 "FX node: neg = aten.neg(...)", "first diverging op: neg_1 (aten.neg)",
                 f"source: {shown}:21 in chain: z = torch.cos(z)", "<- first"):
        assert line in text, text


@pytest.fixture(scope="module")
def saved_chain(chain_graphs, tmp_path_factory):
    """A --save-io folder of the chain's two graphs, recorded as compiled with the neg bug."""
    from tdbg.minifier.artifacts.saved_io import Writer
    from tdbg.minifier.diagnose.divergence import node_sources
    folder = str(tmp_path_factory.mktemp("saved") / "io")
    writer = Writer(folder, {"backend": "inductor", "script": CHAIN, "after": "aot"})
    for index, kind in enumerate(("forward", "backward")):
        gm, inputs = chain_graphs[kind]
        expected = list(gm(*[a.clone() for a in inputs]))
        replay = {"backend": {"kind": "named", "name": "inductor"}, "config": {"inject_bug": ["neg", "accuracy"]},
                  "after": "aot", "aot": {"family": "tdbg", "graph": kind}}
        writer.add(kind=kind, graph=index, call=1, gm=gm, inputs=inputs, expected=expected, compiled=None,
                   compiled_error=None, node_sources=node_sources(gm), replay=replay, signature="")
    writer.finish()
    return folder


def test_cli_compares_a_saved_folder_with_the_config_it_was_saved_with(saved_chain, tmp_path):
    from click.testing import CliRunner

    from tdbg.cli.main import cli
    out = tmp_path / "c.json"
    r = CliRunner().invoke(cli, ["compare", saved_chain, "--graph", "g1_backward_c1", "--json", str(out)])
    assert r.exit_code == 16, r.output
    doc = json.loads(out.read_text())
    assert [(g["name"], g["verdict"], g["culprit"]["name"], g["culprit"]["source"]) for g in doc["graphs"]] == [
        ("g1_backward_c1", "culprit", "neg_1", COS_LINE)]


def test_cli_refuses_a_tampered_saved_folder(saved_chain, tmp_path):
    import shutil

    from click.testing import CliRunner

    from tdbg.cli.main import cli
    folder = str(tmp_path / "io")
    shutil.copytree(saved_chain, folder)
    tensors = os.path.join(folder, "g0_forward_c1", "tensors")
    victim = sorted(os.listdir(tensors))[0]
    with open(os.path.join(tensors, victim), "r+b") as f:
        f.write(b"\xff\xff\xff\xff")
    r = CliRunner().invoke(cli, ["compare", folder])
    assert r.exit_code == 3, r.output
    assert victim in r.output.replace("\n", "")


def test_a_run_that_fails_before_any_graph_runs_gives_its_own_stage_and_first_line():
    from tdbg.cli.compare import _run_problem
    verdict = {"status": "failed", "stage": "cpp_build",
               "error": {"message": "k.cpp:40: error: x was not declared\n   40 | ...", "source": "s.py:13 in f: y = g(x)"}}
    assert _run_problem(verdict, "s.py") == (
        "the run of s.py failed before there was anything to compare: the generated C++ did not compile at "
        "s.py:13 in f: y = g(x): k.cpp:40: error: x was not declared (`tdbg run s.py` reports it in full).", 14)
    assert _run_problem({"status": "failed", "stage": "accuracy", "error": {}}, "s.py") is None
    assert _run_problem({"status": "ok", "compile_calls": 0}, "s.py")[1] == 3


# -- culprit vs drift: the flip rule ------------------------------------------------------------
def test_flip_rule_in_tolerance_units():
    from tdbg.minifier.diagnose.divergence import FLIP_GAIN, flips
    inf = float("inf")
    assert flips(inf, [0.31]) is True            # a bool that changed on an input 0.31 tolerances off
    assert flips(50.0, [0.3]) is True            # a float jump: 166x its input's error
    assert flips(1.05, [0.95]) is False          # drift: each op adds a little
    assert flips(FLIP_GAIN * 0.5 - 1e-9, [0.5]) is False
    assert flips(inf, [1.5]) is False            # an input already beyond tolerance: inherited, not a flip
    assert flips(inf, []) is True                # nothing feeds it a difference, yet it changed


def _add_in_float32(a, scalar):
    return (a.float() + scalar).to(a.dtype)


def _bf16_margin_graph():
    """make_fx's aten graph of (x + 1.7 >= 0) * 2 in bfloat16, and a compiler that adds the
    scalar in float32 (as Inductor keeps 1.7 unrounded, PyTorch #185517), editing the graph it
    is given in place (compare's eager graph must not see that)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x):
        return ((x + 1.7) >= 0).to(torch.bfloat16) * 2
    x = torch.tensor([-1.703125, 0.5], dtype=torch.bfloat16)
    gm = make_fx(fn)(x)

    def float32_scalars(g, example_inputs):
        for node in g.graph.nodes:
            if node.target is torch.ops.aten.add.Tensor and not isinstance(node.args[1], torch.fx.Node):
                node.target = _add_in_float32
        g.recompile()
        return g
    return gm, [x], float32_scalars


def test_a_comparison_that_flips_on_inputs_within_tolerance_is_the_culprit_not_drift():
    gm, inputs, compiler = _bf16_margin_graph()
    r = compare_graph(gm, inputs, compiler, kind="inference")
    assert (r.verdict, r.diverged) == ("culprit", True)
    assert (r.culprit.name, r.culprit.op, r.culprit.flips, r.culprit.local_wrong, r.culprit.origin) == (
        "ge", "aten.ge", True, False, "add")
    add = next(n for n in r.nodes if n.name == "add")
    assert (add.diverges, add.abs_eager) == (False, pytest.approx(0.003128, abs=1e-5))
    # what follows the flip differs from eager too (float64 flips as well, so it cannot excuse it: the rule
    # run's check uses), but each computes right from its inputs: no flip of its own
    after = [n for n in r.nodes if n.index > r.culprit.index]
    assert [(n.name, n.abs_eager, n.diverges, n.flips) for n in after] == [
        ("_to_copy", 1.0, True, False), ("mul", 2.0, True, False)]
    assert r.message.startswith("first diverging op: ge (aten.ge), max abs error 1 vs eager; its result flips")
    assert "the input difference starts at add (aten.add, node 0," in r.message


def _bf16_round_trip(scale=1.0):
    """make_fx's aten graph of exp(x.float()) rounded to bfloat16 and back, times 2; and a compiler
    that keeps the rounded value in float32 as Inductor does (the second cast reads the float32 value),
    its results multiplied by `scale` (1.05: wrong by 5%, beyond bfloat16's tolerance)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x):
        return torch.exp(x.float()).to(torch.bfloat16).float() * 2
    x = torch.linspace(-2, 2, 64, dtype=torch.bfloat16)
    gm = make_fx(fn)(x)

    def skip_rounding(g, example_inputs):
        for node in g.graph.nodes:
            src = node.args[0] if node.args else None
            if (node.target is torch.ops.aten._to_copy.default and node.kwargs.get("dtype") == torch.float32
                    and getattr(src, "target", None) is torch.ops.aten._to_copy.default):
                node.args = (src.args[0],)
        g.recompile()
        def run(*args):
            out = g(*args)
            return [v * scale for v in out] if isinstance(out, (list, tuple)) else out * scale
        return run
    return gm, [x], skip_rounding


@pytest.mark.parametrize("scale, verdict", [(1.0, "ok"), (1.05, "culprit")])
def test_a_float32_value_rounded_through_bfloat16_by_eager_is_judged_at_bfloat16s_tolerance(scale, verdict):
    """A compiler that skips eager's bfloat16 round trip differs from eager by bfloat16's rounding
    in the float32 values after it: not a divergence (compare said DIVERGES on Inductor's bf16
    gelu/softmax where run said OK); 5% off still is."""
    gm, inputs, compiler = _bf16_round_trip(scale)
    r = compare_graph(gm, inputs, compiler, kind="inference")
    assert r.verdict == verdict, r.message
    mul = next(n for n in r.nodes if n.name == "mul")
    assert mul.dtype == "float32" and mul.abs_eager > 0.0
    if verdict == "culprit":
        assert r.culprit.name == "_to_copy"   # every value is scaled: the first float32 one is first


def test_drift_rows_never_flip():
    """The drift case's first divergence is one more small step (gain near 1): flips is False."""
    drift = _load("compare_drift")
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def backend_of(inner):
        return aot_autograd(fw_compiler=lambda gm, inputs: make_boxed_func(inner(gm, "inference", gm)))
    gm, inputs = _capture(drift.recurrence, backend_of, torch.linspace(0.5, 1.5, 256))["inference"]
    r = compare_graph(gm, inputs, drift.noisy_compiler, kind="inference")
    assert r.verdict == "drift"
    assert r.first_divergence.flips is False and r.first_divergence.origin is None


# -- stages: Dynamo graph vs aten graph vs compiled ---------------------------------------------
def _dynamo_graph(fn, *args):
    """(Dynamo's graph of fn, its real inputs), captured by a backend that runs it as is."""
    import copy
    got = []

    def grab(gm, example_inputs):
        got.append((copy.deepcopy(gm), [a.clone() for a in example_inputs]))
        return gm
    torch._dynamo.reset()
    torch.compile(fn, backend=grab)(*[a.clone() for a in args])
    return got[0]


def _slice_write(x):   # PyTorch #162151: AOTAutograd gets the second write wrong
    x = x.permute(2, 1, 0)
    x[0] += 1
    x[0] = x[0].t()
    return x


def _neg_then_add(x):
    return torch.neg(x) + 1


def test_an_aten_graph_already_wrong_is_the_aot_stage_with_its_dynamo_node():
    from tdbg.minifier.diagnose.divergence import node_sources
    from tdbg.minifier.diagnose.stages import compare_stages
    gm, inputs = _dynamo_graph(_slice_write, torch.arange(1.0, 9.0).reshape(2, 2, 2))
    r = compare_stages(gm, inputs, "torch:aot_eager", sources=node_sources(gm), name="g0")
    assert (r.verdict, r.diverged) == ("aot", True)
    line = _slice_write.__code__.co_firstlineno + 3
    assert r.culprit == {"name": "setitem_1", "op": "setitem", "index": 6,
                         "source": f"{__file__}:{line} in _slice_write: x[0] = x[0].t()"}
    assert [(v.path, v.aot["diverges"], v.compiled["diverges"]) for v in r.values] == [
        ("out[0]", True, True), ("input l_x_", True, True)]


def _copysign_of_zero(x, y):
    return torch.copysign(y, x * 0)


def test_inductor_folding_x_times_0_is_blamed_on_its_aot_stage_passes_and_minified_after_dynamo():
    """A real Inductor bug (torch 2.13): its joint-graph constant folding makes `x * 0` +0, losing
    -0's sign. The aten graph Inductor's AOT stage makes is already wrong, but not by AOTAutograd:
    compare said "AOTAutograd is at fault", and bisect suggested a minify --after aot that found
    nothing to minify (the captured aten graph comes out of those passes)."""
    from tdbg.cli.bisect import _minify_command
    from tdbg.minifier.diagnose.stages import compare_stages
    gm, inputs = _dynamo_graph(_copysign_of_zero, torch.tensor([1.0, -1.0, 2.0, -2.0]), torch.arange(4.0) + 1)
    r = compare_stages(gm, inputs, "torch:inductor")
    assert r.verdict == "aot" and r.message.endswith(
        "AOTAutograd or Inductor's passes that run inside its AOT stage (pre-grad, joint-graph: pattern matching, "
        "constant folding) are at fault; `tdbg bisect --backend torch:inductor` tells them apart, and `tdbg minify "
        "--after dynamo` captures the graph before them")
    result = {"verdict": {"level": "subsystem", "stage": "accuracy"}, "first_failing_backend": "torch:inductor",
              "culprits": [{"subsystem": "joint_graph_passes"}]}
    assert _minify_command(result, "cs.py", []) == "tdbg minify cs.py --after dynamo --level 4 --backend torch:inductor"


def test_a_compiler_bug_is_the_compiled_stage_and_a_healthy_graph_is_ok():
    from tdbg.minifier.diagnose.stages import compare_stages
    gm, inputs = _dynamo_graph(_neg_then_add, torch.randn(4, 8))
    bad = compare_stages(gm, inputs, "inductor", config=_neg_bug())
    assert (bad.verdict, bad.culprit) == ("compiled", None)
    assert [(v.path, v.aot["diverges"], v.compiled["diverges"]) for v in bad.values] == [
        ("out[0]", False, True), ("input l_x_", False, False)]
    assert bad.message.endswith("while the aten graph matches it: the compiler is at fault")
    good = compare_stages(gm, inputs, "inductor", config=tconfig.current().replace(inject_bug=None))
    assert (good.verdict, good.message) == (
        "ok", "2 value(s) (outputs and inputs after the call) match at every stage")


def test_a_graph_drawing_random_numbers_is_not_judged_by_stages():
    from tdbg.minifier.diagnose.stages import compare_stages
    gm, inputs = _dynamo_graph(lambda x: torch.nn.functional.dropout(x, 0.5) + 1, torch.randn(16))
    r = compare_stages(gm, inputs, "torch:aot_eager")
    assert (r.verdict, r.diverged, r.values) == ("unjudged", False, [])


def test_a_dynamo_graph_compiled_by_torch_aot_eager_is_compared_on_its_outputs():
    """torch:aot_eager's result carries a stale `_boxed_call` (functools.wraps): called with one
    list, as a boxed aten compiler would be, it failed with StopIteration; Dynamo calls it with
    positional args, and so does compare."""
    gm, inputs = _dynamo_graph(_neg_then_add, torch.randn(4, 8))
    r = compare_graph(gm, inputs, "torch:aot_eager", kind="dynamo")
    assert (r.verdict, r.mode, [o.path for o in r.outputs]) == ("outputs_match", "outputs", ["out[0]"])


def test_an_input_the_compiled_graph_writes_wrongly_is_never_ok():
    """An aten graph that writes into its input (copy_ kept in the graph): the written input is
    compared like an output, since no output shows it."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    def f(x, y):
        x.add_(1)
        return y * 2
    got = []
    x, y = torch.randn(4), torch.randn(4)
    aot_function(f, fw_compiler=lambda gm, ex: got.append(gm) or make_boxed_func(gm),
                 keep_inference_input_mutations=True)(x.clone(), y)

    def writes_twice(g, example_inputs):
        def run(*args):
            out = g(*args)
            args[0].add_(1)
            return out
        return run
    bad = compare_graph(got[0], [x, y], writes_twice, kind="inference")
    assert bad.verdict == "fused"
    assert [(o.path, o.diverges, o.abs_eager) for o in bad.outputs] == [
        ("out[0]", False, 0.0), ("input arg0_1 (written)", True, pytest.approx(1.0, abs=1e-6))]
    assert "the compiled graph writes the input wrongly" in bad.message
    good = compare_graph(got[0], [x, y], lambda g, example_inputs: g, kind="inference")
    assert (good.verdict, [o.path for o in good.outputs]) == ("ok", ["out[0]", "input arg0_1 (written)"])


def _draw_node(target, *args, **kwargs):
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    return graph.call_function(target, (x, *args), kwargs)


aten = torch.ops.aten
SDPA = aten._scaled_dot_product_flash_attention_for_cpu.default
# (node, whether it draws random numbers)
DRAWS = [
    ("attention, dropout_p 0 (every eval-mode transformer)", _draw_node(SDPA, "k", "v", 0.0), False),
    ("attention, dropout_p left at its default", _draw_node(SDPA, "k", "v"), False),
    ("attention with dropout", _draw_node(SDPA, "k", "v", 0.1), True),
    ("attention with dropout as a keyword", _draw_node(SDPA, "k", "v", dropout_p=0.1), True),
    ("native_dropout in eval", _draw_node(aten.native_dropout.default, 0.5, False), False),
    ("native_dropout in training", _draw_node(aten.native_dropout.default, 0.5, True), True),
    ("rand_like", _draw_node(aten.rand_like.default), True),
    ("add", _draw_node(aten.add.Tensor, 1.0), False),
]


@pytest.mark.parametrize("name,node,draws", DRAWS, ids=[d[0] for d in DRAWS])
def test_which_nodes_draw_random_numbers(name, node, draws):
    from tdbg.minifier.diagnose.same_draws import draws_random
    assert draws_random(node) == draws


def attention_block(x, wq, wk, wv):
    q, k, v = (torch.nn.functional.linear(x, w).view(1, 16, 2, 16).transpose(1, 2) for w in (wq, wk, wv))
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 16, 32)
    return torch.erf(a) * 2


def test_a_bug_after_attention_is_found():
    """Attention carries the random tag (for its dropout); at dropout 0 it draws nothing, and the
    nodes after it are compared: an injected erf bug after a BERT's attention was once reported
    as 'diverges only when fused', every node past the attention skipped as random."""
    from tdbg.compiler import make_backend

    def backend_of(inner):
        return make_backend(tconfig.current(), inner_compile=lambda gm, inputs, cfg, *, graph_name, kind:
                            inner(gm, kind, gm))
    torch.manual_seed(0)
    args = (torch.randn(1, 16, 32), *(torch.randn(32, 32) * 0.2 for _ in range(3)))
    with torch.no_grad():
        gm, inputs = _capture(attention_block, backend_of, *args)["inference"]
    r = compare_graph(gm, inputs, "inductor", config=tconfig.current().replace(inject_bug=("erf", "accuracy")))
    assert r.verdict == "culprit" and (r.culprit.name, r.culprit.op) == ("erf", "aten.erf")
    assert not any("random ops are not compared" in note for note in r.notes)


def test_a_value_of_another_dtype_is_named_so_not_an_infinite_error():
    """A compiled value of another dtype (or shape) is not comparable: the verdict says which and
    what was expected, where it once read 'max abs error inf'."""
    gm, inputs = _dynamo_graph(_neg_then_add, torch.randn(4, 8))

    def to_double(gm, example_inputs):   # a per-graph compiler whose results come back float64
        return lambda *args: [o.double() for o in gm(*args)]
    r = compare_graph(gm, inputs, to_double)
    assert r.verdict == "culprit" and r.culprit.name == "neg"
    expected = "dtype differs: expected (4, 8) torch.float32, got (4, 8) torch.float64"
    assert r.culprit.mismatch == expected and expected in r.message and "inf" not in r.message
