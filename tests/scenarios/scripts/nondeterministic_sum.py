"""A model whose compiled sum is nondeterministic under nondeterministic_backends.py:shuffled_sum:
the same inputs give other bits on every call; eager's sum gives the same bits."""
import torch


def f(x, w):
    h = torch.tanh(x @ w)
    total = h.sum()
    return h * 2, total / h.numel()


torch.manual_seed(0)
g = torch.compile(f)
x, w = torch.randn(64, 32), torch.randn(32, 48)
h, mean = g(x, w)
print(round(float(mean), 4))
