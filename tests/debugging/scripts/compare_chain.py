"""A 21-op elementwise/reduction chain, forward and backward: `tdbg compare` tests inject an
accuracy bug into one op in the middle (TDBG_INJECT_BUG=neg:accuracy) and expect that op's line."""
import torch


def chain(x, w):
    y = x * 2.0
    y = y + 1.0
    y = torch.sin(y)
    y = y * w
    y = y - 0.5
    y = torch.exp(y)
    y = y.sum(dim=1, keepdim=True) + y
    y = torch.tanh(y)
    y = y * y
    y = y / 3.0
    z = torch.neg(y)
    z = z + x
    z = torch.relu(z)
    z = z * 1.5
    z = torch.cos(z)
    z = z.mean(dim=0) + z
    z = torch.sigmoid(z)
    z = z * w
    z = z + 2.0
    z = torch.log(z)
    return z * 0.5


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(64, 33, requires_grad=True)
    w = torch.randn(64, 33, requires_grad=True)
    out = torch.compile(chain)(x, w)
    out.sum().backward()
