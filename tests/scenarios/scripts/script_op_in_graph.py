"""A function of the script itself put into Dynamo's graph as one call (allow_in_graph): the
captured graph's source must import it from the script, which a standalone graph file cannot
(run with --backend no_sin_backend.py:no_sin; minify --after dynamo cannot read it back, --after
aot can)."""
import torch


@torch._dynamo.allow_in_graph
def scaled(x):
    return x * 2


def f(x):
    return torch.sin(scaled(x)) + 1


print(torch.compile(f)(torch.randn(4)))
