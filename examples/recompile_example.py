"""Recompiles for tdbg explain: the same function sees a new size, then a new dtype."""
import torch


def scale(x, y):
    return torch.sin(x) * 2 + y


compiled = torch.compile(scale)
compiled(torch.randn(8), torch.randn(8))
compiled(torch.randn(16), torch.randn(16))
compiled(torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64))
print("recompile_example ok")
