"""One compiled function called with two input shapes (dynamic=True: one graph, two signatures),
then the first shape again (a signature already saved)."""
import torch

torch.manual_seed(0)


@torch.compile(dynamic=True)
def f(x, w):
    return torch.tanh(x @ w).sum(1) * x.shape[0]


w = torch.randn(3, 5)
for rows in (4, 6, 4):
    print(f(torch.randn(rows, 3), w).sum().item())
