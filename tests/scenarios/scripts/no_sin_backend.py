"""A backend with a gap, the way hand-written backends have them: an aot_autograd(...) compiler
whose kernel table has no aten.sin. It fails to compile any graph that calls sin, also inside a
higher-order op's body (torch.cond's branches), and runs every other graph eagerly."""
import torch
from torch._dynamo.backends.common import aot_autograd

KERNELS_MISSING = {torch.ops.aten.sin.default}


def _compile(gm, example_inputs):
    for module in gm.modules():
        graph = getattr(module, "graph", None)
        for node in graph.nodes if graph is not None else ():
            if node.op == "call_function" and node.target in KERNELS_MISSING:
                raise NotImplementedError(f"no kernel for {node.target} (node {node.name})")
    return gm


no_sin = aot_autograd(fw_compiler=_compile)
