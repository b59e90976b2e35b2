"""Weight prepacking: inference GEMMs and convolutions by a graph input's weight run on a packed copy.

MKL's sgemm repacks its B operand on every call, and oneDNN reorders a convolution's weight into
its blocked format on every call: a pass over the whole weight each time (BERT's 94 MB vocabulary
projection at 128 tokens, 2 threads: addmm 30.6 ms, on a packed weight 22.6 ms; ResNet-50's
convolutions at batch 2: 81 -> 61 ms). `_mkl_linear` on a weight packed once by
`_mkl_reorder_linear_weight` gives the same bits as `addmm` (the same MKL kernel), and
`mkldnn._convolution_pointwise` on a weight reordered once the same as `aten.convolution`.
Inductor does this only under `freezing`, where weights become constants; tdbg keeps them graph
inputs and packs at run time:

- `rewrite(kernel, kind, config)` (a PACKERS row per aten target) says whether an extern call
  qualifies: an inference graph, float32, the weight a graph input. A linear (`addmm`, `mm`)
  needs B to be the transpose of a contiguous [N, K] input, at least MIN_ROWS rows (below that
  packing measured no faster), beta = alpha = 1 and a 1-d bias or none; a convolution needs 2-d,
  not transposed, a channels_last input (what layout planning gives), a dense weight;
- `PackedWeights.linear/conv(slot, ...)` (called by output_code.py) packs on first use and again
  whenever the weight is not the same tensor, storage or version as when packed (for a
  convolution also the input shape): every in-place write to the weight (an optimizer step,
  `load_state_dict`, `copy_` or `mul_` under no_grad) bumps its version. Writes through `w.data`
  are the one thing it cannot see, as autograd's own version checks cannot;
  `pack_weights=False` (TDBG_PACK_WEIGHTS=0, `tdbg bisect`'s `prepack` row) turns it off.

The packed copies live as long as the compiled graph: about one more copy of every packed weight,
plus MKL's fixed ~7.5 MiB each; a linear whose packed copy would exceed MAX_PACKED_RATIO times its
weight is decided at its first call to run plain (the graph's own addmm/mm).
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from .ir import InputBuffer, ReinterpretView, is_static

aten = torch.ops.aten
MIN_ROWS = 8          # packed vs plain sgemm, [768, 768] weight: 0.04 vs 0.03 ms at 1-2 rows, 0.06 vs 0.07 at 8
MIN_WEIGHT = 1 << 14  # elements; smaller weights: packing saves too little to measure
# MKL's packed buffer carries about 7.5 MiB besides the weight (MKL 2.13's wheel: [64, 64] -> 7.56 MiB,
# [768, 768] 2.25 -> 11.06 MiB, [3072, 768] 9 -> 20.06 MiB): a linear whose packed copy would be larger
# than this many times its weight runs plain (tdbg memory: a 1 MiB BERT's compiled peak was 94 MiB).
MAX_PACKED_RATIO = 2.5
_PLAIN: set = set()   # (N, K, rows) of weights found too costly to pack, in this process
# A packed weight serves one row count (PackedWeights repacks when it changes): a symbolic row
# count (a graph compiled once for every sequence length) would repack at every new length, so
# such linears stay plain addmm/mm.


def rewrite(kernel, kind: str, config) -> Optional[tuple]:
    """(PackedWeights method, its arguments after the slot) when `kernel` runs on a packed
    weight, else None. Arguments are IR values (the weight an InputBuffer) or constants."""
    packer = PACKERS.get(kernel.target)
    if packer is None or kind != "inference" or not getattr(config, "pack_weights", True):
        return None
    return packer(kernel)


def _linear(a_at, b_at, bias_at):
    def pack(kernel):
        if not mkl_available():
            return None
        args = kernel.args
        a, b = args[a_at], args[b_at]
        bias = args[bias_at] if bias_at is not None else None
        if any(kernel.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")) or len(args) > 3:
            return None
        weight = _transposed_input(b)
        if weight is None or a.dtype != torch.float32 or len(a.size) != 2 or not is_static(a.size[0]) \
                or a.size[0] < MIN_ROWS:
            return None
        n, k = weight.size
        if n * k < MIN_WEIGHT or not _vector(bias, n):
            return None
        return "linear", (a, weight, bias)
    return pack


def _conv(kernel):
    """A 2-d, non-transposed float32 convolution of a channels_last input by a graph input."""
    if not mkldnn_available():
        return None
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = kernel.args
    if transposed or any(output_padding) or not isinstance(w, InputBuffer) or len(w.size) != 4:
        return None
    if w.dtype != torch.float32 or x.dtype != torch.float32 or len(x.size) != 4 or not _nhwc(x) \
            or not all(is_static(s) for s in x.size):   # reordered per input shape, as linears per row count
        return None
    if not _dense(w) or not _vector(bias, w.size[0]):
        return None
    return "conv", (x, w, bias, list(padding), list(stride), list(dilation), groups)


def _transposed_input(b):
    """The graph input W ([N, K], contiguous) when `b` is the view W.t(), else None."""
    if not isinstance(b, ReinterpretView) or not isinstance(b.buffer, InputBuffer):
        return None
    w = b.buffer
    if w.dtype != torch.float32 or len(w.size) != 2 or tuple(w.layout.stride) != (w.size[1], 1):
        return None
    n, k = w.size
    lay = b.layout
    if tuple(lay.size) != (k, n) or tuple(lay.stride) != (1, k) or lay.offset != 0:
        return None
    return w


def _vector(bias, n) -> bool:
    """No bias, or a float32 one of shape [n]."""
    return bias is None or (tuple(bias.size) == (n,) and bias.dtype == torch.float32)


def _nhwc(x) -> bool:
    n, c, h, w = x.size
    return tuple(x.layout.stride) == (h * w * c, 1, w * c, c) and getattr(x.layout, "offset", 0) == 0


def _dense(w) -> bool:
    o, i, kh, kw = w.size
    return tuple(w.layout.stride) in ((i * kh * kw, kh * kw, kw, 1), (i * kh * kw, 1, kw * i, i))


def mkl_available() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def mkldnn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


PACKERS = {
    aten.addmm.default: _linear(1, 2, 0),
    aten.mm.default: _linear(0, 1, None),
    aten.convolution.default: _conv,
}


class PackedWeights:
    """One compiled graph's packed weights, a slot per packed call."""

    def __init__(self):
        self.slots = {}

    def linear(self, slot: int, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor]):
        """x @ w.t() + bias, with `w` packed for x's row count (repacked when `w` changed); plain
        addmm/mm (the graph's own op) when the packed copy would exceed MAX_PACKED_RATIO."""
        rows = x.shape[0]
        held = self.slots.get(slot)
        if held is None or held[0]() is not w or held[1] != (w.data_ptr(), w._version, rows):
            shape = (*w.shape, rows)
            packed = None if shape in _PLAIN else torch.ops.mkl._mkl_reorder_linear_weight(w, rows)
            if packed is not None and packed.numel() * packed.element_size() > MAX_PACKED_RATIO * w.nbytes:
                packed = None   # dropped now; the shape is remembered, so it is packed once per process
                _PLAIN.add(shape)
            held = (weakref.ref(w), (w.data_ptr(), w._version, rows), packed)
            self.slots[slot] = held
        if held[2] is None:
            return torch.mm(x, w.t()) if bias is None else torch.addmm(bias, x, w.t())
        return torch.ops.mkl._mkl_linear(x, held[2], w, bias, rows)

    def conv(self, slot: int, x, w, bias, padding, stride, dilation, groups):
        """aten.convolution(x, w, bias, stride, padding, dilation, False, [0, 0], groups) through
        oneDNN on `w` reordered once into the blocked format it wants for x's shape."""
        held = self.slots.get(slot)
        key = (w.data_ptr(), w._version, tuple(x.shape))
        if held is None or held[0]() is not w or held[1] != key:
            packed = torch.ops.mkldnn._reorder_convolution_weight(w, padding, stride, dilation, groups, list(x.shape))
            held = (weakref.ref(w), key, packed)
            self.slots[slot] = held
        return torch.ops.mkldnn._convolution_pointwise(x, held[2], bias, padding, stride, dilation, groups,
                                                       "none", [], "")
