"""PyTorch issue #175966 inside a small encoder: Inductor computes the int64 product
`arange(L) * torch.tensor(1_000_000_000)` in 32 bits (position ids overflow silently).
`dynamic` from argv[1] ("dynamic" -> torch.compile(dynamic=True))."""
import sys

import torch

DYNAMIC = len(sys.argv) > 1 and sys.argv[1] == "dynamic"


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.relu(self.proj(x))
        pos = torch.arange(x.shape[0], dtype=torch.int64) * torch.tensor(1_000_000_000)
        return h.sum(dim=1), pos


torch.manual_seed(0)
model = Encoder()
x = torch.randn(16, 8)
compiled = torch.compile(model, dynamic=True if DYNAMIC else None)
out, pos = compiled(x)
ref_out, ref_pos = model(x)
print("positions match eager:", torch.equal(pos, ref_pos))
