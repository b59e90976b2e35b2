"""The script checks its own results (as real scripts do): the compiled function is right on the
first four calls and wrong on the fifth (values below -1, same shapes), so a check of the first
calls passes and the script's own assert is what fails."""
import torch


def f(x):
    return torch.relu(x) * 2 + 1


g = torch.compile(f)
for scale in (0.5, 0.6, 0.7, 0.8, 3.0):
    x = torch.linspace(-scale, scale, 64).reshape(8, 8)
    assert torch.allclose(g(x), f(x)), f"compiled result differs from eager at scale {scale}"
print("all calls match")
