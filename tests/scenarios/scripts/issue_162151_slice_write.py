"""PyTorch issue #162151: permute, then in-place writes into slices of the view. AOTAutograd's
functionalized graph is already wrong (aot_eager fails too); the script asserts on the result."""
import torch


def foo(x):
    x = x.permute(2, 1, 0)
    x[0] += 1
    x[0] = x[0].t()
    return x


cf = torch.compile(foo)
x = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])
res = foo(x.clone())
cres = cf(x.clone())
torch.testing.assert_close(res, cres)
print("ok")
