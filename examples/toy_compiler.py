"""Seed program from the troubleshooting guide: a user backend that fails on relu."""
import torch

model = torch.nn.Sequential(*[torch.nn.Linear(200, 200) for _ in range(5)])


def toy_compiler(gm: torch.fx.GraphModule, _):
    for node in gm.graph.nodes:
        if node.target == torch.relu:
            assert False, "toy_compiler does not support relu"
    return gm


def test_backend_error():
    y = torch.ones(200, 200)
    x = torch.ones(200, 200)
    z = x + y
    a = torch.relu(z)
    return model(a)


compiled_test_backend_error = torch.compile(test_backend_error, backend=toy_compiler)
compiled_test_backend_error()
