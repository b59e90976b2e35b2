"""torch.func.grad of a scalar function: Dynamo's graph holds functorch's grad levels
(_grad_increment_nesting, _wrap_for_grad, _autograd_grad) (run with --backend
no_sin_backend.py:no_sin)."""
import torch


def loss(y):
    return (torch.sin(y) * y.exp()).sum()


def step(x):
    return torch.func.grad(loss)(x.tanh()) * 3


x = torch.randn(4, 3)
print(torch.compile(step)(x))
