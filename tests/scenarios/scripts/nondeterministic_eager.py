"""A graph that is nondeterministic in eager itself: `jitter` (kept in the graph as one call with
allow_in_graph) adds noise that grows with a Python call counter, so two eager runs differ. A
backend that traces through it bakes in the counter's value at trace time: its compiled runs agree."""
import itertools

import torch

_calls = itertools.count()


@torch._dynamo.allow_in_graph
def jitter(x):
    return x + next(_calls) * 1e-3


def f(x):
    return torch.relu(jitter(x)) * 2


g = torch.compile(f)
print(round(float(g(torch.ones(4)).sum()), 3))
