"""PyTorch issue #188225: ones -> atan2 -> log2 -> arccosh -> softmax is constant-folded to a NaN
fill, and Inductor's scheduler then fails on sympy Max(nan) (ValueError) while compiling."""
import torch

sm = torch.nn.Softmax(dim=-1).eval()


def model():
    t = torch.ones([2, 2])
    t = torch.atan2(t, t)
    t = torch.log2(t)
    t = torch.arccosh(t)
    return sm(t)


compiled = torch.compile(model)
with torch.no_grad():
    print(compiled())
