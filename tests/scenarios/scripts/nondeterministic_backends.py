"""A user backend nondeterministic in one op, as a parallel reduction whose threads finish in a
different order is: `Tensor.sum()` (no dims) sums the elements in one shuffled order on even calls
and in its reverse on odd calls, so any two consecutive calls add the same floats in different
orders (float addition is not associative: other last bits). The order never comes from torch's
RNG: resetting torch's seed cannot make two calls agree, and the answer is the same on every machine."""
import itertools

import torch

_calls = itertools.count()


def _shuffled_sum(x, *args, **kwargs):
    if args or kwargs:          # only the whole-tensor sum is replaced
        return torch.sum(x, *args, **kwargs)
    order = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(0))
    if next(_calls) % 2:
        order = order.flip(0)
    return x.reshape(-1)[order].sum()


def shuffled_sum(gm, example_inputs):
    """Every whole-tensor sum of the graph (torch.sum(x) or x.sum()) becomes `_shuffled_sum`."""
    for node in gm.graph.nodes:
        if (node.op == "call_method" and node.target == "sum") or \
                (node.op == "call_function" and node.target is torch.sum):
            node.op, node.target = "call_function", _shuffled_sum
    gm.recompile()
    return gm.forward
