"""A training step with dropout: tdbg's compiler draws its own random numbers, so an accuracy check
that compares with eager must make both draw eager's stream (and say that it did)."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 4))
step = torch.compile(model)
x = torch.randn(8, 16)
loss = step(x).square().mean()
loss.backward()
print(round(loss.item(), 4))
