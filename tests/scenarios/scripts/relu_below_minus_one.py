"""A small forward pass with torch.relu over values on both sides of -1 (for user backends that
get relu wrong only below -1, such as user_backends.py:wrong_below_minus_one)."""
import torch


def f(x, w):
    return torch.relu(x @ w) + 1


torch.manual_seed(0)
x, w = torch.randn(8, 16), torch.randn(16, 4)
print(torch.compile(f)(x, w).sum().item())
