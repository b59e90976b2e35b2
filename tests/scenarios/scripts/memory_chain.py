"""Known answer for `tdbg memory`: a chain of pointwise ops on a 1M-float (4 MB) tensor.

Eager materializes every intermediate: at its peak the result of one op and the next are alive
together, plus the output: eager peak = 2 x 4 MB (the last op's input and output).
tdbg's compiler fuses the chain into one kernel: compiled peak = the output alone (4 MB).
"""
import torch

N = 1 << 20


def chain(x):
    y = x * 2
    y = y + 1
    y = torch.sin(y)
    y = y * y
    return y - 3


f = torch.compile(chain)
x = torch.randn(N)
for _ in range(2):
    f(x)
print("done")
