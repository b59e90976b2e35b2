"""A graph that draws random numbers (noise added before a relu) under a backend whose relu is wrong
below -1. A float64 reference draws other numbers than eager, so it must not excuse the bug."""
import torch


def f(x):
    noisy = x + 4 * torch.rand_like(x) - 2   # noise as large as the signal, as in augmentation
    return torch.relu(noisy) * 2 + 1


torch.manual_seed(0)
g = torch.compile(f)
x = torch.linspace(-3, 3, 64).reshape(8, 8)
print(round(float(g(x).sum()), 2))
