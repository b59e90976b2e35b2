"""Known answer for `tdbg memory`: a user backend that keeps an extra copy of every input alive
while the graph runs, so the compiled peak is eager's plus the input's bytes (4 MB here).

Run with `--backend tests/scenarios/scripts/memory_copy_backend.py:copying`.
"""
import torch

N = 1 << 20


def copying(gm, example_inputs):
    def run(*args):
        copies = [a.clone() for a in args if isinstance(a, torch.Tensor)]   # the extra 4 MB
        out = gm(*args)
        del copies
        return out
    return run


def scale(x):
    return x * 2


f = torch.compile(scale, backend=copying)
x = torch.randn(N)
f(x)
print("done")
