"""Linear + exact GELU as one oneDNN call with GELU as its post-op (compiler/linear_gelu.py):
which linears are fused, that the fused call runs on a weight reordered once, and that its
answer is as close to float64 as eager's own float32 GELU is."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, linear_gelu, lowering, prepack
from tdbg.compiler.config import CPU_VENDORS, current
from tdbg.compiler.decompositions import decomposition_table

F = torch.nn.functional
pytestmark = pytest.mark.skipif(not (linear_gelu.available() and prepack.mkldnn_available()),
                                reason="torch built without oneDNN")
ROWS = linear_gelu.FUSE_WHEN[0][0]


def compile_fn(fn, *inputs, kind="inference", **cfg):
    """`fn` compiled for a CPU the fusion pays on (FUSE_CPUS' first) unless `cfg` names another."""
    lowering.reset_counters()
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    return compile_aten(gm, list(inputs), current().replace(**{"cpu_vendor": linear_gelu.FUSE_CPUS[0], **cfg}),
                        kind=kind)


def randn(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def mlp(x, w1, b1, w2, b2):
    """A transformer MLP on [B, T, C]: the GELU reads the first linear through a view."""
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def gelu_and_more(x, w1, b1, w2, b2):
    """The first linear's output is also read by something other than the GELU: not fused."""
    h = F.linear(x, w1, b1)
    return F.linear(F.gelu(h), w2, b2), h.sum()


def tanh_gelu(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


def inputs(rows, c=48, hidden=192):
    return (randn(2, rows // 2, c), randn(hidden, c, seed=1, scale=0.2), randn(hidden, seed=2),
            randn(c, hidden, seed=3, scale=0.1), randn(c, seed=4))


FUSED = "_packed.dnn_linear(0, "


def fused_in(src: str) -> bool:
    """The fused call, not a plain oneDNN linear (an AMD CPU's wide linears run on oneDNN too)."""
    return FUSED in src and "'gelu')" in src


# (name, fn, inputs, config changes, kind, fused)
CASES = [
    ("mlp", mlp, inputs(ROWS), {}, "inference", True),
    ("another reader", gelu_and_more, inputs(ROWS), {}, "inference", False),
    ("tanh GELU", tanh_gelu, inputs(ROWS), {}, "inference", False),
    ("linear_gelu off", mlp, inputs(ROWS), {"linear_gelu": False}, "inference", False),
    ("pack_weights off", mlp, inputs(ROWS), {"pack_weights": False}, "inference", False),
    ("training graph", mlp, inputs(ROWS), {}, "training", False),
] + [(f"{cpu} CPU", mlp, inputs(ROWS), {"cpu_vendor": cpu}, "inference", cpu in linear_gelu.FUSE_CPUS)
     for cpu in CPU_VENDORS]


def fuses(rows, weight_elements) -> bool:
    return any(rows >= r and (most is None or weight_elements <= most) for r, most in linear_gelu.FUSE_WHEN)


def table_cases():
    """Each FUSE_WHEN row at its row count, two rows fewer, and (with a most) a weight just larger."""
    for r, most in linear_gelu.FUSE_WHEN:
        yield r, 48, 192
        yield r - 2, 48, 192
        if most is not None:
            yield r, 257, most // 256 + 1    # 257 * (most / 256 + 1) > most


@pytest.mark.parametrize("name,fn,args,cfg,kind,fused", CASES, ids=[c[0] for c in CASES])
def test_which_linear_gelu_is_fused(name, fn, args, cfg, kind, fused):
    compiled = compile_fn(fn, *args, kind=kind, **cfg)
    src = compiled.source_code
    assert fused_in(src) == fused, src[src.index("def call"):]
    assert ("tdbg_erf(" in src) == (not fused and fn is not tanh_gelu)   # the GELU kernel is gone
    got, want = compiled(*args), fn(*args)
    for g, w in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows,c,hidden", list(table_cases()))
def test_which_row_counts_and_weights_fuse(rows, c, hidden):
    args = inputs(rows, c, hidden)
    compiled = compile_fn(mlp, *args)
    assert fused_in(compiled.source_code) == fuses(rows, c * hidden), (rows, c, hidden)
    torch.testing.assert_close(compiled(*args), mlp(*args), rtol=1e-4, atol=1e-4)


def test_fused_answer_is_as_close_to_float64_as_eagers():
    """oneDNN's erf is not eager's; per value, its error against float64 stays within eager's
    own float32 error plus one float32 ulp of the value."""
    args = inputs(ROWS, c=96, hidden=384)
    x, w1, b1 = args[:3]
    fn = lambda x, w1, b1: F.gelu(F.linear(x, w1, b1)) * 1.0   # noqa: E731 (a reader after the GELU)
    compiled = compile_fn(fn, x, w1, b1)
    assert fused_in(compiled.source_code)
    got, eager = compiled(x, w1, b1), fn(x, w1, b1)
    ref = fn(x.double(), w1.double(), b1.double())
    ulp = torch.finfo(torch.float32).eps * ref.abs().clamp_min(torch.finfo(torch.float32).tiny)
    slack = (eager.double() - ref).abs() + ulp
    assert ((got.double() - ref).abs() <= slack).all()


def test_the_fused_call_packs_once_and_follows_a_written_weight(monkeypatch):
    args = list(inputs(ROWS))
    compiled = compile_fn(mlp, *args)
    made, real = [], torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", lambda w, *a: made.append(w.shape) or real(w, *a))
    for _ in range(2):
        torch.testing.assert_close(compiled(*args), mlp(*args), rtol=1e-5, atol=1e-5)
    assert made == [(192, 48)]
    with torch.no_grad():
        args[1].mul_(0.5)      # an in-place write: the reordered copy is remade
    torch.testing.assert_close(compiled(*args), mlp(*args), rtol=1e-5, atol=1e-5)
    assert made == [(192, 48)] * 2


def test_weights_made_under_inference_mode_are_not_reordered_every_call(monkeypatch):
    """An inference tensor has no version counter to tell an in-place write by, so a reordered
    copy would be remade on every call: the fused call runs addmm and aten's GELU instead."""
    with torch.inference_mode():
        args = [a.clone() for a in inputs(ROWS)]
    compiled = compile_fn(mlp, *args)
    assert fused_in(compiled.source_code)
    made, real = [], torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", lambda w, *a: made.append(w.shape) or real(w, *a))
    with torch.inference_mode():
        for _ in range(2):
            torch.testing.assert_close(compiled(*args), mlp(*args), rtol=1e-5, atol=1e-5)
    assert made == []
