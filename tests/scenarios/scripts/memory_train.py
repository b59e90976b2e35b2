"""`tdbg memory` on training: a two-layer MLP's forward and backward, compiled."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
step = torch.compile(model)
x = torch.randn(512, 256)
for _ in range(2):
    loss = step(x).square().mean()
    loss.backward()
print("done")
