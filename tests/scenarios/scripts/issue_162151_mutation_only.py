"""PyTorch issue #162151 with nothing returned: the in-place writes into the permuted input are
the function's only effect, so a check of the compiled graph's outputs sees nothing; the script
asserts on the mutated input after the compiled call."""
import torch


def foo(x):
    x = x.permute(2, 1, 0)
    x[0] += 1
    x[0] = x[0].t()


cf = torch.compile(foo)
x = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])
expected, actual = x.clone(), x.clone()
foo(expected)
cf(actual)
torch.testing.assert_close(expected, actual)
print("ok")
