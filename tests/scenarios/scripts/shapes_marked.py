"""Known answer for explain's shapes: mark_dynamic(x, 0), then a comparison with a constant
specializes the dim: Dynamo stops the run (ConstraintViolationError) at the comparison's line."""
import torch


def f(x):
    if x.shape[0] == 3:
        return x.sin()
    return x.cos()


cf = torch.compile(f, backend="eager")
x = torch.randn(3, 2)
torch._dynamo.mark_dynamic(x, 0)
cf(x)
