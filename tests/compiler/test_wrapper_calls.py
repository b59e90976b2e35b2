"""The wrapper's per-call path: aten overloads bound to torch's Python bindings only when the
binding can run nothing but that overload, and views spelled without a helper frame."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table
from tdbg.compiler.ir import Buffer, FixedLayout
from tdbg.compiler.aten_calls import op_table, python_binding

aten = torch.ops.aten
T = Buffer("t", FixedLayout((2, 2), (2, 1), torch.float32))   # any IR tensor argument


def compile_fn(fn, *inputs, decompose=True):
    lowering.reset_counters()
    gm = make_fx(fn, decomposition_table=decomposition_table(current()) if decompose else None)(*inputs)
    return compile_aten(gm, list(inputs), current())


# (overload, args, kwargs, out=, the binding python_binding must answer)
VERDICTS = [
    (aten.mm.default, (T, T), {}, False, "mm"),
    # mm.out / mm.dtype / mm.dtype_out: only .out takes `out` without an out_dtype
    (aten.mm.out, (T, T), {}, True, "mm"),
    (aten.addmm.default, (T, T, T), {"beta": 2.0}, False, "addmm"),
    (aten.as_strided.default, (T, [2, 2], [2, 1], 0), {}, False, "as_strided"),
    (aten.cumsum.default, (T, 1), {}, False, "cumsum"),
    (aten._scaled_dot_product_flash_attention_for_cpu.default, (T, T, T), {"attn_mask": T, "scale": 0.5},
     False, "_scaled_dot_product_flash_attention_for_cpu"),
    # scatter.value(self, dim, index, value: Scalar) vs scatter.src(..., src: Tensor): a number
    # might parse as a tensor for some ops, so the call is ambiguous and keeps the overload
    (aten.scatter.value, (T, 0, T, 1.0), {}, False, None),
    (aten.index.Tensor, (T, [T]), {}, False, None),                      # no torch.index builtin
    # a 0-dim tensor parses as a number: pow.Tensor_Scalar(self, Scalar exponent) may take the call
    (aten.pow.Tensor_Tensor, (T, T), {}, False, None),
    (aten.add_.Tensor, (T, T), {}, False, None),                         # mutates an input
    # mm.dtype_out needs out=, so torch.mm(a, b, torch.float32) can only be mm.dtype (exposed by torch.mm)
    (aten.mm.dtype, (T, T, torch.float32), {}, False, "mm"),
    (aten._scaled_dot_product_flash_attention_for_cpu_backward.default, (T,) * 7, {"scale": 0.5}, False, None),
    (aten.mm.default, (T, T, T), {}, False, None),                       # parses against no overload
    (aten.bernoulli.p, (T, 0.5), {}, False, None),          # 0.5 might parse as bernoulli.Tensor's p
    (aten.zeros.default, ([2, 2],), {}, False, None),       # no tensor argument: a factory
]


def test_checking_a_binding_draws_no_random_numbers():
    """The flash-attention op is tagged random (dropout_p): its check runs and restores the
    generator; randint's (no tensor argument) never runs."""
    state = torch.get_rng_state()
    for op, args, kwargs, out, _ in VERDICTS:
        python_binding(op, args, kwargs, out=out)
    python_binding(aten.randint.low, (-2 ** 63, 2 ** 63 - 1, []), {})
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("op,args,kwargs,out,expected", VERDICTS, ids=[f"{v[0]}-{v[4]}" for v in VERDICTS])
def test_python_binding_verdicts(op, args, kwargs, out, expected):
    assert python_binding(op, args, kwargs, out=out) == expected


def test_op_table_binds_the_builtin_or_the_overloads_own():
    table = op_table("aten", {"mm.default": "mm", "mm.out": "mm", "index.Tensor": None})
    assert table.mm.default is torch.mm and table.mm.out is torch.mm
    # the builtin OpOverload.__call__ forwards to, called with no Python frame
    assert table.index.Tensor is aten.index.Tensor._op and not hasattr(table.index.Tensor, "__code__")
    x = torch.arange(6.0)
    assert torch.equal(table.index.Tensor(x, [torch.tensor([4, 1])]), torch.tensor([4.0, 1.0]))


def test_generated_calls_go_through_the_binding_and_match_eager():
    # cumsum over 40 > lowering_scan.SCAN_UNROLL: an aten call
    a, w, b = torch.randn(6, 8), torch.randn(8, 40), torch.randn(40)
    f = lambda a, w, b: torch.cumsum(torch.addmm(b, a, w), 1)   # noqa: E731
    compiled = compile_fn(f, a, w, b)
    src = compiled.source_code
    assert "ATEN_CALLS = {'addmm.default': 'addmm', 'cumsum.default': 'cumsum'}" in src
    # the overload stays readable; the binding gets every default explicitly (its own may differ)
    assert "buf0 = aten.addmm.default(b_1, a_1, w_1, beta=1, alpha=1)  # FX: addmm" in src
    assert "buf1 = aten.cumsum.default(buf0, 1, dtype=None)  # FX: cumsum" in src
    torch.testing.assert_close(compiled(a, w, b), f(a, w, b), rtol=0, atol=0)
    with torch.profiler.profile() as prof:
        compiled(a, w, b)
    names = [e.name for e in prof.events()]
    assert names.count("aten::addmm") == 1 and names.count("aten::cumsum") == 1


def test_view_offsets_are_relative_to_the_viewed_buffer():
    """A view at offset 8 of an input that itself starts 8 elements into its storage reads from
    element 16 (the call adds the input's offset); over a buffer the graph allocated (offset 0)
    torch.as_strided takes the offset directly; at offset 0 it is left to as_strided."""
    base, w = torch.randn(5, 8), torch.randn(8, 5)
    x = base[1:]
    on_input = compile_fn(lambda x, w: torch.mm(x[1:], w), x, w)
    assert "aten.mm.default(torch.as_strided(x_1, (3, 8), (8, 1), x_1.storage_offset() + 8), w_1)" \
        in on_input.source_code
    torch.testing.assert_close(on_input(x, w), torch.mm(base[2:], w), rtol=0, atol=0)
    on_buffer = compile_fn(lambda x, w: torch.mm((x + 1)[1:], w), x, w)
    assert "aten.mm.default(torch.as_strided(buf0, (3, 8), (8, 1), 8), w_1)" in on_buffer.source_code
    torch.testing.assert_close(on_buffer(x, w), torch.mm(base[2:] + 1, w), rtol=0, atol=0)
    transposed = compile_fn(lambda x, w: torch.mm(x, w.t().t()), x, w)
    torch.testing.assert_close(transposed(x, w), torch.mm(x, w), rtol=0, atol=0)


def test_a_binding_whose_defaults_differ_from_the_overloads_gets_them_explicitly():
    """torch.binary_cross_entropy_with_logits(x, t) returns the unreduced loss, while the overload
    aten.binary_cross_entropy_with_logits.default(x, t) reduces to the mean: called through the
    binding with the call's two arguments, the compiled loss was a [5] tensor (found by the full
    OpInfo sweep). The reduction is now passed explicitly. Traced undecomposed: the decomposition
    table now rewrites the op into lowered ones."""
    x, t = torch.randn(5), torch.rand(5)
    f = lambda x, t: torch.nn.functional.binary_cross_entropy_with_logits(x, t)   # noqa: E731
    compiled = compile_fn(f, x, t, decompose=False)
    assert "aten.binary_cross_entropy_with_logits.default(x_1, t_1, None, None, 1)" in compiled.source_code
    got = compiled(x, t)
    got = got[0] if isinstance(got, (list, tuple)) else got
    assert got.shape == () and torch.equal(got, f(x, t))
