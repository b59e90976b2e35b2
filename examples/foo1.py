"""Seed program from the CPU debugging tutorial: uint8 neg / maximum / cat."""
import torch


def foo1(x1, x2):
    a = torch.neg(x1)
    b = torch.maximum(x2, a)
    y = torch.cat([b], dim=0)
    return y


torch.manual_seed(0)
x1 = torch.randint(256, (1, 8), dtype=torch.uint8)
x2 = torch.randint(256, (8390, 8), dtype=torch.uint8)

compiled_foo1 = torch.compile(foo1)
result = compiled_foo1(x1, x2)
assert torch.equal(result, foo1(x1, x2)), "compiled foo1 differs from eager"
print("foo1 ok", tuple(result.shape))
