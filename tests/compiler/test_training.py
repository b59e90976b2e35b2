"""One training step through backend="tdbg": loss and every parameter gradient match eager."""
import copy

import torch
import torch._dynamo

from helpers import assert_matches, check_model


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def test_mlp_training_step_matches_eager():
    model = _mlp()
    reference = copy.deepcopy(model)
    x, target = torch.randn(16, 32), torch.randint(0, 10, (16,))

    def step(m):
        loss = torch.nn.functional.cross_entropy(m(x), target)
        loss.backward()
        return loss.detach()

    torch._dynamo.reset()
    try:
        loss = step(torch.compile(model, backend="tdbg"))
    finally:
        torch._dynamo.reset()
    ref_loss = step(reference)
    assert_matches(ref_loss, loss, what="loss")
    names = [n for n, _ in reference.named_parameters()]
    assert all(p.grad is not None for p in model.parameters())
    assert_matches({n: p.grad for n, p in zip(names, reference.parameters())},
                   {n: p.grad for n, p in zip(names, model.parameters())}, what="gradient")


def test_input_gradients_through_pointwise_and_reduction():
    torch.manual_seed(0)
    x = torch.randn(8, 33, requires_grad=True)

    def fn(t):
        return torch.tanh(t).sum(dim=1) * torch.sigmoid(t).mean()

    check_model(fn, [x], check_grad=True)


def test_layernorm_gelu_block_gradients():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.LayerNorm(24), torch.nn.GELU(),
                                torch.nn.Linear(24, 4))
    check_model(model, [torch.randn(5, 16, requires_grad=True)], check_grad=True)
