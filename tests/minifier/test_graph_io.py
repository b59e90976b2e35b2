"""Graphs as source and inputs as content-hashed bytes."""
import hashlib

import pytest
import torch
import torch.fx as fx

from tdbg.minifier.artifacts.graph_io import (InputSpec, TensorStore, case_source, from_graph_module, tensor_sha256,
                                    trace_source)
from mincases import make_case


def test_sha256_is_hashlib_over_the_raw_bytes():
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    assert tensor_sha256(t) == hashlib.sha256(t.numpy().tobytes()).hexdigest()
    assert tensor_sha256(t.t()) == hashlib.sha256(t.t().contiguous().numpy().tobytes()).hexdigest()


def test_store_round_trip_keeps_values_strides_and_ints(tmp_path):
    store = TensorStore()
    ints = torch.tensor([[250, 3], [7, 9]], dtype=torch.uint8)
    strided = torch.arange(12.0).reshape(3, 4).t()
    specs = [store.spec("a", ints), store.spec("b", strided), store.spec("c", 3)]
    store.save(specs, str(tmp_path))
    names = sorted(p.name for p in (tmp_path / "inputs").iterdir())
    assert names == sorted(f"{s.sha}.bin" for s in specs[:2])
    for s in specs[:2]:
        assert hashlib.sha256((tmp_path / "inputs" / f"{s.sha}.bin").read_bytes()).hexdigest() == s.sha
    fresh = TensorStore()
    fresh.load(specs, str(tmp_path))
    a, b, c = fresh.values(specs)
    assert torch.equal(a, ints) and a.dtype == torch.uint8
    assert torch.equal(b, strided) and b.stride() == strided.stride()
    assert c == 3


def test_tampered_input_file_is_refused(tmp_path):
    store = TensorStore()
    spec = store.spec("a", torch.ones(3))
    store.save([spec], str(tmp_path))
    (tmp_path / "inputs" / f"{spec.sha}.bin").write_bytes(b"\0" * 12)
    try:
        TensorStore().load([spec], str(tmp_path))
    except ValueError as e:
        assert "SHA-256" in str(e)
    else:
        raise AssertionError("a file whose bytes do not match its name was accepted")


def test_source_round_trip_keeps_factory_calls_and_aten_ops():
    def fn(x):
        y = torch.ones(2, 3)
        return torch.ops.aten.neg.default(x + y), torch.ops.aten.max.dim(x, 1)[0]
    g = fx.Graph()
    x = g.placeholder("x")
    ones = g.call_function(torch.ones, (2, 3))
    add = g.call_function(torch.ops.aten.add.Tensor, (x, ones))
    neg = g.call_function(torch.ops.aten.neg.default, (add,))
    mx = g.call_function(torch.ops.aten.max.dim, (x, 1))
    first = g.call_function(__import__("operator").getitem, (mx, 0))
    g.output((neg, first))
    store = TensorStore()
    case = from_graph_module(fx.GraphModule(torch.nn.Module(), g), [torch.randn(2, 3)], store)
    back = trace_source(case_source(case))
    assert [n.target for n in back.graph.nodes if n.op == "call_function"] == \
        [torch.ones, torch.ops.aten.add.Tensor, torch.ops.aten.neg.default, torch.ops.aten.max.dim,
         __import__("operator").getitem]
    x = torch.randn(2, 3)
    for a, b in zip(back(x), case.gm(x)):
        assert torch.equal(a, b)


def test_get_attr_tensors_stay_constants_of_the_graph():
    """Inline constants stay inline (a backend compiles a constant unlike an input), with their values."""
    class M(torch.nn.Module):
        def __init__(self, value=3.0):
            super().__init__()
            self.w = torch.nn.Parameter(torch.full((2,), value))

        def forward(self, x):
            return x * self.w
    store = TensorStore()
    case = from_graph_module(fx.symbolic_trace(M()), [torch.ones(2)], store)
    assert [s.name for s in case.inputs] == ["x"]
    assert [(n.op, n.target) for n in case.gm.graph.nodes][:2] == [("placeholder", "x"), ("get_attr", "w")]
    [w] = case.constants
    assert torch.equal(store.value(w).detach(), torch.full((2,), 3.0)) and w.requires_grad
    assert torch.equal(case.gm.w.detach(), torch.full((2,), 3.0))
    other = from_graph_module(fx.symbolic_trace(M(4.0)), [torch.ones(2)], store)
    assert other.key != case.key     # a constant's value is part of what a verdict is cached for


def test_case_key_depends_on_graph_and_inputs():
    a, _ = make_case(lambda x: torch.neg(x), torch.ones(2))
    b, _ = make_case(lambda x: torch.neg(x), torch.zeros(2))
    c, _ = make_case(lambda x: torch.sin(x), torch.ones(2))
    assert len({a.key, b.key, c.key}) == 3
    assert a.key == make_case(lambda x: torch.neg(x), torch.ones(2))[0].key


def test_input_spec_describe():
    assert InputSpec("x", "s", (2, 3), (3, 1), "torch.float32").describe() == "x: float32[2, 3]"
    assert InputSpec("n", value=4).describe() == "n=4"


def test_inputs_with_equal_bytes_but_other_dtype_shape_or_strides_stay_apart(tmp_path):
    # float32 zeros(4), int32 zeros(4) and float32 zeros(2, 2) have the same 16 bytes
    store = TensorStore()
    base = torch.arange(4.0).reshape(2, 2)
    values = [torch.zeros(4), torch.zeros(4, dtype=torch.int32), torch.zeros(2, 2), base, base.t().contiguous().t()]
    specs = [store.spec(f"x{i}", v) for i, v in enumerate(values)]
    store.save(specs, str(tmp_path))
    for s2 in (store, TensorStore()):
        s2.load(specs, str(tmp_path))
        got = s2.values(specs)
        assert [(g.dtype, tuple(g.shape), g.stride()) for g in got] == \
            [(v.dtype, tuple(v.shape), v.stride()) for v in values]
        assert all(torch.equal(g, v) for g, v in zip(got, values))
    assert len({s.sha for s in specs[:3]}) == 1 and len({s.key for s in specs}) == 5


@pytest.mark.parametrize("make", [
    lambda: torch.arange(16).reshape(1, 16).expand(2, 16),          # BERT's token-type ids buffer
    lambda: torch.randn(3, 1, 4).expand(3, 5, 4),                   # stride 0 in the middle
    lambda: torch.randn(4, 6).t(),                                  # no stride 0: copied as before
    lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
])
def test_tensors_come_back_with_their_strides_even_expanded_ones(make):
    """An expanded tensor (stride 0: elements share memory) cannot be copied into its layout; it
    is rebuilt from one slice. It made `tdbg compare` of a transformers BERT exit 3 ("does not
    describe"), and a repro with such an input could not run."""
    from tdbg.minifier.artifacts.graph_io import tensor_bytes, tensor_from_bytes
    x = make()
    back = tensor_from_bytes(tensor_bytes(x), InputSpec("x", "", tuple(x.shape), tuple(x.stride()), str(x.dtype)))
    assert back.stride() == x.stride() and torch.equal(back, x)
