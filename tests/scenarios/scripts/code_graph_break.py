"""explain --code and --break-at: one graph break (print) splits f into two frames; called twice
with a changed Python number, so the resume frame recompiles (its guard `n == 3` fails)."""
import torch


def f(x, n):
    y = x.sin() * 2
    print("graph break here")
    z = y + n
    return z.cos()


compiled = torch.compile(f, backend="eager")
x = torch.ones(4, 8)
compiled(x, 3)
compiled(x, 4)
