"""torch.cond with branches as FX subgraphs (get_attr GraphModules in Dynamo's graph); sin is
in the true branch (run with --backend no_sin_backend.py:no_sin)."""
import torch


def branchy(x):
    h = x.abs() + 1
    y = torch.cond(h.sum() > 0, lambda t: torch.sin(t) * 2, lambda t: t.cos() - 1, (h,))
    return y.neg()


x = torch.randn(4, 3)
print(torch.compile(branchy)(x))
