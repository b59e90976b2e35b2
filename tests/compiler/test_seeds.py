"""The seed programs under backend="tdbg" match eager (issue 2, "Done when")."""
import json

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from helpers import check_model
from tdbg.compiler import compile_aten
from tdbg.compiler.config import Config


def foo(x1, x2):
    a = torch.neg(x1)
    b = torch.maximum(x2, a)
    return torch.cat([b], dim=0)


def add_pattern(a, b, c, d):
    return (a + b + c) * d + a


def _uint8(*shape):
    return torch.randint(256, shape, dtype=torch.uint8)


@pytest.mark.parametrize("rows", [1, 8390])
def test_foo1_uint8_is_exact(rows):
    torch.manual_seed(0)
    x1, x2 = _uint8(1, 8), _uint8(rows, 8)
    out = check_model(foo, [x1, x2])
    # uint8 negation wraps around: -x == 256 - x (mod 256); exactness is what the seed is about
    assert torch.equal(out, torch.maximum(x2, (256 - x1.int()).remainder(256).to(torch.uint8)))


def test_foo2_float32():
    torch.manual_seed(0)
    check_model(foo, [torch.randn(1, 8), torch.randn(8390, 8)])


def test_add_add_mul_add_pattern():
    torch.manual_seed(0)
    check_model(add_pattern, [torch.randn(16384, 512) for _ in range(4)])


def test_linear_layernorm_relu():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.LayerNorm(40), torch.nn.ReLU()).eval()
    check_model(model, [torch.randn(12, 24)])


@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax(dim):
    torch.manual_seed(0)
    x = torch.randn(37, 53) * 8  # wide range: exercises the max subtraction
    check_model(lambda t: torch.softmax(t, dim=dim), [x])


def test_transformer_encoder_layer_eval():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64,
                                             dropout=0.1, batch_first=True).eval()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            check_model(layer, [torch.randn(2, 7, 32)])
    finally:
        torch.backends.mha.set_fastpath_enabled(True)


def test_neg_maximum_cat_fuses_into_one_kernel():
    torch.manual_seed(0)
    x1, x2 = _uint8(1, 8), _uint8(8390, 8)
    gm = make_fx(foo)(x1, x2)
    compiled = compile_aten(gm, [x1, x2], Config())
    assert compiled.kernels == ["cpp_fused_cat_maximum_neg_0"]
    assert list(compiled.fallback_targets) == []
    assert torch.equal(compiled(x1, x2), gm(x1, x2))


def test_neg_maximum_cat_through_dynamo_reports_one_kernel(tmp_path):
    report = tmp_path / "report.jsonl"
    torch.manual_seed(0)
    x1, x2 = _uint8(1, 8), _uint8(8390, 8)
    with Config.patch(report_path=str(report)):
        check_model(foo, [x1, x2])
    graphs = [json.loads(line) for line in report.read_text().splitlines()]
    assert len(graphs) == 1
    (kernel,) = graphs[0]["kernels"]
    assert kernel["name"].startswith("cpp_fused_") and kernel["name"].endswith("maximum_neg_0")
    assert graphs[0]["fallbacks"] == []
    assert {"neg", "maximum"} <= {n["fx_node"] for n in graphs[0]["lowered"]}
    assert {n["kernel"] for n in graphs[0]["lowered"]} == {kernel["name"]}
