"""A linear with many rows followed by an exact GELU runs as one oneDNN call with GELU as its post-op.

`gelu(x @ W.t() + b)` is a GEMM writing its [M, N] output to memory and a kernel reading it back
to add the bias and apply GELU (erf form: `v * 0.5 * (1 + erf(v * 0.7071067811865476))` after
decomposition). With many rows that output leaves the cache: Swin-tiny's and ConvNeXt-tiny's
first-stage MLPs, [6272, 96] x [96, 384] at batch 2, 2 threads, 2026-11-27: oneDNN linear 1.08 ms
plus the bias-GELU kernel 0.65 ms, against 1.35 ms for oneDNN's linear with the bias and
`gelu_erf` applied while each tile is in registers; [1568, 192] x [192, 768] 1.31 against 1.21;
at fewer rows it depends on the weight: whole models in one process, fused vs not at ~392 rows,
ConvNeXt-tiny's and Swin-tiny's [1536, 384] weights 0.97-0.98x the time, ViT-base's
[3072, 768] 1.04x (MKL's packed weight wins there). So in a float32 inference graph whose weights
are packed, `fuse_linear_gelu` rewrites an `addmm(b, x, W.t())` whose static row count and weight
size fit a FUSE_WHEN row, W a graph input and the GELU its only reader (behind one view),
into `mkldnn._linear_pointwise(x, W, b, "gelu", [], "none")`; prepack.py runs it on W reordered
once (`PackedWeights.dnn_linear`). oneDNN's erf is not eager's: each value moves by an ulp or
so (within what eager's own float32 GELU is off from a float64 one). Only on the CPUs of
FUSE_CPUS: on a 2-core AMD EPYC (Zen 3, AVX2), 2026-11-27, ConvNeXt-tiny took 189 ms fused and
175 unfused (Inductor 180), in one process.
`linear_gelu=False` (TDBG_LINEAR_GELU=0, `tdbg bisect`'s `linear GELU` row) turns it off.
"""
from __future__ import annotations

from typing import Optional

import torch

aten = torch.ops.aten
LINEAR_POINTWISE = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
# (min rows, most weight elements or None): a linear fuses when some row holds. 2 threads, 2026-11-27.
FUSE_WHEN = ((1024, None), (256, 1 << 20))
FUSE_CPUS = ("intel", "other")   # Config.cpu_vendor values it pays on (measured on Intel; AMD's lose)
HALF, SQRT1_2 = 0.5, 0.7071067811865476   # the decomposition's constants (M_SQRT1_2 as a float)


def fuse_linear_gelu(gm: torch.fx.GraphModule, kind: str, config) -> torch.fx.GraphModule:
    """A copy of `gm` with each qualifying linear + GELU as one oneDNN call (see the module
    docstring), or `gm` itself when none qualifies."""
    if kind != "inference" or not config.linear_gelu or not config.pack_weights or not available() \
            or config.cpu_vendor not in FUSE_CPUS:
        return gm
    if not any(_match(n) for n in gm.graph.nodes):
        return gm
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for addmm, view, result in [m for m in map(_match, graph.nodes) if m is not None]:
        bias, x, wt = addmm.args
        with graph.inserting_before(result):
            fused = graph.call_function(LINEAR_POINTWISE.default, (x, wt.args[0], bias, "gelu", [], "none"))
            out = graph.call_function(view.target, (fused, *view.args[1:])) if view is not None else fused
        fused.meta = dict(addmm.meta)
        if view is not None:
            out.meta = dict(view.meta)
        result.replace_all_uses_with(out)
    graph.eliminate_dead_code()
    new = torch.fx.GraphModule(gm, graph)
    new.recompile()
    return new


def available() -> bool:
    return LINEAR_POINTWISE is not None and torch.backends.mkldnn.is_available() \
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _match(erf) -> Optional[tuple]:
    """(addmm, view or None, the GELU's last mul) when `erf` is the erf of an exact GELU of a
    qualifying linear's output, else None."""
    if erf.op != "call_function" or erf.target is not aten.erf.default or len(erf.users) != 1:
        return None
    scaled = erf.args[0]
    v = _scaled_input(scaled, SQRT1_2)
    if v is None or len(v.users) != 2:
        return None
    halves = [u for u in v.users if u is not scaled and _scaled_input(u, HALF) is v]
    plus_one = next(iter(erf.users))
    if not halves or not _is_call(plus_one, aten.add.Tensor) or plus_one.args[1:] != (1,) or len(plus_one.users) != 1:
        return None
    result = next(iter(plus_one.users))
    if not _is_call(result, aten.mul.Tensor) or set(result.args) != {halves[0], plus_one} or len(halves[0].users) != 1:
        return None
    view = v if _is_call(v, aten.view.default) or _is_call(v, aten._unsafe_view.default) else None
    addmm = v.args[0] if view is not None else v
    if view is not None and len(addmm.users) != 1:
        return None
    return (addmm, view, result) if _linear(addmm) else None


def _scaled_input(node, factor) -> Optional[torch.fx.Node]:
    """v when `node` is mul(v, factor) (the float of the decomposition's constant), else None."""
    if not _is_call(node, aten.mul.Tensor) or len(node.args) != 2:
        return None
    v, c = node.args
    return v if isinstance(v, torch.fx.Node) and isinstance(c, float) and c == factor else None


def _linear(addmm) -> bool:
    """addmm(b, x, W.t()) in float32: beta = alpha = 1, b of shape [N], x's static rows and W's
    size a FUSE_WHEN row, W a contiguous [N, K] graph input."""
    if not _is_call(addmm, aten.addmm.default) or len(addmm.args) != 3 or addmm.kwargs:
        return False
    bias, x, wt = addmm.args
    transposed = _is_call(wt, aten.t.default) or _is_call(wt, aten.permute.default) and list(wt.args[1]) == [1, 0]
    if not transposed or wt.args[0].op != "placeholder":
        return False
    vals = [n.meta.get("val") for n in (bias, x, wt.args[0], addmm)]
    if not all(isinstance(v, torch.Tensor) and v.dtype == torch.float32 for v in vals):
        return False
    b, xv, w, out = vals
    rows = xv.shape[0]
    return (b.dim() == 1 and w.dim() == 2 and w.is_contiguous() and b.shape[0] == w.shape[0]
            and isinstance(rows, int) and xv.dim() == 2 and xv.is_contiguous() and out.is_contiguous()
            and any(rows >= r and (most is None or w.numel() <= most) for r, most in FUSE_WHEN))


def _is_call(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target
