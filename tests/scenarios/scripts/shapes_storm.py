"""Known answer for explain's shapes: automatic dynamic shapes off, so every new size of x's
dim 0 recompiles (10 sizes: 1..10) until Dynamo's recompile limit: a recompile storm."""
import torch

torch._dynamo.config.automatic_dynamic_shapes = False


def f(x):
    return x.sin()


cf = torch.compile(f, backend="eager")
for size in range(1, 11):
    cf(torch.randn(size, 3))
