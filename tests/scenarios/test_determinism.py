"""`tdbg run --check-determinism`: a user backend nondeterministic in one op (its whole-tensor sum
comes out one ulp apart on consecutive calls, as a parallel reduction's may) is named at its graph,
FX node and line with exit code 24; tdbg's compiler on a training step with dropout (fixed seed) is
deterministic (its kernels are those test_run_checks.py's dropout run compiles: build-cache hits).
Plus the comparison itself, in process: bit equality (NaN payloads, signed zeros), the verdicts
keeping eager's nondeterminism apart, the RNG state left as it was, a backend whose random numbers
ignore torch's seed told apart by its reason, values that cannot be compared left unchecked, and
localization in the Dynamo graph, the aten graph and to a kernel."""
import os
import re
import sys

import pytest
import torch

from tdbg.cli.console import exit_code
from tdbg.minifier.diagnose import determinism
from tdbg.minifier.diagnose.determinism import check_graph, compare_values, first_differing_node

S = "tests/scenarios/scripts"
NONDET = f"{S}/nondeterministic_backends.py"
RUNS = {
    "shuffled_sum": (("run", f"{S}/nondeterministic_sum.py", "--backend", f"{NONDET}:shuffled_sum",
                      "--check-determinism"), {}),
    "dropout_tdbg": (("run", f"{S}/dropout_mlp.py", "--backend", "inductor", "--check-determinism"), {}),
}
SUM_LINE = f"{S}/nondeterministic_sum.py:8 in f: total = h.sum()"


@pytest.fixture(scope="module")
def runs(tdbg_runs):
    tdbg_runs.start(*RUNS.values())
    return lambda name: tdbg_runs(*RUNS[name])


@pytest.fixture(scope="module")
def backends():
    sys.path.insert(0, S)
    try:
        import nondeterministic_backends
    finally:
        sys.path.remove(S)
    return nondeterministic_backends


# -- end to end ---------------------------------------------------------------------------------
def test_backend_nondeterministic_in_one_op_is_named_at_its_node_and_line(runs):
    r = runs("shuffled_sum")
    assert r.code == exit_code("nondeterministic") == 24, r.output
    assert ("FAILED tests/scenarios/scripts/nondeterministic_sum.py: a compiled graph gave different bits on two "
            "runs of the same inputs and RNG state (stage nondeterministic, exit code 24)") in r.stdout
    assert f"  source: {SUM_LINE}" in r.stdout and "  fx node: total (Tensor.sum)" in r.stdout
    v = r.json["verdict"]
    err, d = v["error"], v["graphs"][0]["determinism"]
    assert (v["stage"], err["graph"], err["call"], err["part"], err["fx_node"], err["source"]) == \
        ("nondeterministic", 0, 1, "forward", "total (Tensor.sum)", SUM_LINE)
    assert (d["verdict"], [x["path"] for x in d["compiled"]], d["eager"]) == ("backend", ["out[1]"], [])
    assert (d["compiled"][0]["elements"], d["first_node"]["random"], d["reason"]) == (1, False, None)
    assert 0 < d["compiled"][0]["max_abs"] < 1e-6     # float sums in two orders: last bits only
    assert (r.json["version"], r.json["options"]["check_determinism"]) == (2, True)


def test_html_section_names_the_node(runs):
    from tdbg.minifier.artifacts import report
    doc = runs("shuffled_sum").json
    html = report.build(doc, command="run", headline="FAILED")
    body = html.split('id="determinism-graphs"')[1].split("<tbody>")[1].split("</tbody>")[0]
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body)]
    # graph, frame, calls checked, verdict, compiled, eager, node, kernel, line
    assert (cells[0], cells[2], cells[3], cells[5], cells[6], cells[8]) == (
        "0", "1", "backend", "same bits", "total", SUM_LINE)


def test_random_numbers_that_ignore_torch_seed_are_the_reason(backends):
    def f(x):
        noisy = x + 4 * torch.rand_like(x) - 2
        return (torch.relu(noisy) * 2 + 1,)
    x = torch.linspace(-3, 3, 64).reshape(8, 8)
    found = check_graph(backends.own_random(_traced(f), [x]), _traced(f), [x],
                        localize_with=lambda s, i, rng: first_differing_node(s, i, backends.own_random, rng,
                                                                             kernels=False))
    assert (found.verdict, found.draws_random, found.first_node["node"], found.first_node["random"]) == \
        ("backend", True, "rand_like", True)
    assert found.reason == determinism.RANDOM_REASON


def test_tdbg_compiler_with_seeded_dropout_is_deterministic(runs):
    r = runs("dropout_tdbg")
    assert r.code == 0, r.output
    assert ("determinism checked on 1 of 1 graph(s) at 1 call(s) (each graph's first call and each call with new "
            "input shapes): the same bits on two compiled runs (gradients on 1)" in r.stdout), r.stdout
    d = r.json["verdict"]["graphs"][0]["determinism"]
    assert (d["verdict"], d["draws_random"], d["grads_checked"], d["compiled"], d["eager"]) == \
        ("deterministic", True, True, [], [])


# -- the comparison -----------------------------------------------------------------------------
def test_bit_equality_is_nan_aware_and_sees_signed_zeros():
    nan = torch.tensor([float("nan"), 1.0])
    assert compare_values("a", nan, nan.clone()) is None                  # torch.equal says False here
    other_nan = nan.view(torch.int32).clone()
    other_nan[0] += 1                                                      # another NaN payload
    assert compare_values("a", nan, other_nan.view(torch.float32)).elements == 1
    zeros = compare_values("z", torch.tensor([0.0, 2.0]), torch.tensor([-0.0, 2.0]))
    assert (zeros.elements, zeros.max_abs) == (1, 0.0)
    assert compare_values("s", torch.zeros(2), torch.zeros(3)).message == "torch.float32[2] then torch.float32[3]"
    assert compare_values("b", torch.tensor([True, False]), torch.tensor([True, True])).elements == 1
    c = compare_values("c", torch.tensor([1 + 1j, 2j]), torch.tensor([1 + 1j, 3j]))
    assert (c.elements, c.max_abs) == (1, 1.0)
    assert compare_values("i", 3, 3) is None and compare_values("i", 3, 4).message == "3 then 4"
    assert compare_values("h", torch.ones(2, dtype=torch.bfloat16), torch.ones(2, dtype=torch.bfloat16)) is None


def _counter_noise():
    calls = [0]

    def noise(x):
        calls[0] += 1
        return x + calls[0] * 1e-3
    return noise


def _traced(fn):
    return torch.fx.symbolic_trace(fn)


def test_verdicts_keep_eager_nondeterminism_apart():
    noise = _counter_noise()

    def stable(x):
        return (x * 2).sum()
    snap = _traced(stable)
    x = torch.randn(8)
    assert check_graph(snap, snap, [x]).verdict == "deterministic"
    assert check_graph(lambda a: noise(a), snap, [x]).verdict == "backend"
    noisy_eager = torch.fx.GraphModule({}, _graph_calling(noise))
    found = check_graph(lambda a: a * 2, noisy_eager, [x])
    assert (found.verdict, [d.path for d in found.eager], found.nondeterministic) == ("eager", ["out"], False)
    assert check_graph(noisy_eager, noisy_eager, [x]).verdict == "both"


def _graph_calling(fn):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(fn, (x,)))
    return g


def test_seeded_dropout_is_deterministic_and_rng_state_is_kept():
    def drop(x):
        return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand_like(x)
    snap = _traced(drop)
    torch.manual_seed(3)
    before = torch.get_rng_state()
    found = check_graph(snap, snap, [torch.ones(64)])
    assert (found.verdict, found.draws_random) == ("deterministic", True)
    assert torch.equal(torch.get_rng_state(), before)       # the user's own call draws what it would have


def test_first_differing_node_in_the_dynamo_graph(backends):
    def f(x):
        h = torch.tanh(x)
        total = h.sum()
        return h + total
    snap = _traced(f)
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    found = check_graph(backends.shuffled_sum(_traced(f), [x]), snap, [x],
                        localize_with=lambda s, i, rng: first_differing_node(s, i, backends.shuffled_sum, rng,
                                                                             kernels=False))
    assert (found.verdict, found.first_node["node"], found.first_node["op"], found.first_node["kernel"]) == \
        ("backend", "sum_1", "Tensor.sum", None)


def test_first_differing_node_in_the_aten_graph(backends):
    def f(x):
        return (torch.tanh(x).sum() * 3,)   # Dynamo graphs return tuples
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    localize = determinism.localizer(backends.aot_shuffled_sum, None)
    node = localize(_traced(f), [x], torch.get_rng_state())
    assert (node["node"], node["op"], node["level"], node["random"]) == ("sum_1", "aten.sum", "aten", False)


def test_kernel_of_the_first_differing_node_in_tdbg_code():
    """tdbg's compiler is deterministic, so its compiled graph is perturbed from outside in one
    realized value (tanh's): the kernel named is the one CompiledGraph.kernel_nodes lists for it."""
    from tdbg.compiler import compile_aten
    from tdbg.compiler.config import Config
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return (torch.tanh(x) * 2).sum(dim=1)
    x = torch.randn(16, 32)
    gm = make_fx(f)(x)
    noise, made = _counter_noise(), {}

    def compile_one(g, inputs):
        compiled = compile_aten(g, inputs, Config(), graph_name="det", kind="inference")
        at = [n.name for n in g.graph.find_nodes(op="output")[0].args[0]].index("tanh")

        def run(*args):
            outs = list(compiled(*args))
            outs[at] = noise(outs[at])
            return outs
        run.kernel_nodes, run.lowered_nodes = compiled.kernel_nodes, compiled.lowered_nodes
        made["kernels"] = compiled.kernel_nodes
        return run
    node = first_differing_node(gm, [x], compile_one, torch.get_rng_state())
    expected = next(k for k, names in made["kernels"].items() if "tanh" in names)
    assert (node["node"], node["op"], node["kernel"]) == ("tanh", "aten.tanh", expected)


def test_refused_with_options_that_would_save_its_extra_graphs(tmp_path):
    import importlib.util   # tests/cli's runner by path: `from conftest` gets whichever conftest came first
    spec = importlib.util.spec_from_file_location(
        "tdbg_cli_test_runner", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cli",
                                             "conftest.py"))
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    run_tdbg = runner.run_tdbg
    r = run_tdbg(["run", f"{S}/nondeterministic_sum.py", "--backend", "eager", "--check-determinism",
                  "--save-io", str(tmp_path / "io")])
    assert r.code == exit_code("usage"), r.output
    assert "--check-determinism compiles extra copies of each graph" in r.stderr


def _verdict_with(record: dict) -> dict:
    return {"status": "ok", "stage": None, "check_determinism": True, "check_policy": None,
            "graphs": [{"index": 0, "frame": "f", "determinism": record}, {"index": 1, "frame": "g"}]}


def _record(verdict: str, compiled: list, eager: list) -> dict:
    def diff(path):
        return {"path": path, "dtype": "torch.float32", "shape": [2], "elements": 1, "max_abs": 1e-7,
                "message": "1 of 2 element(s) differ bit for bit"}
    return {"graph": 0, "call": 1, "verdict": verdict, "nondeterministic": verdict in ("backend", "both"),
            "message": determinism.VERDICTS[verdict], "compiled": [diff(p) for p in compiled],
            "eager": [diff(p) for p in eager], "draws_random": False, "grads_checked": False,
            "first_node": {"node": "sum_1", "op": "aten.sum", "source": "f.py:3 in f: y = x.sum()",
                           "kernel": "cpp_fused_sum_0", "random": False, "level": "aten"} if compiled else None,
            "reason": None, "notes": [], "seconds": 0.01}


def test_eager_only_nondeterminism_keeps_the_run_ok_and_says_so():
    from tdbg.cli import determinism_view
    v = _verdict_with(_record("eager", [], ["out[0]"]))
    determinism_view.fail_if_nondeterministic(v)
    assert v["status"] == "ok"
    assert determinism_view.note_lines(v) == [
        ("eager nondeterministic", "graph 0: eager itself gave different bits on two runs (out[0]): eager is "
                                   "nondeterministic here, not the backend"),
        ("not checked", "graph 1: never called, so its determinism was not checked")]
    assert determinism_view.ok_text(v) == ("; determinism checked on 1 of 2 graph(s) at 1 call(s) (each graph's "
                                           "first call and each call with new input shapes): the same bits on "
                                           "two compiled runs (gradients on 0)")


def test_compiled_nondeterminism_fails_the_run_at_its_graph_node_and_kernel():
    from tdbg.cli import determinism_view
    from tdbg.cli.console import verdict_exit_code
    v = _verdict_with(_record("both", ["out[0]", "grad of x"], ["out[0]"]))
    determinism_view.fail_if_nondeterministic(v)
    err = v["error"]
    assert (v["stage"], verdict_exit_code(v), err["graph"], err["part"], err["fx_node"], err["kernel"],
            err["source"]) == ("nondeterministic", 24, 0, "forward", "sum_1 (aten.sum in the aten graph)",
                               "cpp_fused_sum_0", "f.py:3 in f: y = x.sum()")
    assert err["message"].splitlines()[0] == "graph 0 call 1: 2 value(s) differ between two compiled runs:"
    assert determinism.VERDICTS["both"] in err["message"]


def test_values_without_comparable_bits_are_unchecked_not_blamed():
    q = torch.empty(4, device="meta")    # no data: nothing to compare
    snap = torch.fx.GraphModule({}, _graph_calling(lambda a: q))
    found = check_graph(snap, snap, [torch.ones(4)])
    assert (found.verdict, found.nondeterministic) == ("unchecked", False)
    assert found.notes[0].startswith("the values could not be compared (")
