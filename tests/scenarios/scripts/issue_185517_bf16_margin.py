"""PyTorch issue #185517: bf16 margin_ranking_loss with a Python float margin. Eager rounds the
margin to bf16 (1.703125), Inductor keeps 1.7 in float32, so the loss sits on the other side of
the clamp and the input gradients become zero."""
import torch


def fn(x, y, t):
    return torch.nn.functional.margin_ranking_loss(x, y, t, margin=1.7, reduction="mean")


input1 = torch.tensor([1.703125, 1.703125], dtype=torch.bfloat16, requires_grad=True)
input2 = torch.tensor([0.0, 0.0], dtype=torch.bfloat16, requires_grad=True)
target = torch.tensor([1.0, 1.0], dtype=torch.bfloat16)
loss = torch.compile(fn)(input1, input2, target)
loss.backward()
print("grad:", input1.grad.tolist())
