"""A few training steps of a small ReLU MLP; prints the loss. ReLU's backward (`le`, `where`)
exists only in the backward graph."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = torch.compile(model)
x, target = torch.randn(8, 16), torch.randint(0, 4, (8,))
for _ in range(3):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(step(x), target)
    loss.backward()
    opt.step()
print("loss", round(loss.item(), 4))
