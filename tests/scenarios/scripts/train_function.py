"""A training step written as a function: its backward graph's nodes carry the forward ops' lines."""
import torch


def f(x, w):
    h = x @ w
    y = torch.relu(h)
    return (y * y).sum()


w = torch.randn(16, 4, requires_grad=True)
loss = torch.compile(f)(torch.randn(8, 16), w)
loss.backward()
print("ok")
