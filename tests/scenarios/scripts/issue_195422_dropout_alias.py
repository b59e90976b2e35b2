"""PyTorch #195422: `y += y` where y = dropout(x, training=False) is x itself. Eager changes the
caller's x; torch.compile (AOTAutograd's functionalization, so aot_eager and Inductor alike)
drops the change. The returned value is right: only the input shows the bug."""
import torch


def f(x):
    y = torch.nn.functional.dropout(x, 0.5, False)   # training=False: y is x
    y += y
    return y


x = torch.ones(2, 2)
torch.compile(f)(x)
print("input after the call:", x.flatten()[0].item())
