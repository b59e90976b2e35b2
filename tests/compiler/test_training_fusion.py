"""Training-step costs the wrapper decides: a large result an aten op computes is written into the
output pool only through an out= overload with a kernel of its own (issue 10)."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table

aten = torch.ops.aten


def _compile(fn, *inputs):
    """As the forward graph of a training step (no layout planning, no packed weights)."""
    lowering.reset_counters()
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    return compile_aten(gm, list(inputs), current().replace(reuse_outputs=True), kind="forward")


def test_generated_out_overload_is_not_used_for_pooled_results():
    # convolution.out is torch's generated wrapper (convolution into a fresh tensor, then a copy
    # into out): the 1.6 MB output (a saved activation in training) is allocated by the call itself
    x, w = torch.randn(2, 64, 56, 56), torch.randn(64, 64, 3, 3)
    compiled = _compile(lambda x, w: aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), x, w)
    assert "aten.convolution.default(" in compiled.source_code
    assert "aten.convolution.out(" not in compiled.source_code
    with torch.profiler.profile() as prof:
        out = compiled(x, w)
    # the generated out= runs aten::convolution inside itself: two calls, and a copy, per call
    assert [e.name for e in prof.events()].count("aten::convolution") == 1
    # any summation order of 576 float32 products: |error| <= 576 * 2^-24 * sum |x * w| (both sides)
    bound = 2 * 576 * 2.0 ** -24 * torch.nn.functional.conv2d(x.abs(), w.abs(), padding=1)
    got = torch.utils._pytree.tree_leaves(out)[0]
    assert ((got - torch.nn.functional.conv2d(x, w, padding=1)).abs() <= bound).all()


def test_out_overload_with_its_own_kernel_still_writes_the_pool():
    a, b = torch.randn(512, 600), torch.randn(600, 512)   # 1 MB result: a pool slot of its own
    compiled = _compile(torch.mm, a, b)
    assert "aten.mm.out(" in compiled.source_code
