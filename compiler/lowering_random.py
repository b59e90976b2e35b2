"""Random ops generated inside kernels: rand, rand_like, randn, randn_like, uniform, bernoulli,
native_dropout (and native_dropout_backward, which needs no random numbers).

Every random value is a pure function of (seed, stream, element): Philox4x32-10
(`tdbg_philox` in cpp_prelude.h) keyed by a 64-bit seed, with the counter (element's linear
index in the op's own output, the op's stream number in the graph). So a random op can be
inlined into any consumer, recomputed by several, or fused with its neighbours (dropout's mask
with the producer of its input and the consumer of its output), and gives the same values.

The seed: the first random op of a graph adds one extern call, `aten.randint.low(-2**63,
2**63 - 1, [])`, that the wrapper runs on every call of the compiled graph. It draws from torch's
default generator, so successive calls differ and `torch.manual_seed` makes a run repeatable;
each random op of the graph reads that seed with its own stream number. These values are not
eager's stream: `config.fallback_random=True` runs every random op through aten instead (each
lowering here refuses, and the node falls back), bit for bit what eager computes.

Dropout's mask is realized (the backward graph reads it as a saved tensor, so the forward and
backward masks are the same values by construction); its output is realized beside it in the
same kernel.
"""
from __future__ import annotations

import torch

from . import ir
from .ir import ExternBuffer, ExternKernel, FixedLayout
from .lowering_common import _out, operand, register_lowering

aten = torch.ops.aten

FLOATS = (torch.float32, torch.float64)


def _linear(index, size):
    """The element's row-major linear index in `size` (a sympy expression)."""
    linear = 0
    for i, s in zip(index, size):
        linear = linear * ir.as_size(s) + i
    return linear


def _seed(g, node):
    """The graph's seed buffer (int64, shape ()), made by one extern call at the first random
    op; a new stream number for `node`."""
    state = getattr(g, "random_state", None)
    if state is None:
        name = g.new_name()
        kernel = ExternKernel(name, aten.randint.low, (-2 ** 63, 2 ** 63 - 1, []),
                              {"dtype": torch.int64, "device": torch.device("cpu")}, node, [])
        buf = g.register(ExternBuffer(name, FixedLayout((), (), torch.int64), kernel, name))
        kernel.outputs.append(buf)
        g.operations.append(kernel)
        state = g.random_state = {"seed": buf, "streams": 0}
    state["streams"] += 1
    return state["seed"], state["streams"] - 1


def _check(g, dtype, generator=None):
    """NotImplementedError (the node falls back to aten) unless tdbg generates this op."""
    if g.config.fallback_random:
        raise NotImplementedError("config.fallback_random: random ops run through aten")
    if generator is not None:
        raise NotImplementedError("an explicit generator")
    if dtype not in FLOATS:
        raise NotImplementedError("random values of a non-float dtype")


def random_values(g, node, size, kind, dtype):
    """Loader of `kind` ("rand": uniform [0, 1), "randn": standard normal) values over `size`,
    in `dtype` (float32/float64), from a new stream of the graph's seed."""
    seed, stream = _seed(g, node)
    load_seed = seed.make_loader()
    size = tuple(ir.as_size(s) for s in size)

    def fn(ops, index):
        offset = ops.index_expr(_linear(index, size), torch.int64)
        return getattr(ops, kind)(load_seed(ops, []), ops.constant(stream, torch.int64), offset, dtype)
    return fn


def _factory(kind):
    def lower(g, node, *args, dtype=None, layout=None, device=None, pin_memory=None, generator=None,
              memory_format=None):
        size, out_dtype = _out(node)
        _check(g, out_dtype, generator)
        return g.pointwise(node, size, out_dtype, random_values(g, node, size, kind, out_dtype))
    return lower


register_lowering(aten.rand.default, aten.rand_like.default)(_factory("rand"))
register_lowering(aten.randn.default, aten.randn_like.default)(_factory("randn"))


@register_lowering(aten.uniform.default)
def lower_uniform(g, node, x, low=0.0, high=1.0, *, generator=None):
    size, out_dtype = _out(node)
    _check(g, out_dtype, generator)
    u = random_values(g, node, size, "rand", out_dtype)

    def fn(ops, index):
        span = ops.constant(float(high) - float(low), out_dtype)
        return ops.add(ops.mul(u(ops, index), span), ops.constant(float(low), out_dtype))
    return g.pointwise(node, size, out_dtype, fn)


@register_lowering(aten.bernoulli.default, aten.bernoulli.p)
def lower_bernoulli(g, node, x, p=None, *, generator=None):
    """1 where a uniform value is below the probability (`p`, or x's own elements), else 0."""
    size, out_dtype = _out(node)
    _check(g, torch.float64, generator)   # any result dtype: the draw is in float64
    prob = operand(x if p is None else p, size, torch.float64)
    u = random_values(g, node, size, "rand", torch.float64)

    def fn(ops, index):
        return ops.to_dtype(ops.lt(u(ops, index), prob(ops, index)), out_dtype)
    return g.pointwise(node, size, out_dtype, fn, (x,))


@register_lowering(aten.native_dropout.default)
def lower_native_dropout(g, node, x, p, train):
    """(x * mask / (1 - p), mask) with mask = uniform > p, as torch's own decomposition."""
    out_val, mask_val = node.meta["val"]
    _check(g, out_val.dtype)
    if not train or p <= 0 or p >= 1:
        raise NotImplementedError("dropout that is not a random mask (eval, p = 0 or p = 1)")
    size, out_dtype = tuple(ir.as_size(s) for s in out_val.shape), out_val.dtype
    u = random_values(g, node, size, "rand", out_dtype)

    def keep(ops, index):
        return ops.gt(u(ops, index), ops.constant(float(p), out_dtype))
    mask = g.realize(g.pointwise(node, size, torch.bool, keep), tuple(mask_val.stride()))
    load_x, load_mask, scale = operand(x, size, out_dtype), mask.make_loader(), 1.0 / (1.0 - p)

    def out(ops, index):
        kept = ops.mul(ops.to_dtype(load_mask(ops, index), out_dtype), load_x(ops, index))
        return ops.mul(kept, ops.constant(scale, out_dtype))
    return (g.realize(g.pointwise(node, size, out_dtype, out, (x,)), tuple(out_val.stride())), mask)


@register_lowering(aten.native_dropout_backward.default)
def lower_native_dropout_backward(g, node, grad, mask, scale):
    """grad * (mask * scale), as torch's decomposition computes it."""
    size, out_dtype = _out(node)
    load_g, load_m = operand(grad, size, out_dtype), operand(mask, size, out_dtype)

    def fn(ops, index):
        return ops.mul(load_g(ops, index), ops.mul(load_m(ops, index), ops.constant(float(scale), out_dtype)))
    return g.pointwise(node, size, out_dtype, fn, (grad, mask))

