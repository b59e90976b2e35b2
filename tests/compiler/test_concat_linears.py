"""Linears that read one input run as one GEMM (compiler/concat_linears.py): which linears are
grouped, that answers and output strides hold (float64 reference), that the concatenated weights
follow a weight's in-place change, and the switches that turn it off."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, concat_linears
from tdbg.compiler.config import current

from helpers import compile_capturing

F = torch.nn.functional


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def qkv(x, wq, bq, wk, bk, wv, bv):
    q, k, v = (F.linear(x, w, b).view(1, 16, 2, 32).transpose(1, 2) for w, b in ((wq, bq), (wk, bk), (wv, bv)))
    return F.scaled_dot_product_attention(q, k, v).sum()


def gate_up(x, wg, wu):
    return F.silu(F.linear(x, wg)) * F.linear(x, wu)


def bias_and_none(x, w1, b1, w2):
    return F.linear(x, w1, b1) + F.linear(x, w2)


def two_inputs(x, y, w1, b1, w2, b2):
    return F.linear(x, w1, b1) + F.linear(y, w2, b2)


def returned(x, wq, bq, wk, bk):
    return F.linear(x, wq, bq), F.linear(x, wk, bk)


def two_groups(x, y, w1, b1, w2, b2, w3, w4):
    return (F.linear(x, w1, b1) + F.linear(x, w2, b2)).sum() + (F.linear(y, w3) * F.linear(y, w4)).sum()


def _w(n, k, seed):
    return randn(n, k, seed=seed, scale=0.1)


X3, X2, Y2 = randn(1, 16, 64), randn(16, 64), randn(16, 64, seed=9)
# name, fn, inputs, positions of the parameters (static inputs), expected groups (kind, size)
CASES = [
    ("q k v with biases", qkv, (X3, _w(64, 64, 1), randn(64, seed=2), _w(64, 64, 3), randn(64, seed=4),
                                _w(64, 64, 5), randn(64, seed=6)), range(1, 7), [("addmm", 3)]),
    ("gate and up, no biases", gate_up, (X2, _w(96, 64, 1), _w(96, 64, 2)), (1, 2), [("mm", 2)]),
    ("one with a bias, one without", bias_and_none, (X2, _w(64, 64, 1), randn(64, seed=2), _w(64, 64, 3)),
     (1, 2, 3), []),
    ("two inputs", two_inputs, (X2, Y2, _w(64, 64, 1), randn(64, seed=2), _w(64, 64, 3), randn(64, seed=4)),
     (2, 3, 4, 5), []),
    ("weights not parameters", gate_up, (X2, _w(96, 64, 1), _w(96, 64, 2)), (), []),
    ("outputs returned", returned, (X2, _w(48, 64, 1), randn(48, seed=2), _w(80, 64, 3), randn(80, seed=4)),
     range(1, 5), [("addmm", 2)]),
    ("two groups", two_groups, (X2, Y2, _w(64, 64, 1), randn(64, seed=2), _w(64, 64, 3), randn(64, seed=4),
                                _w(32, 64, 5), _w(32, 64, 6)), range(2, 8), [("addmm", 2), ("mm", 2)]),
]
IDS = [c[0] for c in CASES]


def graph_and_statics(fn, inputs, positions):
    gm = make_fx(fn)(*inputs)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, [names[i] for i in positions]


def gemms(gm):
    return sorted((str(n.target.overloadpacket.__name__), n.args[-1].meta["val"].shape[1])
                  for n in gm.graph.nodes if n.op == "call_function"
                  and n.target in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default))


@pytest.mark.parametrize("name,fn,inputs,positions,groups", CASES, ids=IDS)
def test_which_linears_are_grouped(name, fn, inputs, positions, groups):
    gm, statics = graph_and_statics(fn, inputs, positions)
    found = concat_linears._groups(gm.graph, set(statics))
    assert sorted((concat_linears.LINEARS[g[0].target], len(g)) for g in found) == sorted(groups)
    new = concat_linears.concat_linears(gm, list(inputs), current(), "inference", statics)
    assert (new is not gm) == bool(groups)
    linears = len(gemms(gm))
    assert len(gemms(new)) == linears - sum(size - 1 for _, size in groups)
    assert len(gemms(gm)) == linears   # the caller's graph is left as it was


@pytest.mark.parametrize("name,fn,inputs,positions,groups", CASES, ids=IDS)
def test_the_answer_and_output_strides_hold(name, fn, inputs, positions, groups):
    gm, statics = graph_and_statics(fn, inputs, positions)
    compiled = compile_aten(gm, list(inputs), current(), static_inputs=statics)
    got = compiled(*inputs)
    got = got if isinstance(got, (tuple, list)) else (got,)
    eager = fn(*inputs)
    eager = eager if isinstance(eager, tuple) else (eager,)
    ref = fn(*[x.double() for x in inputs])
    ref = ref if isinstance(ref, tuple) else (ref,)
    for g, e, r in zip(got, eager, ref):
        assert g.stride() == e.stride()
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)
    # each group's weights are concatenated once per weight version, not per call
    hoisted = compiled.hoist.names if compiled.hoist else []
    assert sum(name.startswith("cat") for name in hoisted) == sum(2 if kind == "addmm" else 1 for kind, _ in groups)


@pytest.mark.parametrize("change", ["concat_linears", "hoist_weights"])
def test_off_switches_leave_the_graph_alone(change):
    name, fn, inputs, positions, groups = CASES[0]
    gm, statics = graph_and_statics(fn, inputs, positions)
    assert concat_linears.concat_linears(gm, list(inputs), current().replace(**{change: False}),
                                         "inference", statics) is gm
    assert concat_linears.concat_linears(gm, list(inputs), current(), "forward", statics) is gm


class Attention(torch.nn.Module):
    def __init__(self, h=256):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.q, self.k, self.v = (torch.nn.Linear(h, h) for _ in range(3))
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=gen) * 0.05

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (lin(x).view(b, s, 4, h // 4).transpose(1, 2) for lin in (self.q, self.k, self.v))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, h)


def test_a_module_runs_one_gemm_and_follows_a_weight_change():
    """Q, K and V of a module compiled by Dynamo run as one GEMM over the concatenated weights;
    after an in-place write to one weight the concatenation is made again (the answer follows)."""
    m = Attention().eval()
    x = randn(2, 32, 256, seed=7)
    fn, graphs = compile_capturing(m, dynamo_dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-5)
        m.k.weight.mul_(-2.0)
        torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-5)
    [graph] = graphs
    assert graph.hoist.runs == 2
    gemm_lines = [line for line in graph.source_code.splitlines() if "# FX: addmm" in line or "# FX: mm" in line]
    assert len(gemm_lines) == 1, gemm_lines


def test_a_graph_fake_tensors_cannot_run_is_left_alone(monkeypatch):
    """The strides are recomputed on fake tensors; where that fails (an op with a data-dependent
    output) the graph is compiled as it was, never half rewritten."""
    from tdbg.compiler import layout

    def fails(graph, example_inputs):
        raise RuntimeError("data-dependent output")
    monkeypatch.setattr(layout, "propagate", fails)
    name, fn, inputs, positions, groups = CASES[0]
    gm, statics = graph_and_statics(fn, inputs, positions)
    assert concat_linears.concat_linears(gm, list(inputs), current(), "inference", statics) is gm


def shared_layers(x, w1, b1, w2, b2):
    """Two layers with one set of weights (ALBERT's layers share theirs)."""
    h = F.linear(x, w1, b1) + F.linear(x, w2, b2)
    return F.linear(h, w1, b1) * F.linear(h, w2, b2)


def test_groups_of_the_same_weights_share_one_concatenation():
    inputs = (X2, _w(64, 64, 1), randn(64, seed=2), _w(64, 64, 3), randn(64, seed=4))
    gm, statics = graph_and_statics(shared_layers, inputs, range(1, 5))
    assert len(concat_linears._groups(gm.graph, set(statics))) == 2
    new = concat_linears.concat_linears(gm, list(inputs), current(), "inference", statics)
    cats = [n for n in new.graph.nodes if n.target == torch.ops.aten.cat.default]
    assert len(cats) == 2 and len(gemms(new)) == 2            # one weight cat, one bias cat, two GEMMs
    compiled = compile_aten(gm, list(inputs), current(), static_inputs=statics)
    assert sorted(compiled.hoist.names) == ["cat_default", "cat_default_1"]
    got = compiled(*inputs)
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got.double(), shared_layers(*[x.double() for x in inputs]), rtol=1e-4, atol=1e-4)
