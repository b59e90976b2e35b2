"""Known answer for explain's shapes: maybe_mark_dynamic(x, 0), then a view to literal sizes
specializes that dim to 8 (3 * rows must be 24) on the view line."""
import torch


def f(x):
    y = x * 2
    return y.view(4, 6)


cf = torch.compile(f, backend="eager")
x = torch.randn(8, 3)
torch._dynamo.maybe_mark_dynamic(x, 0)
cf(x)
