"""A compiled graph's `call` runs no Python function per op once warm: only its prologue's
`PackedWeights.take` and `BufferPool.take`, which run none themselves (wrapper.py's `_prologue`).

Why it matters: CPython 3.11 and 3.12 free a frame-stack chunk as soon as the frame at its base
returns, so a frame that ends near a chunk's end maps and unmaps a chunk for every Python function
it calls (CPython issue 142183). Whether the graph's frame lands there depends on how deep the
user's call is; MobileNetV2's graph paid 208 mmap/munmap pairs a call from one call site (about
10% of its time on the 2-core AMD EPYC, 2026-11-27) while it called Python helpers per op."""
import sys

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering, prepack
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table

F = torch.nn.functional
pytestmark = pytest.mark.skipif(not (prepack.mkl_available() and prepack.mkldnn_available()),
                                reason="torch built without MKL / oneDNN")


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def convs(x, w1, b1, w2, b2, w3):
    """MobileNet's pattern: a convolution, a depthwise one, a pointwise one, ReLU6 between."""
    y = F.relu6(F.conv2d(x, w1, b1, padding=1))
    y = F.relu6(F.conv2d(y, w2, b2, padding=1, groups=32))
    return F.conv2d(y, w3)


def linears(x, w1, b1, w2):
    return F.linear(F.relu(F.linear(x, w1, b1)), w2)


def view_at_offset(x, w):
    return torch.mm(x[1:], w)   # an input viewed at an offset: once the Python helper _as_strided


# (name, fn, inputs, config) -- each graph's steady state must enter exactly the `expected` Python functions
CASES = [
    ("convolutions, pooled buffers", convs,
     (randn(2, 16, 64, 64), randn(32, 16, 3, 3, seed=1, scale=0.1), randn(32, seed=2),
      randn(32, 1, 3, 3, seed=3, scale=0.3), randn(32, seed=4), randn(16, 32, 1, 1, seed=5, scale=0.2)), {}),
    ("MKL linears", linears, (randn(64, 256), randn(512, 256, seed=1, scale=0.05), randn(512, seed=2),
                              randn(256, 512, seed=3, scale=0.05)), {"cpu_vendor": "intel"}),
    ("oneDNN linear", linears, (randn(16, 64), randn(8192, 64, seed=1, scale=0.1), randn(8192, seed=2),
                                randn(64, 8192, seed=3, scale=0.01)), {"cpu_vendor": "amd"}),
    ("view at an offset", view_at_offset, (randn(5, 8), randn(8, 5, seed=1)), {}),
]


def python_calls(compiled, inputs) -> list:
    """(function name, file name) of every Python function run while the graph's `call` runs."""
    seen, depth = [], []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "call" and "GRAPH" in frame.f_globals:
            depth.append(frame)
        elif event == "return" and depth and frame is depth[-1]:
            depth.pop()
        elif event == "call" and depth:
            seen.append((frame.f_code.co_name, frame.f_code.co_filename.rsplit("/", 1)[-1]))

    sys.setprofile(profile)
    try:
        compiled(*inputs)
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("name,fn,inputs,cfg", CASES, ids=[c[0] for c in CASES])
def test_a_warm_call_enters_only_the_prologue(name, fn, inputs, cfg):
    lowering.reset_counters()
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    compiled = compile_aten(gm, list(inputs), current().replace(**cfg), kind="inference")
    for _ in range(2):   # the first call packs the weights and allocates the pool's storages
        got = compiled(*inputs)
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got.double(), fn(*[x.double() for x in inputs]), rtol=1e-4, atol=1e-4)
    source = compiled.source_code
    expected = [("take", "prepack.py")] * ("_packed.take(" in source) + [("take", "wrapper.py")] * ("_pool.take(" in source)
    assert python_calls(compiled, inputs) == expected
    if fn is not view_at_offset:
        assert expected, "the case exercises no prologue"


def test_the_convolution_case_packs_and_pools_through_the_prologue():
    """The first case is what the test above is about: packed convolutions and pooled buffers."""
    _, fn, inputs, cfg = CASES[0]
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    source = compile_aten(gm, list(inputs), current().replace(**cfg), kind="inference").source_code
    assert source.count("_packed.conv(") == 3 and "_packed.take((" in source and "_pool.take((" in source
    assert " if _pk[2] is not None else _packed.conv(2, " in source
    assert " if _pl[0] is None else _pl[0]" in source


def test_a_weight_cache_hit_runs_no_python_function_per_tensor():
    """PerTensors.get serves every call of a graph with hoisted weight values (hoist.py), once
    per set of the graph's weights (MobileNetV2: 262 tensors)."""
    from tdbg.compiler.weight_cache import PerTensors

    def entered(n):
        cache, tensors = PerTensors(), [torch.ones(2) for _ in range(n)]
        cache.get(tensors, None, lambda: "made")
        seen = []
        sys.setprofile(lambda frame, event, arg: seen.append(frame.f_code.co_name) if event == "call" else None)
        try:
            assert cache.get(tensors, None, lambda: "made again") == "made"
        finally:
            sys.setprofile(None)
        return seen

    assert entered(64) == entered(1)


def test_a_freed_weight_takes_its_packed_calls_with_it():
    """PackedWeights.take keeps each call it made while its weight lives, and not longer."""
    import gc
    import weakref
    _, fn, inputs, cfg = CASES[1]   # MKL linears: their calls carry an alias of the weight
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    compiled = compile_aten(gm, list(inputs), current().replace(**cfg), kind="inference")
    x, w1, b1, w2 = inputs
    w1, w2 = w1.clone(), w2.clone()
    compiled(x, w1, b1, w2)
    freed = weakref.ref(w1)
    compiled(x, randn(*w1.shape, seed=7), b1, w2)
    del w1
    gc.collect()
    assert freed() is None
