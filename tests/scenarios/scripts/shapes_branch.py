"""Known answer for explain's shapes: a branch on a size (issue #24's case). The first call (64
rows) compiles x's dim 0 static; 8 rows recompile it dynamic, guarded by the branch below
(x.size()[0] <= 32); 100 rows fail that guard. Dynamo prints the failed range guard
(2 <= x.size()[0] <= 32) with line 8, where the size was first read; the guard was made by the
`if` on line 9, and that is where the recompile is put."""
import torch


def f(x):
    n = x.size(0)
    if x.size(0) > 32:
        return x.sin() * n
    return x.cos()


cf = torch.compile(f, backend="eager")
for size in (64, 8, 100):
    cf(torch.randn(size, 3))
