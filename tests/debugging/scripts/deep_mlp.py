"""One training step of a small deep MLP through torch.compile (shared by the debugging tests).

Deterministic (torch.manual_seed). The compiled step computes the loss, so tdbg's compiler gets one
forward graph of ~30 aten ops (linear layers, tanh, layer norm, sigmoid gating, gelu, a mean and
an MSE loss) and, after `loss.backward()`, its backward graph. Prints the loss and a gradient norm.
"""
import torch

torch.manual_seed(0)


class DeepMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.fc3 = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        h = self.norm(h)
        gate = torch.sigmoid(self.fc2(h))
        h = h * gate + h
        h = torch.nn.functional.gelu(h)
        h = h - h.mean(dim=1, keepdim=True)
        return self.fc3(h)


model = DeepMLP()
x, target = torch.randn(8, 16), torch.randn(8, 8)


@torch.compile
def step(x, target):
    return torch.nn.functional.mse_loss(model(x), target)


loss = step(x, target)
loss.backward()
print(f"deep_mlp loss {loss.item():.6f} grad norm {model.fc1.weight.grad.norm().item():.6f}")
