"""The program's state that a graph reads through get_attr, kept from tdbg's own extra runs.

Dynamo installs some tensors a frame reads as attributes of its GraphModule instead of inputs: a
compiled `optimizer.step()` reads every parameter and its Adam state so, and changes them in
place. Every run tdbg adds to the program's own call (the eager reference of the accuracy check,
the second compiled call of the gradient check, determinism's and profile's repeats, save-io's
eager outputs) changed them too, so under `tdbg run` such a training loop took extra optimizer
steps: the program computed other numbers than without tdbg, and the check compared a compiled
call against an eager run that started from another state.

`KeptState(gm)` saves those tensors when made (before the program's call); `from_saved()` is the
context for an extra run: inside, the tensors hold the saved values; when it ends they hold again
what they held before it, and the dict it yields holds the values the run left in the ones it
changed. `mismatches(ended)` compares eager's ended values with what the program's call left.
Only tensors whose bits differ are written back (a write bumps a tensor's version counter)."""
from __future__ import annotations

import contextlib

IN_PLACE = " (changed in place)"   # suffix of a changed input's or attribute's name in mismatches


class KeptState:
    """The strided tensors `gm`'s get_attr nodes read, by target, and their values when made."""

    def __init__(self, gm):
        import torch
        self.tensors = {}
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = fetch_attr(gm, node.target)
                if isinstance(value, torch.Tensor) and value.layout == torch.strided:
                    self.tensors[node.target] = value
        self.saved = {k: _copy(v) for k, v in self.tensors.items()}

    @contextlib.contextmanager
    def from_saved(self):
        """A run the program did not ask for, starting from the saved values; yields a dict that
        holds, after the block, {target: value it left} for the tensors the run changed."""
        from tdbg.repro_templates.runtime import same_bits
        entry = {k: _copy(v) for k, v in self.tensors.items() if not same_bits(v, self.saved[k])}
        self._put(self.saved)
        ended: dict = {}
        try:
            yield ended
        finally:
            ended.update((k, _copy(v)) for k, v in self.tensors.items() if not same_bits(v, self.saved[k]))
            self._put({**self.saved, **entry})

    def mismatches(self, ended: dict) -> list:
        """The tensors eager's run (`ended`, from `from_saved`) or the program's call changed:
        eager's values against the ones the program's call left, judged against eager alone."""
        from tdbg.minifier.diagnose.accuracy import compare
        from tdbg.repro_templates.runtime import same_bits
        names = [k for k, v in self.tensors.items() if k in ended or not same_bits(v, self.saved[k])]
        if not names:
            return []
        return compare([ended.get(k, self.saved[k]) for k in names], [self.tensors[k].detach() for k in names],
                       names=[k + IN_PLACE for k in names])

    def _put(self, values: dict) -> None:
        import torch

        from tdbg.repro_templates.runtime import same_bits
        with torch.no_grad():
            for k, value in values.items():
                if not same_bits(self.tensors[k], value):
                    self.tensors[k].copy_(value)


def _copy(t):
    """Its values (restored with copy_, compared by value: the strides need not be kept)."""
    return t.detach().clone()


def fetch_attr(gm, target: str):
    """`gm`'s attribute at a dotted get_attr target (None where there is none)."""
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj
