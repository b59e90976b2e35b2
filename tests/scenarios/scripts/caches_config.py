"""explain --caches' known answer: one function compiled with Inductor, trained one step.
`--no-size-asserts` turns off torch._inductor.config.size_asserts (part of Inductor's FX graph cache
key and AOTAutograd's): a run with it misses both caches against a run without it, for that key alone.
`--rows N` (default 8) changes the input's first dim: its input metadata and the graph's code differ."""
import sys

import torch

if "--no-size-asserts" in sys.argv[1:]:
    torch._inductor.config.size_asserts = False


@torch.compile
def f(x):
    return (x.sin() + 1).sum(0)


torch.manual_seed(0)
rows = int(sys.argv[sys.argv.index("--rows") + 1]) if "--rows" in sys.argv else 8
x = torch.randn(rows, 16, requires_grad=True)
f(x).sum().backward()
print("grad sum", round(float(x.grad.sum()), 3))
