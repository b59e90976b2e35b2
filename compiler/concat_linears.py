"""Linears that read the same input become one GEMM over their weights concatenated.

Attention's Q, K and V projections (and a gated MLP's gate and up projections) each multiply the
same activations by a weight of their own: three GEMMs, each reading the activations again, each
small enough that MKL's packed copy of it costs more memory than prepack.py allows. As one GEMM
over `cat([Wq, Wk, Wv])` they read the activations once, and the wider weight packs. Measured
2026-11-27, 2-core Xeon, 2 threads, 128 rows: BERT-base's three [768, 768] linears 1.23 ms as
addmm, 1.04 ms as one packed [2304, 768]; ELECTRA-small's [256, 256] x3 0.166 vs 0.124 ms.

`concat_linears(gm, example_inputs, config, kind, static_names)` rewrites, in a float32 inference
graph with static shapes, each group of two or more `addmm(b_i, a, W_i.t())` (or each group of
`mm(a, W_i.t())`) whose A is the same value (the same node, or equal views of one), whose W_i are
[N_i, K] parameters (`static_names`) and whose b_i are [N_i] parameters, into

    W = cat(W_i); b = cat(b_i); y = addmm(b, a, W.t()); y_i = y[:, off_i : off_i + N_i]

The concatenations depend on weights alone, so hoist.py computes them once per weight version
(the cache holds one more copy of those weights) and prepack.py packs the wide GEMM. Groups of
the same parameters (ALBERT's twelve layers share one set) read one concatenation. Each y_i is a
column slice, strided by sum(N_i); every node's fake value is recomputed with those strides
(layout.propagate), and an output keeps eager's strides. Off with `concat_linears=False`
(TDBG_CONCAT_LINEARS=0, `tdbg bisect`'s `concat linears` row), and whenever hoisting is off (the
cat would then copy the weights on every call).
"""
from __future__ import annotations

from collections import defaultdict

import torch

from . import layout
from .logs import get_logger
from .ops import op_name

aten = torch.ops.aten
log = get_logger("compiler")
LINEARS = {aten.addmm.default: "addmm", aten.mm.default: "mm"}
# A's equal views: the same source, op and arguments make the same value
_VIEWS = frozenset({"view", "reshape", "_unsafe_view"})


def concat_linears(gm: torch.fx.GraphModule, example_inputs, config, kind: str, static_names) -> torch.fx.GraphModule:
    """A copy of `gm` with each group of linears (see module docstring) as one GEMM, or `gm`
    itself when there is none or the pass does not apply."""
    if kind != "inference" or not getattr(config, "concat_linears", True) or not config.hoist_weights \
            or not static_names or not all(_static(x) for x in example_inputs):
        return gm
    found = _groups(gm.graph, set(static_names))
    if not found:
        return gm
    graph, copies = torch.fx.Graph(), {}
    graph.output(graph.graph_copy(gm.graph, copies))
    groups = [[copies[n] for n in g] for g in found]
    cats: dict = {}   # the weights (or biases) concatenated -> their cat: ALBERT's layers share one
    for group in groups:
        _rewrite(graph, group, cats)
    try:
        layout.propagate(graph, example_inputs)
    except Exception as e:   # an op fake tensors cannot run (data-dependent output): leave the graph be
        log.info("linears not concatenated: recomputing the graph's strides failed: %s: %s", type(e).__name__, e)
        return gm
    log.info("%d group(s) of linears reading one input run as one GEMM each: %s", len(groups),
             "; ".join("+".join(n.name for n in g) for g in groups))
    new = torch.fx.GraphModule(gm, graph)
    new.recompile()
    return new


def _static(x) -> bool:
    if isinstance(x, torch.Tensor):
        return all(isinstance(s, int) for s in x.shape)
    return not isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _groups(graph, static: set) -> list:
    """Groups (each a list in graph order, two or more) of linears that can share one GEMM."""
    by_key = defaultdict(list)
    for node in graph.nodes:
        key = _key(node, static)
        if key is not None:
            by_key[key].append(node)
    return [g for g in by_key.values() if len(g) > 1]


def _key(node, static: set):
    """(kind, A's identity, K) for a linear by a parameter's weight, else None."""
    kind = LINEARS.get(node.target) if node.op == "call_function" else None
    if kind is None or node.kwargs or len(node.args) != (3 if kind == "addmm" else 2):
        return None
    a, b = node.args[-2], node.args[-1]
    weight = _transposed_param(b, static)
    val = node.meta.get("val")
    if weight is None or not isinstance(val, torch.Tensor) or val.dtype != torch.float32:
        return None
    if kind == "addmm" and not _param_vector(node.args[0], static, val.shape[1]):
        return None
    return kind, _identity(a), weight.meta["val"].shape[1]


def _transposed_param(b, static: set):
    """W when `b` is W.t() (aten.t or permute [1, 0]) of a contiguous float32 [N, K] parameter."""
    if not isinstance(b, torch.fx.Node) or b.op != "call_function":
        return None
    if not (op_name(b.target) == "t" or op_name(b.target) == "permute" and list(b.args[1]) == [1, 0]):
        return None
    w = b.args[0]
    val = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    if w.op != "placeholder" or w.name not in static or not isinstance(val, torch.Tensor) \
            or val.dim() != 2 or val.dtype != torch.float32 or not val.is_contiguous():
        return None
    return w


def _param_vector(bias, static: set, n) -> bool:
    val = bias.meta.get("val") if isinstance(bias, torch.fx.Node) else None
    return bias.op == "placeholder" and bias.name in static and isinstance(val, torch.Tensor) \
        and val.dtype == torch.float32 and tuple(val.shape) == (n,)


def _identity(a):
    """A hashable name for A's value: equal views of one node are one value."""
    if isinstance(a, torch.fx.Node) and a.op == "call_function" and op_name(a.target) in _VIEWS:
        return (op_name(a.target), _identity(a.args[0]), tuple(a.args[1:]))
    return a


def _cat(graph, parts: list, cats: dict, transposed: bool = False):
    """cat(parts) (or its transpose, for the GEMM) as one node per distinct list of parameters,
    placed before the first computation (its inputs are all placeholders), so every group using
    those parameters reads the same node."""
    key = (tuple(parts), transposed)
    if key not in cats:
        if transposed:
            cat = _cat(graph, parts, cats)
            with graph.inserting_after(cat):
                cats[key] = graph.call_function(aten.permute.default, (cat, [1, 0]))
        else:
            with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
                cats[key] = graph.call_function(aten.cat.default, (list(parts), 0))
    return cats[key]


def _rewrite(graph, group: list, cats: dict) -> None:
    first = group[0]
    kind = LINEARS[first.target]
    a = first.args[-2]
    weights = [n.args[-1].args[0] for n in group]
    sizes = [w.meta["val"].shape[0] for w in weights]
    wt = _cat(graph, weights, cats, transposed=True)
    with graph.inserting_before(first):
        if kind == "addmm":
            b = _cat(graph, [n.args[0] for n in group], cats)
            y = graph.call_function(aten.addmm.default, (b, a, wt))
        else:
            y = graph.call_function(aten.mm.default, (a, wt))
        start = 0
        for node, n in zip(group, sizes):
            part = graph.call_function(aten.slice.Tensor, (y, 1, start, start + n))
            part.meta = dict(node.meta)   # the old value: propagate keeps a returned slice in eager's strides
            node.replace_all_uses_with(part)
            start += n
    for node in group:
        inputs = node.all_input_nodes
        graph.erase_node(node)
        _erase_dead_views(graph, inputs)


def _erase_dead_views(graph, nodes) -> None:
    """The views (W_i.t(), A's own copy of a view) that only the replaced linears read."""
    for node in nodes:
        if node.op == "call_function" and not node.users and op_name(node.target) in _VIEWS | {"t", "permute"}:
            inputs = node.all_input_nodes
            graph.erase_node(node)
            _erase_dead_views(graph, inputs)
