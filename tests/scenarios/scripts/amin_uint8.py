"""A real PyTorch 2.13 Inductor bug: amin over a uint8 dimension returns a wrong minimum.

Which form shows it depends on the CPU's vector width (AVX2 machines: `amin(x)`; the issue was
filed from one where `amin(neg(x))` was wrong), so the script computes both; eager is right.
"""
import torch


def f(x):
    return torch.amin(x, dim=1), torch.amin(torch.neg(x), dim=1)


x = torch.tensor([[3, 250, 7, 9, 11, 13, 200, 17, 19, 21, 23, 25, 27, 29, 31, 33]], dtype=torch.uint8)
expected = f(x)
actual = torch.compile(f)(x)
print("eager", [t.tolist() for t in expected], "compiled", [t.tolist() for t in actual])
