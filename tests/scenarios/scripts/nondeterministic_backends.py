"""User backends nondeterministic in one op.

`shuffled_sum`: `Tensor.sum()` (no dims) behaves as a parallel reduction whose threads finish in
another order on every call: float addition is not associative, so the last bit of the result
changes. Emulated so that any two consecutive calls differ on every machine and for every input:
even calls return the sum, odd calls the next float above it. The parity comes from a call
counter, never from torch's RNG: resetting torch's seed cannot make two calls agree.
`own_random`: torch.rand_like draws from the backend's own generator, seeded per call.
`aot_shuffled_sum`: an aot_autograd backend whose forward aten graph's aten.sum is `_shuffled_sum`.
"""
import itertools

import torch
from torch._dynamo.backends.common import aot_autograd

_calls = itertools.count()


def _shuffled_sum(x, *args, **kwargs):
    total = torch.sum(x, *args, **kwargs)
    if args or kwargs:          # only the whole-tensor sum is replaced
        return total
    if next(_calls) % 2:        # the other thread finished first: the last bit differs
        return torch.nextafter(total, torch.tensor(float("inf"), dtype=total.dtype))
    return total


def shuffled_sum(gm, example_inputs):
    """Every whole-tensor sum of the graph (torch.sum(x) or x.sum()) becomes `_shuffled_sum`."""
    for node in gm.graph.nodes:
        if (node.op == "call_method" and node.target == "sum") or \
                (node.op == "call_function" and node.target is torch.sum):
            node.op, node.target = "call_function", _shuffled_sum
    gm.recompile()
    return gm.forward


def _own_rand_like(x, *args, **kwargs):
    # a backend with its own random-number generator, seeded per call: torch.manual_seed cannot
    # make two calls draw the same numbers
    gen = torch.Generator().manual_seed(1000 + next(_calls))
    return torch.rand(x.shape, generator=gen, dtype=x.dtype)


def own_random(gm, example_inputs):
    """Every torch.rand_like of the graph draws from the backend's own generator."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.rand_like:
            node.target = _own_rand_like
    gm.recompile()
    return gm.forward


def _aten_shuffled_sum(gm, example_inputs):
    # after AOTAutograd: the whole-tensor aten.sum of the forward graph sums in a changing order
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.sum.default:
            node.target = _shuffled_sum
    gm.recompile()
    return gm


aot_shuffled_sum = aot_autograd(fw_compiler=_aten_shuffled_sum)
