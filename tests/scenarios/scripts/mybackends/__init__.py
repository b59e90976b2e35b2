"""An importable package of user backends (`mybackends:crashy`), used as module:function."""
import torch


def _explode(gm):
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in (torch.sin, torch.ops.aten.sin.default):
            raise RuntimeError("mybackends cannot compile sin")


def crashy(gm, example_inputs):
    _explode(gm)
    return gm.forward
