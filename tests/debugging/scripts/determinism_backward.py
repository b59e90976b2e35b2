"""--check-determinism when only gradients differ: under determinism_backends.py:aot_mm_backward
the backward's matrix product is nondeterministic. The difference used to be reported without a
node ("nodes are located in forward graphs only")."""
import torch


def f(x, w):
    return torch.tanh(x @ w).sum()


torch.manual_seed(0)
x, w = torch.randn(16, 8), torch.randn(8, 4, requires_grad=True)
loss = torch.compile(f)(x, w)
loss.backward()
print(round(float(w.grad.sum()), 3))
