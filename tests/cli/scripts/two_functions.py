"""Two compiled functions; `--function inner` must compile only frames of `inner`."""
import sys

import torch


def inner(x):
    return torch.sin(x) + 1


def outer(x):
    return inner(x) * 2


compiled = torch.compile(outer)
print(compiled(torch.ones(4)).sum().item())
sys.exit(0 if len(sys.argv) == 2 and sys.argv[1] == "--flag" else 5)
