"""Two linears whose input is all subnormal: every element of `x` is 1.0e-39 (float32's smallest
normal is 1.18e-38), so the first addmm reads 256 * 512 subnormal values and nothing else does.
`x` is made from its bits, so it stays subnormal where the script flushes subnormals to zero."""
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(512, 512)
        self.b = torch.nn.Linear(512, 512)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


torch.manual_seed(0)
net = torch.compile(Net())
x = torch.full((256, 512), 0x000AE398, dtype=torch.int32).view(torch.float32)
with torch.no_grad():
    for _ in range(2):
        net(x)
