"""Compiler bugs found by the OpInfo sweep and the acceptance tests, one test each.

A known, not yet fixed bug is marked `xfail(strict=True)`; once fixed, strict xfail fails the test
until the marker is removed, and the test then guards the fix.
"""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from helpers import assert_matches, check_model
from tdbg.compiler import compile_aten
from tdbg.compiler.config import Config
from tdbg.compiler.errors import LoweringError


def _quantile_indices(x):
    m = x * 0.5
    m.masked_fill_(m < 0, 0)
    frac = m - m.to(torch.int64)
    m.ceil_()
    return frac, m


def test_non_functional_graph_is_computed_right_or_rejected():
    """make_fx without functionalization keeps masked_fill_/ceil_ (AOT graphs never contain them).
    Found via nanquantile: memory planning recycled a buffer an in-place extern call still aliased
    (fixed in 2a48900)."""
    x = torch.tensor([-1.0, 0.3, 2.6])
    gm = make_fx(_quantile_indices)(x)
    assert {"masked_fill_.Scalar", "ceil_.default"} <= {n.target._opname + "." + n.target._overloadname
                                                       for n in gm.graph.nodes if n.op == "call_function"}
    try:
        compiled = compile_aten(gm, [x.clone()], Config())
    except LoweringError:
        return
    assert_matches(_quantile_indices(x.clone()), compiled(x.clone()))


def test_linalg_inv_with_effect_tokens():
    """The wrapper once printed the effect-token HOP with_effects as torch.ops.with_effects and
    its OpOverload argument as <OpOverload(...)>: a SyntaxError for every linalg.* op."""
    torch.manual_seed(0)
    check_model(torch.linalg.inv, [torch.randn(4, 4) + 4 * torch.eye(4)])
