"""A graph break (print) and a recompile (a new dtype) in one compiled function."""
import torch


@torch.compile
def step(x):
    y = x.relu() + 1
    print("between graphs")
    return y * 2


step(torch.randn(64, 8))
step(torch.randn(64, 8, dtype=torch.float64))
