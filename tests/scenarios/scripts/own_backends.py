"""torch.compile calls that ask for their own backend, mode or options, as scripts write them.
argv[1] picks the case; every case computes the same function and asserts nothing."""
import sys

import torch
from torch._dynamo.backends.common import aot_autograd

CASE = sys.argv[1] if len(sys.argv) > 1 else "mode"


def f(x):
    return torch.relu(x) * 2 + 1


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return f(self.linear(x))


def counting_backend(gm, example_inputs):
    """A user backend that runs the graph as it is."""
    return gm.forward


def _identity_compiler(gm, example_inputs):
    return gm


aot_backend = aot_autograd(fw_compiler=_identity_compiler)


def compiled():
    if CASE == "mode":
        return torch.compile(f, mode="reduce-overhead")
    if CASE == "options":
        return torch.compile(f, options={"fallback_random": True})
    if CASE == "decorator":
        return torch.compile(backend=counting_backend)(f)
    if CASE == "lambda":
        return torch.compile(f, backend=lambda gm, example_inputs: gm.forward)
    if CASE == "aot":
        return torch.compile(f, backend=aot_backend)
    if CASE == "tdbg":
        return torch.compile(f, backend="tdbg")
    if CASE == "optimize":
        return torch._dynamo.optimize("eager")(f)
    if CASE in ("layers", "torch_layers"):   # regional compilation: three layers of one class, each compiled
        torch.manual_seed(0)
        layers = torch.nn.Sequential(*((Block() if CASE == "layers" else torch.nn.Linear(8, 8)) for _ in range(3)))
        for layer in layers:
            layer.compile(backend="eager")   # an nn.Linear's own forward: Dynamo compiles nothing
        return torch.no_grad()(layers)
    if CASE == "two":
        g = torch.compile(lambda x: torch.sin(x) + 1, backend="eager")
        return lambda x: g(torch.compile(f, backend=counting_backend)(x))
    raise SystemExit(f"unknown case {CASE}")


print(compiled()(torch.randn(8, 8)).shape)
