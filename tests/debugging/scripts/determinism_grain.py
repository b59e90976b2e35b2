"""--check-determinism beyond a graph's first call (tests/debugging/test_determinism_later.py).

`grain_sum` is a user backend whose whole-tensor sum is a parallel reduction only above a grain
size, as compiled reductions are (below it one thread sums in order): from GRAIN elements up, the
threads finish in another order on every call, emulated as in nondeterministic_backends.py (the
last bit alternates with a call counter, so any two consecutive calls differ on every machine).
The script's graph is compiled for dynamic sizes: its first call (64 elements) is deterministic,
its second (65536) is not. Checked at call 1 only, the run was OK.
"""
import itertools

import torch

GRAIN = 4096
_calls = itertools.count()


def _grain_sum(x):
    total = torch.sum(x)
    if x.numel() >= GRAIN and next(_calls) % 2:
        return torch.nextafter(total, torch.tensor(float("inf"), dtype=total.dtype))
    return total


def grain_sum(gm, example_inputs):
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.target == "sum" and len(node.args) == 1 and not node.kwargs:
            node.op, node.target = "call_function", _grain_sum
    gm.recompile()
    return gm.forward


def f(x):
    h = torch.tanh(x)
    return h.sum()


if __name__ == "__main__":
    torch.manual_seed(0)
    g = torch.compile(f, dynamic=True)
    print(round(float(g(torch.randn(64))), 3), round(float(g(torch.randn(65536))), 1))
