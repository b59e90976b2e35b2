"""The float64 reference of a graph that draws random numbers.

A graph run in float64 draws other random numbers than eager (a float64 dropout mask consumes
the generator differently), so its error would excuse anything, and such graphs used to be judged
against eager alone: a training step with dropout had no reference, and a reordered sum in its
gradients (1.5e-5 off eager against 1.2e-5 allowed, a BertModel) was a false failure.

`same_draws_fp64(gm)` runs an FX graph in float64 except at the nodes that draw: those run in
their eager dtypes (their float64 arguments cast back, differentiably), on the generator state
eager had there, so they draw what eager drew; their results go on in float64. A node draws when
running it moved torch's CPU generator (found as it runs: no table of random ops to fall out of
date). The caller checks that the whole run left the generator where eager's left it
(`generator_matches`): only then were the draws the same, and only then is the reference used.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch.fx.node import map_arg

from tdbg.minifier.diagnose.accuracy import to_fp64


# (argument, value at which the op draws nothing): attention carries the random tag for its dropout,
# which transformers leave at 0 in eval mode; native_dropout outside training is the identity
NO_DRAW = (("dropout_p", 0.0), ("train", False))


def draws_random(node) -> bool:
    """The FX node draws random numbers: its op is tagged nondeterministic_seeded (dropout, rand,
    attention) and no NO_DRAW argument rules a draw out. Attention with dropout_p = 0 counted as
    random once, and everything after a transformer's first attention went unjudged."""
    if node.op != "call_function" or torch.Tag.nondeterministic_seeded not in getattr(node.target, "tags", ()):
        return False
    schema = getattr(node.target, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else ()):
        for name, idle in NO_DRAW:
            if arg.name == name:
                value = node.args[i] if i < len(node.args) else node.kwargs.get(name, arg.default_value)
                if value == idle:
                    return False
    return True


def _eager_dtype(node):
    val = node.meta.get("example_value", node.meta.get("val"))
    return val.dtype if isinstance(val, torch.Tensor) else None


class _SameDraws(torch.fx.Interpreter):
    def run_node(self, n):
        before = torch.get_rng_state()
        out = super().run_node(n)
        if n.op not in ("call_function", "call_method", "call_module") or torch.equal(torch.get_rng_state(), before):
            return out
        torch.set_rng_state(before)   # it drew: draw again as eager did, in eager's dtypes

        def cast(a):
            value, dtype = self.env[a], _eager_dtype(a)
            if isinstance(value, torch.Tensor) and value.is_floating_point() and dtype is not None \
                    and dtype.is_floating_point:
                return value.to(dtype)
            return value
        args, kwargs = map_arg((n.args, n.kwargs), cast)
        self.current_node = n
        out = getattr(self, n.op)(n.target, args, kwargs)
        return _raise(out)


def _raise(value):
    """float64 of each floating tensor in `value`, differentiably (to_fp64 detaches)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.float64)
    if isinstance(value, (list, tuple)):
        return type(value)(_raise(v) for v in value)
    return value


def same_draws_fp64(gm: torch.fx.GraphModule) -> Callable:
    """A callable running a float64 copy of `gm` (its parameters and buffers raised) on float64
    inputs, its random nodes drawing in their eager dtypes (module docstring). The caller raises
    the inputs (accuracy.to_fp64) and restores the generator state eager started from."""
    module = copy.deepcopy(gm).to(torch.float64)
    return lambda *args: _SameDraws(module).run(*args)


def same_draws_reference(gm, inputs: list, eager_end_state) -> Any:
    """`gm`'s float64 reference on `inputs` (no grad), from the current generator state; None
    when it cannot run or did not end on `eager_end_state` (then its draws were not eager's)."""
    try:
        with torch.no_grad():
            out = same_draws_fp64(gm)(*to_fp64(list(inputs)))
    except Exception:
        return None
    return out if generator_matches(eager_end_state) else None


def generator_matches(eager_end_state) -> bool:
    """Whether torch's CPU generator is where eager's run left it."""
    return torch.equal(torch.get_rng_state(), eager_end_state)
