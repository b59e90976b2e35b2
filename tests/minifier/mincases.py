"""Shared cases for the minifier tests (imported as `mincases`): small graphs, no compiler."""
import pytest
import torch
import torch.fx as fx

from tdbg.minifier.artifacts.graph_io import TensorStore, from_graph_module

OPS = (torch.sin, torch.cos, torch.relu, torch.tanh, torch.sigmoid)


def chain_fn(x, y):
    """40 ops in a chain; neg at step 7 and mul (with y) at step 31 are the two culprits."""
    for i in range(40):
        if i == 7:
            x = torch.neg(x)
        elif i == 31:
            x = torch.mul(x, y)
        else:
            x = OPS[i % 5](x)
    return x


def make_case(fn, *inputs):
    store = TensorStore()
    return from_graph_module(fx.symbolic_trace(fn), list(inputs), store), store


def targets(case) -> list:
    return [n.target for n in case.compute_nodes()]


@pytest.fixture
def chain():
    torch.manual_seed(0)
    return make_case(chain_fn, torch.randn(4, 8), torch.randn(4, 8))
