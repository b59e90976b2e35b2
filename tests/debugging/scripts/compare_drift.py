"""Drift without a culprit: `noisy` compiles each aten graph to an interpreter that makes every
floating op's result 2e-6 (about 32 float32 ulps, within float32's rtol of 1.3e-5) too large. No op is wrong beyond float32's
tolerance, but a 60-op recurrence accumulates the error past it: `tdbg compare --backend
THIS_FILE:noisy` must call it drift, not blame an op."""
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd


def noisy_compiler(gm, example_inputs):
    def run(*args):
        env, inputs = {}, iter(args)
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(inputs)
            elif node.op == "call_function":
                args_, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
                out = node.target(*args_, **kwargs)
                noisy = isinstance(out, torch.Tensor) and out.is_floating_point()
                env[node] = out * (1 + 2e-6) if noisy else out
            elif node.op == "output":
                return torch.fx.node.map_arg(node.args[0], env.__getitem__)
    return make_boxed_func(run)


noisy = aot_autograd(fw_compiler=noisy_compiler)


def recurrence(x):
    y = x
    for _ in range(20):
        y = y * 0.9 + x * 0.1
    return y


if __name__ == "__main__":
    x = torch.linspace(0.5, 1.5, 256)
    torch.compile(recurrence, backend=noisy)(x)
