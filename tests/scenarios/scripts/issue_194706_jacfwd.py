"""PyTorch issue #194706: torch.compile(torch.func.jacfwd(f)) on float16 input; Inductor's
generated C++ does not compile (CppCompileError)."""
import torch


def f(x):
    return torch.sum(torch.mm(torch.mm(torch.prod(x) + x,
                                       torch.sum(x) + x),
                              torch.sum(x) + x))


x = (torch.arange(1, 10, dtype=torch.float16) / 10).reshape(3, 3)
print(torch.compile(torch.func.jacfwd(f))(x))
