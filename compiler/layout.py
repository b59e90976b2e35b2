"""Layout planning: channels_last activations through the convolutions of an inference graph.

oneDNN's CPU convolutions are much faster on NHWC (channels_last) activations than on NCHW ones
(a contiguous input is reordered inside every call), and aten picks the output's memory format
from the input's. So for an inference graph with 2-d convolutions, `plan_layout` returns a copy of
the aten graph in which every convolution's input is converted to channels_last (an
`aten.clone(x, memory_format=channels_last)`: when `x` is computed by tdbg, the lowering produces
it in that layout directly, so the conversion costs no extra pass), then re-derives every node's
fake value (`meta["val"]`) the way aten would compute it on those inputs: the pointwise ops,
normalizations and residual adds after a convolution inherit NHWC (TensorIterator keeps the
memory format), and the lowering realizes each buffer with the strides its value has here
(`meta["tdbg_layout"]`), looping in memory order (ComputedBuffer.loop_order).

A value that already is NHWC in the traced graph (a channels_last input and what follows it)
is planned too: without a mark the lowering would realize it contiguous (NCHW) and loop over it
transposed.

Contracts:
- the graph's outputs keep the strides eager gives them (`meta["tdbg_eager_stride"]` on the
  output nodes, honoured by the lowering; an output computed by an aten call in another layout is
  copied back);
- weights stay as they are (converting them to channels_last costs a pass and gains nothing:
  oneDNN wants its own blocked format, which prepack.py makes once per weight);
- a view that cannot be taken of the new layout becomes a reshape (same values);
- when anything cannot be derived (an op fails on the fake values), the original graph is
  compiled unchanged: the planning is an optimization, never a reason to fail.
Only inference graphs are planned: a training graph's saved activations and the backward's
inputs have strides AOTAutograd fixed before tdbg sees them.
"""
from __future__ import annotations

import operator

import torch
import torch.fx
from torch.fx.node import map_arg

from .logs import get_logger

aten = torch.ops.aten
log = get_logger("compiler")

CONVOLUTIONS = (aten.convolution.default,)
# views whose fake value fails on a non-contiguous input are replaced by the op on the right
VIEW_FIXES = {aten.view.default: aten.reshape.default, aten._unsafe_view.default: aten.reshape.default}


def wants_channels_last(gm, kind: str, config) -> bool:
    """An inference graph with at least one 2-d convolution (4-d input, not transposed)."""
    if not getattr(config, "layout_optimization", True) or kind != "inference":
        return False
    return any(_conv2d(n) for n in gm.graph.nodes)


def _conv2d(node) -> bool:
    if node.op != "call_function" or node.target not in CONVOLUTIONS:
        return False
    val, transposed = node.args[0].meta.get("val"), node.args[6] if len(node.args) > 6 else False
    return isinstance(val, torch.Tensor) and val.dim() == 4 and not transposed and val.dtype.is_floating_point


def is_channels_last(t) -> bool:
    """4-d, dense in NHWC order and not also plainly contiguous (a 1x1 image is both)."""
    return (isinstance(t, torch.Tensor) and t.dim() == 4 and not t.is_contiguous()
            and t.is_contiguous(memory_format=torch.channels_last))


def plan_layout(gm, example_inputs, config, kind="inference"):
    """The planned copy of `gm` (see module docstring), or `gm` itself when nothing changes."""
    if not wants_channels_last(gm, kind, config):
        return gm
    graph = torch.fx.Graph()
    remap: dict = {}
    graph.output(graph.graph_copy(gm.graph, remap))
    new = torch.fx.GraphModule(gm, graph)
    inserted = 0
    for node in list(graph.nodes):
        if _conv2d(node) and not is_channels_last(node.args[0].meta["val"]):
            with graph.inserting_before(node):
                cl = graph.call_function(aten.clone.default, (node.args[0],),
                                         {"memory_format": torch.channels_last})
            node.replace_input_with(node.args[0], cl)
            inserted += 1
    try:
        propagate(graph, example_inputs)
    except Exception as e:   # an op the fake values cannot run: keep the graph as traced
        log.info("layout planning skipped: %s: %s", type(e).__name__, e)
        return gm
    if not any(n.meta.get("tdbg_layout") for n in graph.nodes):
        return gm
    graph.lint()
    new.recompile()
    log.info("layout planning: %d convolution input(s) to channels_last, %d buffer(s) planned NHWC", inserted,
             sum(1 for n in graph.nodes if n.meta.get("tdbg_layout")))
    return new


def propagate(graph, example_inputs):
    """Recompute every node's meta["val"] on fake tensors with the example inputs' strides; mark
    the nodes whose strides changed (tdbg_layout) and keep eager's strides for the outputs."""
    from .torch_compat import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    env: dict = {}
    inputs = iter(example_inputs)
    value = (lambda a: env.get(a, a) if isinstance(a, torch.fx.Node) else a)
    out_node = next(n for n in reversed(graph.nodes) if n.op == "output")
    outputs = set(out_node.all_input_nodes)
    with mode:
        for node in list(graph.nodes):
            old = node.meta.get("val")
            if node.op == "placeholder":
                x = next(inputs)
                result = (torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype)
                          if isinstance(x, torch.Tensor) else x)
            elif node.op == "call_function":
                args, kwargs = map_arg(node.args, value), map_arg(node.kwargs, value)
                try:
                    result = node.target(*args, **kwargs)
                except (RuntimeError, ValueError):   # aten's view refuses strides it cannot view
                    if node.target not in VIEW_FIXES:
                        raise
                    node.target = VIEW_FIXES[node.target]
                    result = node.target(*args, **kwargs)
            elif node.op == "get_attr":
                result = old
            else:
                continue
            env[node] = result
            if node.op != "call_function" or node.target is operator.getitem and not isinstance(result, torch.Tensor):
                continue
            node.meta["val"] = result
            if not isinstance(result, torch.Tensor):
                continue
            if isinstance(old, torch.Tensor) and result.stride() != old.stride():
                node.meta["tdbg_layout"] = "channels_last" if is_channels_last(result) else "planned"
                if node in outputs:
                    node.meta["tdbg_eager_stride"] = tuple(old.stride())
            elif is_channels_last(result):   # an inserted conversion, or NHWC already in the traced graph
                node.meta["tdbg_layout"] = "channels_last"
