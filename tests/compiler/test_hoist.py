"""Weight-only work hoisted out of inference graphs (compiler/hoist.py): which nodes move, that
they run once per weight version, and that every change to a weight is seen.

Every answer is checked against the module run eagerly in float64."""
import logging
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from helpers import compile_capturing
from tdbg.compiler import compile_aten
from tdbg.compiler.config import current

F = torch.nn.functional


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class CatOfWeights(torch.nn.Module):
    """MobileBERT's vocabulary projection: x @ cat([decoder.weight.t(), dense.weight])."""
    def __init__(self):
        super().__init__()
        self.decoder = torch.nn.Linear(16, 24, bias=False)
        self.dense = torch.nn.Parameter(randn(8, 24, seed=1))

    def forward(self, x):
        return x @ torch.cat([self.decoder.weight.t(), self.dense], dim=0)


class Linear(torch.nn.Module):
    """W.t() alone is a view: nothing to hoist (prepack.py packs the input itself)."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(24, 8)

    def forward(self, x):
        return self.lin(x)


class ScaledBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("log_scale", randn(24, seed=2))

    def forward(self, x):
        return x * self.log_scale.exp() + 1


class ReturnsWeightWork(torch.nn.Module):
    """w * 2 is returned: it stays in the graph, so no output aliases the cache."""
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(randn(24, seed=3))

    def forward(self, x):
        w2 = self.w * 2
        return x + w2, w2


class ReturnsViewOfWeightWork(torch.nn.Module):
    """A view of w * 2 is returned: w * 2 is computed in the graph (the view would alias the
    cache), and so is the other view, read by the add (a view does no work worth hoisting)."""
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(randn(4, 6, seed=3))

    def forward(self, x):
        w2 = self.w * 2
        return x + w2.reshape(24), w2.t()


class ActivationCat(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(randn(4, 24, seed=4))

    def forward(self, x):
        return torch.cat([x, self.w]).sum(0)


class RandomOnWeight(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(randn(24, seed=5))

    def forward(self, x):
        return x + (self.w + torch.rand_like(self.w)) * 0


# name, module, the frontier: the FX nodes the main graph reads as inputs instead of computing
CASES = [
    ("cat of weights", CatOfWeights, ["cat"]),
    ("linear", Linear, []),
    ("buffer", ScaledBuffer, ["exp"]),
    ("returned", ReturnsWeightWork, []),
    ("view returned", ReturnsViewOfWeightWork, []),
    ("activation", ActivationCat, []),
    ("random", RandomOnWeight, []),
]


def compiled_module(make, **cfg):
    module = make().eval()
    fn, graphs = compile_capturing(module, dynamo_dynamic=False, **cfg)
    return module, fn, graphs


def check(module, fn, x):
    with torch.no_grad():
        got = fn(x)
        ref = _float64(module)(x.double())
    got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.double(), r, rtol=1e-5, atol=1e-5)


def _float64(module):
    import copy
    return copy.deepcopy(module).double()


@pytest.mark.parametrize("name,make,frontier", CASES, ids=[c[0] for c in CASES])
def test_frontier(name, make, frontier):
    module, fn, graphs = compiled_module(make)
    x = randn(6, 24, seed=9)
    check(module, fn, x)
    [graph] = graphs
    assert (graph.hoist.names if graph.hoist else []) == frontier


def test_runs_once_per_weight_version():
    module, fn, graphs = compiled_module(CatOfWeights)
    x = randn(6, 24, seed=9)
    for _ in range(3):
        check(module, fn, x)
    hoist = graphs[0].hoist
    assert hoist.runs == 1
    with torch.no_grad():
        module.dense.mul_(-2)                       # in place under no_grad: a new version
    check(module, fn, x)
    assert hoist.runs == 2
    module.load_state_dict({k: v + 1 for k, v in module.state_dict().items()})
    check(module, fn, x)
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    module(x).sum().backward()
    opt.step()                                      # an optimizer step between inference calls
    check(module, fn, x)
    check(module, fn, x)
    assert hoist.runs == 4
    assert len(graphs) == 1


@pytest.mark.parametrize("make", [ReturnsWeightWork, ReturnsViewOfWeightWork])
def test_returned_value_is_fresh_each_call(make):
    module, fn, _ = compiled_module(make)
    x = randn(6, 24, seed=9)
    with torch.no_grad():
        fn(x)[1].zero_()                            # the caller owns what it got
    check(module, fn, x)


def test_off_switch():
    module, fn, graphs = compiled_module(CatOfWeights, hoist_weights=False)
    check(module, fn, randn(6, 24, seed=9))
    assert graphs[0].hoist is None


def test_inference_tensor_weights_are_read_every_call(caplog):
    """Weights made under inference_mode have no version: the hoisted values are recomputed on
    every call (a write is still seen), and the log says so once, with what it costs."""
    logger = logging.getLogger("tdbg.compiler")   # tdbg's channels stop at "tdbg": listen there
    logger.addHandler(caplog.handler)
    with torch.inference_mode(), caplog.at_level("WARNING", logger="tdbg.compiler"):
        module = CatOfWeights().eval()
        fn, graphs = compile_capturing(module, dynamo_dynamic=False)
        x = randn(6, 24, seed=9)
        fn(x)
        module.dense.mul_(3)                        # no version counter to see this by
        torch.testing.assert_close(fn(x), module(x), rtol=1e-5, atol=1e-5)
    logger.removeHandler(caplog.handler)
    assert graphs[0].hoist.runs == 2
    warnings = [r.getMessage() for r in caplog.records if "inference_mode" in r.getMessage()]
    assert len(warnings) == 1 and "recomputed on every call" in warnings[0], warnings


def cat_projection(x, w1, w2):
    return x @ torch.cat([w1.t(), w2])


def cat_graph(rows=6, k=16):
    """(graph of cat_projection, its inputs, the weights' placeholder names)."""
    x, w1, w2 = randn(rows, k + 8), randn(k + 8, k, seed=1), randn(8, k + 8, seed=2)
    gm = make_fx(cat_projection)(x, w1, w2)
    return gm, [x, w1, w2], [n.name for n in gm.graph.nodes if n.op == "placeholder"][1:]


def test_compile_aten_with_named_static_inputs():
    """Outside Dynamo (repro.py, the minifier) the static inputs are named by the caller."""
    gm, (x, w1, w2), names = cat_graph()
    f = cat_projection
    compiled = compile_aten(gm, [x, w1, w2], current(), static_inputs=names)
    assert compiled.hoist.names == ["cat"]
    torch.testing.assert_close(compiled(x, w1, w2), f(x, w1, w2), rtol=1e-5, atol=1e-5)
    assert compile_aten(gm, [x, w1, w2], current()).hoist is None   # nothing named: nothing hoisted


def test_hoisted_weight_is_packed():
    """A frontier value is an input like a weight: a linear by it runs on a packed copy."""
    from tdbg.compiler import prepack
    if not prepack.mkl_available():
        pytest.skip("torch built without MKL")

    gm, (x, w1, w2), names = cat_graph(rows=32, k=248)
    f = cat_projection
    compiled = compile_aten(gm, [x, w1, w2], current(), static_inputs=names)
    assert "_packed.linear(" in compiled.source_code
    torch.testing.assert_close(compiled(x, w1, w2).double(), f(x.double(), w1.double(), w2.double()),
                               rtol=1e-4, atol=1e-4)


def test_a_repro_compiles_the_graph_with_the_recorded_static_inputs():
    """repro.py / replay outside Dynamo: spec["aot"]["static_inputs"] (what the saved run's
    AOTAutograd said) makes the same split; older files without it hoist nothing."""
    from tdbg.repro_templates.runtime import compile_graph

    gm, (x, w1, w2), names = cat_graph()
    f = cat_projection
    spec = {"after": "aot", "aot": {"family": "tdbg", "graph": "inference", "static_inputs": names}}
    compiled = compile_graph(gm, [x, w1, w2], spec, ".")
    assert compiled.hoist.names == ["cat"]
    torch.testing.assert_close(compiled(x, w1, w2), f(x, w1, w2), rtol=1e-5, atol=1e-5)
    del spec["aot"]["static_inputs"]
    assert compile_graph(gm, [x, w1, w2], spec, ".").hoist is None
