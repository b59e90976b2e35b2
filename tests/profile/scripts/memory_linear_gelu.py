"""tdbg memory's Inductor attribution (tests/profile/test_memory.py): one Linear (an extern mm
kernel writing a 1 MiB buffer) and a GELU chain Inductor fuses into one C++ kernel."""
import torch

torch.manual_seed(0)
lin = torch.nn.Linear(256, 256)


def f(x):
    y = lin(x)
    z = torch.nn.functional.gelu(y) * 2
    return z.sum(1) + y.mean()


x = torch.randn(1024, 256, requires_grad=True)
out = torch.compile(f)(x)
out.sum().backward()
