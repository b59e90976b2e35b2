"""Known answer for explain's shapes: a branch on a size. The first call (8 rows) compiles x's
dim 0 static; 64 rows recompile it dynamic, guarded by the branch below (x.size()[0] > 32); 16 rows
fail that guard: the recompile is put at the `if` line, not where the size was read."""
import torch


def f(x):
    n = x.size(0)
    if x.size(0) > 32:
        return x.sin() * n
    return x.cos()


cf = torch.compile(f, backend="eager")
for size in (8, 64, 16):
    cf(torch.randn(size, 3))
