"""explain --code on a dynamic-shape compile: the branch on a size adds a shape guard."""
import torch


def f(x):
    if x.size(0) > 3:
        return x * 2
    return x


compiled = torch.compile(f, backend="eager", dynamic=True)
compiled(torch.ones(5, 8))
