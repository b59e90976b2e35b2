"""Weight-only work of an inference graph runs once per weight version, not once per call.

An inference graph often computes values from its parameters alone: MobileBERT's vocabulary
projection multiplies by `cat([decoder.weight.t(), dense.weight])` (a 62 MB copy, 4.6 ms a call at
2 threads), a BatchNorm scales by `weight * rsqrt(running_var + eps)`, an embedding looks up a
buffer of position ids. Eager and Inductor (without `freezing`) redo this on every call; Inductor's
`freezing` folds it once but turns the weights into constants, so a later optimizer step or
`load_state_dict` is not seen. Here the graph is split in two:

- `plan(gm, static_names)` finds the hoistable nodes: those whose every input is a static graph
  input (a parameter or buffer: AOTAutograd's `static_input_indices`, given by name), a constant
  (`get_attr`) or another hoistable node, that are deterministic, functional aten ops with a
  tensor value, and that do some work (a chain of views of a weight is free, and left alone:
  prepack.py wants `W.t()` of the input itself). A hoistable value the graph returns, itself or
  through views, stays in the main graph, so no output aliases the cache.
- `Hoisted.pre` computes the frontier (hoisted values the rest of the graph reads) with aten, and
  the main graph takes them as extra inputs after its own (`Hoisted.main`, what gets compiled; a
  frontier input is an input like a weight, so prepack.py packs a linear by it).
- `Hoisted.wrap(call)` runs `pre` again only when a static input it reads is another tensor, has
  another storage or was written in place (its version), as PackedWeights does; otherwise the
  frozen values from last time are passed on.

The cache holds one copy of each frontier value for as long as the compiled graph lives
(`hoisted_bytes`); `hoist_weights=False` (TDBG_HOIST_WEIGHTS=0, `tdbg bisect`'s `hoist` row) turns
it off. Writes through `w.data` are not seen (as for packed weights and autograd's own checks).
"""
from __future__ import annotations

import operator
from typing import Optional

import torch

from .logs import get_logger
from .ops import VIEW_OPS, op_name
from .torch_compat import OpOverload, tensor_version
from .weight_cache import PerTensors

log = get_logger("compiler")


class Hoisted:
    """The split of one graph: `pre` (static inputs -> frontier), `main` (inputs + frontier ->
    outputs), `examples` (the frontier's example values, main's extra inputs)."""

    def __init__(self, pre, pre_inputs, main, examples, names):
        self.pre, self.pre_inputs, self.main, self.examples, self.names = pre, pre_inputs, main, examples, names
        self.hoisted_bytes = sum(v.numel() * v.element_size() for v in examples)
        self.runs = 0   # times `pre` ran: once per weight version

    def wrap(self, call):
        """`call(args + frontier)`, the frontier made once per set of static input tensors (one
        graph serves every instance of a module class: weight_cache.py) and again when one of
        them changed."""
        cache, warned = PerTensors(), []

        def hoisted_call(args):
            ws = [args[i] for i in self.pre_inputs]
            return call(list(args) + cache.get(ws, None, lambda: self._pre(ws, warned)))
        return hoisted_call

    def _pre(self, ws, warned: list):
        if not warned and any(tensor_version(w) is None for w in ws):
            warned.append(True)
            log.warning("weights made under torch.inference_mode have no version counter: the %d "
                        "value(s) computed from them alone (%.1f MiB) are recomputed on every call; "
                        "make the model outside inference_mode to compute them once",
                        len(self.names), self.hoisted_bytes / 2**20)
        return self.run_pre(ws)

    def run_pre(self, ws):
        """The frontier values for these static inputs, in the examples' strides."""
        self.runs += 1
        with torch.no_grad():
            outs = self.pre(*ws)
        # the compiled main graph was specialized on the example's strides: keep them
        return [v if v.stride() == e.stride() else torch.empty_strided(e.shape, e.stride(), dtype=v.dtype).copy_(v)
                for v, e in zip(outs, self.examples)]


def plan(gm: torch.fx.GraphModule, static_names) -> Optional[Hoisted]:
    """The split of `gm`, or None when it has no hoistable work."""
    static = {n for n in gm.graph.nodes if n.op == "placeholder" and n.name in static_names
              or n.op == "get_attr"}
    derived, hoisted = _hoistable(gm, static)
    if not hoisted:
        return None
    frontier = [n for n in gm.graph.nodes if n in hoisted and any(u not in hoisted for u in n.users)]
    return _split(gm, derived, hoisted, frontier)


def _hoistable(gm, static) -> tuple:
    """(derived, hoisted): the nodes computed from `static` alone, and those of them the main
    graph need not compute: the ones that do work, less any the graph returns and any non-tensor
    value the main graph reads (each of those stays in the main graph, its inputs read instead)."""
    derived, hoisted = set(), set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.all_input_nodes and _pure(n) \
                and all(a in static or a in derived for a in n.all_input_nodes):
            derived.add(n)
            # views cost nothing: a chain of them over a weight is not worth an input of its own
            if op_name(n.target) not in VIEW_OPS or any(a in hoisted for a in n.all_input_nodes):
                hoisted.add(n)
    returned = _returned(gm)
    while True:
        # an output must not alias the cache, only tensors travel as inputs, and a view the main
        # graph reads stays there: a linear by `cat(...).t()` then reads the cat, which prepack packs
        stay = {n for n in hoisted if n in returned or any(u not in hoisted for u in n.users)
                and (not isinstance(n.meta.get("val"), torch.Tensor) or op_name(n.target) in VIEW_OPS)}
        if not stay:
            return derived, hoisted
        hoisted -= stay


def _returned(gm) -> set:
    """The nodes whose values the graph returns, itself or through a chain of views."""
    todo = [a for out in gm.graph.nodes if out.op == "output" for a in out.all_input_nodes]
    seen = set()
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            if n.op == "call_function" and op_name(n.target) in VIEW_OPS:
                todo.extend(n.all_input_nodes)
    return seen


def _pure(n) -> bool:
    """A deterministic, functional aten op (or getitem of one's tuple)."""
    if n.target is operator.getitem:
        return True
    if not isinstance(n.target, OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in n.target.tags:
        return False
    return not n.target._schema.is_mutable


def _split(gm, derived, hoisted, frontier) -> Hoisted:
    # pre: static inputs -> frontier values
    pre_graph, env = torch.fx.Graph(), {}
    needed = _closure(frontier, derived)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    pre_inputs = []
    for i, n in enumerate(placeholders):
        if any(u in needed for u in n.users):
            env[n] = pre_graph.placeholder(n.name)
            env[n].meta = dict(n.meta)
            pre_inputs.append(i)
    for n in gm.graph.nodes:
        if n in needed or n.op == "get_attr" and any(u in needed for u in n.users):
            env[n] = pre_graph.node_copy(n, lambda a: env[a])
    pre_graph.output(tuple(env[n] for n in frontier))
    pre = torch.fx.GraphModule(gm, pre_graph, "hoisted")

    # main: the rest, reading each frontier value as an input after the graph's own
    main_graph, env = torch.fx.Graph(), {}
    for n in placeholders:
        env[n] = main_graph.node_copy(n, lambda a: env[a])
    names = []
    for k, n in enumerate(frontier):
        env[n] = main_graph.placeholder(f"hoisted_{k}_{n.name}")
        env[n].meta = {"val": n.meta["val"]}
        names.append(n.name)
    for n in gm.graph.nodes:
        if n.op != "placeholder" and n not in hoisted:
            env[n] = main_graph.node_copy(n, lambda a: env[a])
    main_graph.eliminate_dead_code()
    main = torch.fx.GraphModule(gm, main_graph, gm.__class__.__name__)
    return Hoisted(pre, pre_inputs, main, [n.meta["val"] for n in frontier], names)


def _closure(frontier, derived) -> set:
    """The derived nodes the frontier needs."""
    seen, stack = set(), list(frontier)
    while stack:
        n = stack.pop()
        if n in seen or n not in derived:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen
