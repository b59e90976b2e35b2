"""User backends for --check-determinism beyond the first call and forward
(tests/debugging/test_determinism_later.py). Both emulate a parallel reduction whose threads finish
in another order on every call: the last bit alternates with a call counter (never torch's RNG), so
any two consecutive calls differ on every machine, as in tests/scenarios/scripts/nondeterministic_backends.py.

`grain_sum`: a whole-tensor sum that is parallel (nondeterministic) only from GRAIN elements up, as
compiled reductions are (below it one thread sums in order).
`aot_mm_backward`: an aot_autograd backend whose BACKWARD aten graph's matrix products are
nondeterministic (as Inductor's embedding-backward kernel with atomic adds is on a BERT training
step); its forward is exact.

(A backend defined in the script being run is looked up late and hides its AOT stage from tdbg:
these live in their own file.)
"""
import itertools

import torch
from torch._dynamo.backends.common import aot_autograd

GRAIN = 4096
_calls = itertools.count()


def _grain_sum(x):
    total = torch.sum(x)
    if x.numel() >= GRAIN and next(_calls) % 2:
        return torch.nextafter(total, torch.tensor(float("inf"), dtype=total.dtype))
    return total


def grain_sum(gm, example_inputs):
    for node in gm.graph.nodes:
        if node.op == "call_method" and node.target == "sum" and len(node.args) == 1 and not node.kwargs:
            node.op, node.target = "call_function", _grain_sum
    gm.recompile()
    return gm.forward


def _shuffled_mm(a, b):
    out = torch.mm(a, b)
    if next(_calls) % 2:
        return torch.nextafter(out, torch.full_like(out, float("inf")))
    return out


def _backward(gm, example_inputs):
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten.mm.default:
            node.target = _shuffled_mm
    gm.recompile()
    return gm


aot_mm_backward = aot_autograd(fw_compiler=lambda gm, example_inputs: gm, bw_compiler=_backward)
