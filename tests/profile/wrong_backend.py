"""Test-only Dynamo backends: `wrong` gives results off by one; `flaky` fails from a graph's third call."""
import torch


def wrong(gm, example_inputs):
    def run(*args):
        outs = gm(*args)
        return type(outs)(o + 1 if isinstance(o, torch.Tensor) else o for o in outs)
    return run


def flaky(gm, example_inputs):
    calls = [0]

    def run(*args):
        calls[0] += 1
        if calls[0] >= 3:
            raise RuntimeError(f"kernel fell over on call {calls[0]}")
        return gm(*args)
    return run
