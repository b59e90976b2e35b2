"""aot_autograd backends whose forward is right and whose backward is off in one place, subtly:
one output channel of the first 4-d gradient (a convolution weight's) scaled by 1 + 1e-3, or one
element of the first 1-d gradient of 8 elements (a BatchNorm weight's, in tests/bench's BN net)
moved by 2e-4. Stand-ins for a compiler bug in one channel or one element of a backward kernel,
for the model zoo's gradient check (benchmarks/models.py gradient_mismatches) to catch."""
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd


def _fw(gm, example_inputs):
    return make_boxed_func(gm.forward)


def _perturbing(pick, change):
    def bw_compiler(gm, example_inputs):
        def run(args):
            outs = list(gm(*args))
            i = next(i for i, o in enumerate(outs) if isinstance(o, torch.Tensor) and pick(o))
            outs[i] = change(outs[i].clone())
            return outs
        run._boxed_call = True
        return run
    return bw_compiler


def _scale_channel_0(g):
    g[0] *= 1 + 1e-3
    return g


def _move_element_0(g):
    g[0] += 2e-4
    return g


one_channel_off = aot_autograd(fw_compiler=_fw, bw_compiler=_perturbing(lambda o: o.dim() == 4, _scale_channel_0))
one_element_off = aot_autograd(fw_compiler=_fw, bw_compiler=_perturbing(lambda o: o.shape == (8,), _move_element_0))
