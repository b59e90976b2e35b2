"""A linear's bias is added by the kernel that reads its output, not by the GEMM.

`addmm(b, x, W)` first copies the bias into every row of its output, then accumulates the
product onto it: a pass over the output before the GEMM (at 2 threads, [128, 256] x [256, 1024]:
addmm 223 us, mm 202; BERT-base's [512, 768] x [768, 3072] on a packed weight: 6.42 ms with the
bias, 6.18 without). When everything that reads the linear's output is lowered by tdbg (the
GELU after it, a residual add, a LayerNorm), the bias add fuses into that kernel for the price of
one load of a vector. So in a float32 inference graph, `split_biases` rewrites such an
`addmm(b, x, W)` (beta = alpha = 1, b of shape [N]) into `add(mm(x, W), b)`; prepack.py then
packs the `mm` like any other linear. A linear read by an extern call (the Q/K/V projections
before attention) keeps its addmm: the add would cost a pass of its own. So does a linear read in
parts, through two or more slices (concatenated Q/K/V copied out head by head, MobileViT's
attention): each part has a reader of its own, so lowering realizes the add as a kernel of its own
too (MobileViT-small, 2-core Xeon, 2 threads, 2026-11-27, under the profiler: nine add kernels
0.32 ms per call; kept as addmm, their bias copies 0.16 ms).

The product is rounded before the bias is added (addmm adds it first): results move by an ulp
or so. `bias_epilogue=False` (TDBG_BIAS_EPILOGUE=0, `tdbg bisect`'s `bias epilogue` row)
turns it off.
"""
from __future__ import annotations

import torch

from . import ops

aten = torch.ops.aten
ADDMM = aten.addmm.default
# readers that tdbg's kernels compute, so the add fuses into them: the op table's pointwise ops and
# the reductions (LayerNorm's var_mean, softmax's amax and sum); a scan may run as an aten call
KERNEL_READERS = frozenset(ops.TABLE) | frozenset(ops.OTHER_LOWERINGS["reduction"]) | {"clone", "var_mean"}


def split_biases(gm: torch.fx.GraphModule, kind: str, config) -> torch.fx.GraphModule:
    """A copy of `gm` with each qualifying addmm split (see module docstring), or `gm` itself
    when none qualifies."""
    if kind != "inference" or not getattr(config, "bias_epilogue", True):
        return gm
    def reads_in_kernel(target):
        return ops.op_name(target) in KERNEL_READERS \
            and not any(ops.op_matches(spec, target) for spec in config.fallback_ops)
    if not any(_qualifies(n, reads_in_kernel) for n in gm.graph.nodes):
        return gm
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in [n for n in graph.nodes if _qualifies(n, reads_in_kernel)]:
        bias, x, w = node.args
        with graph.inserting_before(node):
            mm = graph.call_function(aten.mm.default, (x, w))
            add = graph.call_function(aten.add.Tensor, (mm, bias))
        mm.meta, add.meta = dict(node.meta), dict(node.meta)
        node.replace_all_uses_with(add)
        graph.erase_node(node)
    new = torch.fx.GraphModule(gm, graph)
    new.recompile()
    return new


def _qualifies(node, reads_in_kernel) -> bool:
    if node.op != "call_function" or node.target is not ADDMM or len(node.args) != 3 \
            or any(node.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")):
        return False
    val, bias = node.meta.get("val"), node.args[0].meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.float32 or not isinstance(bias, torch.Tensor) \
            or bias.dim() != 1 or bias.dtype != torch.float32 or bias.shape[0] != val.shape[1]:
        return False
    return _read_by_kernels(node, reads_in_kernel) and _slices(node) < 2


def _read_by_kernels(node, reads_in_kernel) -> bool:
    """Every consumer of `node` (behind views) is computed in a kernel, none is the output."""
    for user in node.users:
        if user.op != "call_function":
            return False
        if ops.op_name(user.target) in ops.VIEW_OPS:   # a re-index: its readers are the ones that count
            if not _read_by_kernels(user, reads_in_kernel):
                return False
        elif not reads_in_kernel(user.target):
            return False
    return True


def _slices(node) -> int:
    """How many slice/select views read `node`, directly or behind other views."""
    count = 0
    for user in node.users:
        if user.op == "call_function" and ops.op_name(user.target) in ops.VIEW_OPS:
            count += int(ops.op_name(user.target) in ("slice", "select")) + _slices(user)
    return count
