"""torch.vmap over a row function: Dynamo's graph calls functorch's _add_batch_dim /
_remove_batch_dim around the body (run with --backend no_sin_backend.py:no_sin)."""
import torch


def rows(x, w):
    h = torch.relu(x @ w) + 1
    return torch.vmap(lambda r: torch.sin(r * 2).sum())(h).cos()


x, w = torch.randn(4, 3), torch.randn(3, 3)
print(torch.compile(rows)(x, w))
