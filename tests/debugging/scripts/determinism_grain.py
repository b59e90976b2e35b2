"""--check-determinism beyond a graph's first call: compiled for dynamic sizes, its first call
(64 elements) is deterministic under determinism_backends.py:grain_sum, its second (65536) is not.
Checked at call 1 only, the run was OK."""
import torch


def f(x):
    h = torch.tanh(x)
    return h.sum()


torch.manual_seed(0)
g = torch.compile(f, dynamic=True)
print(round(float(g(torch.randn(64))), 3), round(float(g(torch.randn(65536))), 1))
