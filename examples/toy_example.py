"""Seed program from the troubleshooting guide: two graph breaks (print, data-dependent branch)."""
import torch


def toy_example(a, b):
    x = a / (torch.abs(a) + 1)
    print("woo")
    if b.sum() < 0:
        b = b * -1
    return x * b


compiled = torch.compile(toy_example)
for _ in range(10):
    compiled(torch.randn(10), torch.randn(10))
