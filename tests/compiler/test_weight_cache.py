"""Weight-derived values kept per set of live weight tensors (compiler/weight_cache.py): one
compiled graph serving several instances of a module class packs and hoists each instance's
weights once, and answers with each instance's own weights."""
import gc

import pytest
import torch
from torch._dynamo.utils import counters

from tdbg.compiler import hoist, prepack
from tdbg.compiler.weight_cache import PerTensors


def test_one_value_per_set_of_tensors_remade_on_a_write_dropped_when_freed():
    made = []
    cache = PerTensors()
    a, b = torch.ones(4), torch.zeros(4)
    get = lambda ts, extra=None: cache.get(ts, extra, lambda: made.append(len(made)) or len(made) - 1)  # noqa: E731
    assert [get((a,)), get((b,)), get((a,)), get((b,)), get((a, b))] == [0, 1, 0, 1, 2]
    a.add_(1)                                   # an in-place write bumps a's version
    assert [get((a,)), get((b,)), get((a, b))] == [3, 1, 4]
    assert get((b,), extra=8) == 5 and get((b,), extra=8) == 5
    del a
    gc.collect()
    assert len(cache) == 1 and cache.values() == [5]   # every entry that read `a` went with it


def test_at_most_max_entries_the_oldest_made_going_first(monkeypatch):
    from tdbg.compiler import weight_cache
    monkeypatch.setattr(weight_cache, "MAX_ENTRIES", 3)
    cache, ts = PerTensors(), [torch.full((2,), float(i)) for i in range(5)]
    for t in ts[:3]:
        cache.get((t,), None, lambda t=t: t[0].item())
    ts[0].add_(10)                                    # remade: now the newest
    assert cache.get((ts[0],), None, lambda: 10.0) == 10.0
    for t in ts[3:]:
        cache.get((t,), None, lambda t=t: t[0].item())
    assert cache.values() == [10.0, 3.0, 4.0]       # 1.0 and 2.0, the oldest made, went


def test_an_inference_tensor_is_remade_every_call():
    cache, made = PerTensors(), []
    with torch.inference_mode():
        w = torch.ones(3)
    for _ in range(3):
        cache.get((w,), None, lambda: made.append(1))
    assert len(made) == 3


class Block(torch.nn.Module):
    """Three linears of one input (concatenated into one GEMM: a hoisted cat) and an FFN."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(96, 96) for _ in range(3))
        self.up, self.down = torch.nn.Linear(96, 256), torch.nn.Linear(256, 96)

    def forward(self, x):
        h = x + self.q(x) * self.k(x).sigmoid() + self.v(x)
        return h + self.down(torch.relu(self.up(h)))


@pytest.mark.skipif(not prepack.mkl_available(), reason="torch built without MKL")
def test_layers_compiled_one_by_one_pack_and_hoist_each_layer_once(monkeypatch):
    """Regional compilation: Dynamo compiles Block.forward once and every layer calls that graph
    with its own weights. Each layer's weights are packed and concatenated once, not again on
    every call of the next layer (BERT-base: 60 packs per forward before)."""
    packs, hoists = [], []
    real_pack, real_pre = prepack._mkl_pack, hoist.Hoisted.run_pre
    monkeypatch.setattr(prepack, "_mkl_pack", lambda wt, rows: packs.append(rows) or real_pack(wt, rows))
    monkeypatch.setattr(hoist.Hoisted, "run_pre", lambda self, ws: hoists.append(1) or real_pre(self, ws))
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*(Block() for _ in range(3)))
    x = torch.randn(2, 16, 96)

    def eager():
        out = x
        for layer in layers:
            out = layer.forward(out)      # forward itself: Module.compile wraps the call, not forward
        return out
    torch._dynamo.reset()
    counters.clear()
    try:
        for layer in layers:
            layer.compile(backend="tdbg")
        with torch.no_grad():
            for _ in range(3):
                torch.testing.assert_close(layers(x), eager(), rtol=1e-4, atol=1e-4)
            assert counters["stats"]["unique_graphs"] == 1        # the premise: one graph, three layers
            # per layer: up, down and q|k|v packed, one cat hoisted; then nothing more
            assert (len(packs), len(hoists)) == (3 * 3, 3)
            layers[1].up.weight.mul_(0.5)                          # one layer's weight written in place
            torch.testing.assert_close(layers(x), eager(), rtol=1e-4, atol=1e-4)
            assert (len(packs), len(hoists)) == (3 * 3 + 1, 3)
    finally:
        torch._dynamo.reset()
