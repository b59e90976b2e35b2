"""fullgraph=True with a data-dependent branch: Dynamo raises at the `if` instead of breaking the graph."""
import torch


def f(x):
    y = x.sin()
    if y.sum() > 0:
        y = y * 2
    return y


print(torch.compile(f, fullgraph=True)(torch.linspace(-1, 2, 8)))
