"""An aot_autograd backend whose forward is right and whose backward doubles the first gradient
that is a tensor (the first parameter's, in graphs whose leading inputs are integer ids and so
get no gradient). Inference never runs the backward, so only a gradient check can catch it."""
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd


def _fw(gm, example_inputs):
    return make_boxed_func(gm.forward)


def _bw_doubles_first_grad(gm, example_inputs):
    def run(args):
        outs = list(gm(*args))
        first = next(i for i, o in enumerate(outs) if isinstance(o, torch.Tensor))
        outs[first] = outs[first] * 2
        return outs
    run._boxed_call = True
    return run


doubles_first_grad = aot_autograd(fw_compiler=_fw, bw_compiler=_bw_doubles_first_grad)
