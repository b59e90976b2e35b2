"""One training step of a small MLP through torch.compile; gradients are checked against eager."""
import copy

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
reference = copy.deepcopy(model)
x, target = torch.randn(16, 32), torch.randint(0, 10, (16,))

compiled = torch.compile(model)
loss = torch.nn.functional.cross_entropy(compiled(x), target)
loss.backward()
ref_loss = torch.nn.functional.cross_entropy(reference(x), target)
ref_loss.backward()
torch.testing.assert_close(loss, ref_loss)
for p, q in zip(model.parameters(), reference.parameters()):
    torch.testing.assert_close(p.grad, q.grad)
print("mlp_train ok, loss", round(loss.item(), 4))
