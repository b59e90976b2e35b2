"""The compiled function is right on the first two batches; the third has values below -1."""
import torch


def f(x):
    return torch.relu(x) * 2 + 1


g = torch.compile(f)
for scale in (0.5, 0.9, 3.0):
    x = torch.linspace(-scale, scale, 64).reshape(8, 8)
    print(scale, round(float(g(x).sum()), 4))
