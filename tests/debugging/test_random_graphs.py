"""Graphs that draw random numbers (dropout) are judged on eager's draws by every tool, as `tdbg run
--check-accuracy` judges them: the minifier's queries and repro.py (runtime.evaluate), `tdbg compare`
(compare_graph) and `tdbg replay` of a graph saved from another backend.

Found on a transformers BERT training step (dropout in every layer) and on PyTorch issue #175966
beside a dropout: the minifier's queries started the compiled run from the generator state eager
left behind and let Inductor draw its own numbers, so a healthy dropout "reproduced" an accuracy
failure (minify shrank the real int64 overflow away and kept the dropout) or, after aot, Inductor
refused the graph ("should be handled in replace_random.py": a false "Not reproduced"); compare
called every BERT forward "DIVERGES WHEN FUSED" where run said OK; replay could not read a backward
graph Inductor had decomposed into prims.fma.
"""
import subprocess
import sys

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import config as tconfig
from tdbg.minifier.artifacts.graph_io import TensorStore, from_graph_module
from tdbg.minifier.diagnose.divergence import compare_graph
from tdbg.minifier.reduce.oracle import evaluate


def relu_and_dropout(x):
    """Two outputs: relu's (where an injected relu bug shows) and dropout's (never wrong)."""
    return torch.relu(x) * 3, torch.nn.functional.dropout(x.sin(), 0.5, training=True) * 2


def make_case(gm, *inputs):
    store = TensorStore()
    return from_graph_module(gm, list(inputs), store), store


def _case():
    torch.manual_seed(0)
    return make_case(torch.fx.symbolic_trace(relu_and_dropout), torch.randn(8, 16))


def _spec(name, after="dynamo", **config):
    spec = {"backend": {"kind": "named", "name": name}, "after": after, "check_accuracy": True,
            "config": {"fallback_random": True, **config}}
    if after == "aot":
        spec["aot"] = {"family": "torch:inductor" if name == "torch:inductor" else "tdbg", "graph": "inference"}
    return spec


def test_a_minifier_query_of_a_healthy_dropout_graph_passes():
    case, store = _case()
    for name in ("inductor", "torch:inductor"):
        out = evaluate(case.gm, store.values(case.inputs), _spec(name))
        assert out.kind == "pass", (name, out.report())


def test_an_aot_query_of_a_dropout_graph_compiles_with_eager_draws():
    """Before: Inductor's compile_fx_inner refused native_dropout (a false "Not reproduced" of
    every after-aot minify of a torch:inductor training graph with dropout)."""
    def aten_graph(x):    # as AOTAutograd writes it: functional native_dropout
        return torch.relu(x) * 3, torch.ops.aten.native_dropout.default(x.sin(), 0.5, True)[0] * 2
    torch.manual_seed(0)
    gm = make_fx(aten_graph)(torch.randn(8, 16))
    assert "native_dropout" in gm.code
    case, store = make_case(gm, torch.randn(8, 16))
    for name in ("inductor", "torch:inductor"):
        out = evaluate(case.gm, store.values(case.inputs), _spec(name, "aot"))
        assert out.kind == "pass", (name, out.report())


def test_a_wrong_op_beside_a_dropout_is_found_on_its_own_output():
    case, store = _case()
    out = evaluate(case.gm, store.values(case.inputs), _spec("inductor", inject_bug=["relu", "accuracy"]))
    assert (out.kind, out.outputs) == ("accuracy", ("out[0]",)), out.report()


def test_gradients_of_a_dropout_graph_are_compared_on_the_same_mask():
    torch.manual_seed(0)
    case, store = make_case(torch.fx.symbolic_trace(relu_and_dropout), torch.randn(8, 16, requires_grad=True))
    out = evaluate(case.gm, store.values(case.inputs), dict(_spec("inductor"), check_grads=True))
    assert out.kind == "pass", out.report()


def test_compare_judges_a_dropout_graph_on_eager_draws():
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    gm = make_fx(relu_and_dropout)(x)
    ok = compare_graph(gm, [x], "inductor", config=tconfig.current().replace(inject_bug=None))
    assert (ok.verdict, [o.diverges for o in ok.outputs]) == ("ok", [False, False])
    assert any("values computed from them are judged against eager alone" in n for n in ok.notes)
    bad = compare_graph(gm, [x], "inductor", config=tconfig.current().replace(inject_bug=("relu", "accuracy")))
    assert (bad.verdict, bad.culprit.op, [o.diverges for o in bad.outputs]) == ("culprit", "aten.relu", [True, False])


def test_replay_with_another_backend_draws_the_saved_runs_eager_numbers(tmp_path):
    from tdbg.minifier.artifacts.saved_io import Writer, load_graph
    from tdbg.minifier.diagnose.replay import replay
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    gm = make_fx(relu_and_dropout)(x)
    rng = torch.get_rng_state()
    expected = list(gm(x))
    writer = Writer(str(tmp_path / "io"), {"backend": "torch:aot_eager", "script": "s.py", "after": "dynamo", "threads": 1})
    writer.add(kind="dynamo", graph=0, call=1, gm=gm, inputs=[x], expected=expected, compiled=expected,
               compiled_error=None, node_sources={}, signature="s", rng_state=rng,
               replay={"backend": {"kind": "named", "name": "torch:aot_eager"}, "after": "dynamo",
                       "config": {"fallback_random": True}})
    result = replay(load_graph(str(tmp_path / "io"), "g0_dynamo_c1"), "inductor")
    assert (result.status, result.config) == ("ok", {"fallback_random": True}), result.error


def test_a_graph_holding_prims_fma_loads_in_a_process_that_never_imported_inductor(tmp_path):
    """Inductor's softmax-backward decomposition writes prims.fma, an op `import torch` does not
    define: replay, diff, compare and repro.py could not read such a saved backward graph."""
    source = tmp_path / "graph.py"
    source.write_text("import torch\n\n\nclass Repro(torch.nn.Module):\n"
                      "    def forward(self, a, b, c):\n"
                      "        fma = torch.ops.prims.fma.default(a, b, c);  a = b = c = None\n"
                      "        return (fma,)\n")
    code = ("import importlib.util, sys, torch\n"
            "assert 'torch._inductor.inductor_prims' not in sys.modules\n"
            "from tdbg.repro_templates.runtime import trace_repro\n"
            f"spec = importlib.util.spec_from_file_location('g', {str(source)!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "gm = trace_repro(m.Repro())\n"
            "x = torch.tensor([2.0])\n"
            "print([str(n.target) for n in gm.graph.nodes if n.op == 'call_function'], gm(x, x, x)[0].item())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['prims.fma.default'] 6.0"


def erf_after_dropout(x):
    return (torch.erf(torch.nn.functional.dropout(x, 0.1, training=True)) * 2,)


def test_a_wrong_op_after_a_dropout_is_the_culprit_not_a_fusion():
    """Nodes computed from random draws were left out of the node comparison: an erf bug after
    BERT's embedding dropout read as `DIVERGES WHEN FUSED` (bisect named erf). The compiled run
    draws eager's numbers, so they are compared, against eager alone."""
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    gm = make_fx(erf_after_dropout)(x)
    ok = compare_graph(gm, [x], "inductor", config=tconfig.current().replace(inject_bug=None))
    assert (ok.verdict, [n.name for n in ok.nodes]) == ("ok", ["empty_like", "mul", "erf", "mul_1"])
    bad = compare_graph(gm, [x], "inductor", config=tconfig.current().replace(inject_bug=("erf", "accuracy")))
    assert (bad.verdict, bad.culprit.op) == ("culprit", "aten.erf")
