"""Backends written the way people write them: FX passes with module-level helpers, in-place
graph edits, and aot_autograd(...) compilers. Each is subtly wrong so tdbg has something to find."""
import torch
from torch._dynamo.backends.common import aot_autograd


def _bad_relu(x):
    # right for x >= -1, wrong below: the bug only shows for some inputs
    return torch.where(x < -1, -x, torch.relu(x))


def _swap_relu(graph):
    for node in graph.nodes:
        if node.op == "call_function" and node.target in (torch.relu, torch.nn.functional.relu):
            node.target = _bad_relu
        elif node.op == "call_method" and node.target == "relu":
            node.op, node.target = "call_function", _bad_relu


def wrong_below_minus_one(gm, example_inputs):
    """Copies the graph before editing it (as careful backends do)."""
    new = torch.fx.GraphModule(gm, _copied(gm))
    _swap_relu(new.graph)
    new.recompile()
    return new.forward


def _copied(gm):
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return graph


def edits_in_place(gm, example_inputs):
    """Edits Dynamo's GraphModule itself (as many quick backends do)."""
    _swap_relu(gm.graph)
    gm.recompile()
    return gm.forward


def _fw(gm, example_inputs):
    return gm


def _bw_wrong(gm, example_inputs):
    # the backward graph's first output comes out doubled
    def run(*args):
        outs = list(gm(*args))
        if outs and isinstance(outs[0], torch.Tensor):
            outs[0] = outs[0] * 2
        return outs
    run._boxed_call = False
    return run


wrong_backward = aot_autograd(fw_compiler=_fw, bw_compiler=_bw_wrong)
