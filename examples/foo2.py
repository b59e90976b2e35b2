"""Seed program from the CPU debugging tutorial: float32 neg / maximum / cat."""
import torch


def foo2(x1, x2):
    a = torch.neg(x1)
    b = torch.maximum(x2, a)
    y = torch.cat([b], dim=0)
    return y


torch.manual_seed(0)
x1 = torch.randn((1, 8), dtype=torch.float32)
x2 = torch.randn((8390, 8), dtype=torch.float32)

compiled_foo2 = torch.compile(foo2)
result = compiled_foo2(x1, x2)
print("foo2 max abs diff vs eager:", (result - foo2(x1, x2)).abs().max().item())
