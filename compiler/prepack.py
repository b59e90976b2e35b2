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
  qualifies: an inference graph, the weight a graph input. A linear (`addmm`, `mm`) needs B to be
  the transpose of a contiguous [N, K] input (nn.Linear) or a contiguous [K, N] input itself
  (GPT-2's Conv1D), beta = alpha = 1 and a 1-d bias or none, and a
  LINEAR_PACKINGS row for its dtype, row count, weight shape and CPU vendor: float32 with a static
  row count packs for MKL (`linear`), except on AMD's CPUs where oneDNN is faster for wide outputs;
  a symbolic row count (a graph compiled once for every sequence length), bf16 and
  fp16 reorder for oneDNN (`dnn_linear`), whose packed weight serves every row count. A
  convolution needs float32, 2-d, not transposed, a channels_last input (what layout planning
  gives), a dense weight;
- `PackedWeights.take(specs)` (output_code.py's prologue: the op and arguments of each packed call,
  a MAKE_CALL row per method) and `PackedWeights.linear/dnn_linear/conv(slot, ...)` (the general
  path, where take has none) pack on first use and again
  whenever the weight is not the same tensor, storage or version as when packed (for a
  convolution also the input shape): every in-place write to the weight (an optimizer step,
  `load_state_dict`, `copy_` or `mul_` under no_grad) bumps its version. Writes through `w.data`
  are the one thing it cannot see, as autograd's own version checks cannot;
  `pack_weights=False` (TDBG_PACK_WEIGHTS=0, `tdbg bisect`'s `prepack` row) turns it off.

The packed copies live as long as the compiled graph: about one more copy of every packed weight,
plus MKL's fixed ~7.5 MiB each; a linear whose packed copy would exceed MAX_PACKED_RATIO times its
weight is decided at its first call to run on oneDNN's packed weight (about the weight's size)
where that pays (DNN_INSTEAD: 16 rows and 1 << 20 weight elements, or more rows and a smaller
weight), else plain (the graph's own addmm/mm).
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from .config import CPU_VENDORS
from .ir import InputBuffer, ReinterpretView, SymbolicUnsupported, hint, is_static
from .linear_gelu import LINEAR_POINTWISE
from .toolchain import cpu_vendor
from .torch_compat import tensor_version
from .weight_cache import PerTensors

aten = torch.ops.aten
MIN_ROWS = 8          # packed vs plain sgemm, [768, 768] weight: 0.04 vs 0.03 ms at 1-2 rows, 0.06 vs 0.07 at 8
MIN_WEIGHT = 1 << 14  # elements; smaller weights: packing saves too little to measure
# MKL's packed buffer carries about 7.5 MiB besides the weight (MKL 2.13's wheel: [64, 64] -> 7.56 MiB,
# [768, 768] 2.25 -> 11.06 MiB, [3072, 768] 9 -> 20.06 MiB): a linear whose packed copy would be larger
# than this many times its weight runs plain (tdbg memory: a 1 MiB BERT's compiled peak was 94 MiB).
MAX_PACKED_RATIO = 2.5
_PLAIN: set = set()   # (N, K, rows) of weights found too costly to pack, in this process
# (min rows, min weight elements) rows: a linear whose MKL copy is too large runs on oneDNN's packed
# weight (about the weight's size) instead of plain addmm when some row holds. Judged inside a model,
# not alone: a GEMM timed alone in a loop favours oneDNN ([1024, 256] at 128 rows 0.19 vs addmm
# 0.21 ms), but between other kernels it lost (0.26 vs 0.21 inside ELECTRA). 2 threads, 2026-11-27, six
# transformer blocks (hidden h, FFN 4h), oneDNN from 16 rows and 1 << 17 elements vs plain: 128 rows
# h=256 1.04-1.06x the time, h=384 1.02x, h=512 1.01x, h=768 0.99x; 32 rows h=256 1.07-1.09x,
# h=768 0.97-0.99x; 392 rows h=192 1.01-1.03x, h=384 0.97-1.00x. Many rows (no block measured):
# ConvNeXt's [384, 96] oneDNN/addmm 1.01 at 512 rows, 0.85 at 1024, 0.80 at 6272; [128, 128] 1.08
# at 1024, 0.91 from 2048.
DNN_INSTEAD = ((16, 1 << 20), (256, 1 << 18), (1024, 1 << 15), (2048, MIN_WEIGHT))


def rewrite(kernel, kind: str, config) -> Optional[tuple]:
    """(PackedWeights method, its arguments after the slot) when `kernel` runs on a packed
    weight, else None. Arguments are IR values (the weight an InputBuffer) or constants."""
    packer = PACKERS.get(kernel.target)
    if packer is None or kind != "inference" or not getattr(config, "pack_weights", True):
        return None
    return packer(kernel, config)


def _linear(a_at, b_at, bias_at):
    def pack(kernel, config):
        args = kernel.args
        a, b = args[a_at], args[b_at]
        bias = args[bias_at] if bias_at is not None else None
        if any(kernel.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")) or len(args) > 3 or len(a.size) != 2:
            return None
        weight, kn = _weight_input(b, a.dtype)
        n = weight.size[1 if kn else 0] if weight is not None else None
        if weight is None or not _vector(bias, n, a.dtype):
            return None
        k = weight.size[0 if kn else 1]
        row = _linear_packing(a.dtype, a.size[0], n, k, getattr(config, "cpu_vendor", None) or cpu_vendor())
        return None if row is None else (row[3], (a, weight, bias, kn))
    return pack


def _linear_packing(dtype, rows, n, k, cpu: str):
    """The LINEAR_PACKINGS row serving a linear of this dtype, row count and [N, K] weight on
    `cpu`'s vendor, or None."""
    static = is_static(rows)
    for row in LINEAR_PACKINGS:
        r_dtype, r_rows, cpus, _, available, when = row
        if r_dtype != dtype or r_rows != "any" and (r_rows == "static") != static or cpu not in cpus:
            continue
        # symbolic sizes are judged on their example's values (a heuristic; the kernel is generic)
        try:
            holds = when(hint(rows), hint(n), hint(k))
        except SymbolicUnsupported:
            return None
        if holds and available():
            return row
    return None


def _conv(kernel, _config):
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


def _weight_input(b, dtype):
    """(W, kn) when B is a graph input's weight: (W, False) for the view W.t() of a contiguous
    [N, K] input (nn.Linear), (W, True) for a contiguous [K, N] input itself (GPT-2's Conv1D);
    (None, False) otherwise."""
    if isinstance(b, InputBuffer):
        return (b, True) if b.dtype == dtype and len(b.size) == 2 and _contiguous(b.layout, b.size) else (None, False)
    if not isinstance(b, ReinterpretView) or not isinstance(b.buffer, InputBuffer):
        return None, False
    w = b.buffer
    if w.dtype != dtype or len(w.size) != 2 or not _contiguous(w.layout, w.size):
        return None, False
    n, k = w.size
    lay = b.layout
    if tuple(lay.size) != (k, n) or tuple(lay.stride) != (1, k) or lay.offset != 0:
        return None, False
    return w, False


def _contiguous(layout, size) -> bool:
    return tuple(layout.stride) == (size[1], 1) and getattr(layout, "offset", 0) == 0


def _vector(bias, n, dtype=torch.float32) -> bool:
    """No bias, or one of shape [n] and `dtype`."""
    return bias is None or (tuple(bias.size) == (n,) and bias.dtype == dtype)


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


def _dnn_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise") \
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def _dnn_bf16() -> bool:
    """oneDNN runs bf16 GEMMs natively (AVX512-BF16/AMX or AVX-512 emulation), as eager's addmm does."""
    return _dnn_linear_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _dnn_fp16() -> bool:
    return _dnn_linear_available() and torch.ops.mkldnn._is_mkldnn_fp16_supported()


def _at_least(min_weight: int, min_rows: int):
    return lambda rows, n, k: rows >= min_rows and n * k >= min_weight


WIDE_MAX_ROWS = 512


def _wide(rows: int, n: int, k: int) -> bool:
    """Where oneDNN's packed weight beats MKL's off Intel: a vocabulary-sized output, or outputs
    1.5 times as many as the inputs at up to WIDE_MAX_ROWS rows (measured below)."""
    return rows >= MIN_ROWS and (n >= 8192 or rows <= WIDE_MAX_ROWS and 2 * n >= 3 * k and n * k >= 1 << 17)


# Which packed GEMM serves an inference linear: (dtype, row count, CPU vendors (Config.cpu_vendor),
# PackedWeights method, available, when(rows, N, K)). The first row whose every column holds serves;
# none: plain addmm. MKL's packed weight serves one row count (repacked when it changes), oneDNN's
# any (packed with no batch size). Measured 2026-11-27, 2-core AVX-512/AMX Xeon, 2 threads, ms per
# call, plain addmm vs packed: float32 [3072, 768] at 77 rows 1.37 vs MKL 1.06 / oneDNN 1.11, but
# oneDNN's ~0.017 ms per call loses on small weights ([128, 128]: 0.006 vs 0.021) and below ~16
# rows; bf16 (eager's addmm is oneDNN reordering the weight every call, the same bits) [3072, 768]
# 0.35 vs 0.21 at 77 rows, 0.16 vs 0.09 at 1, [128, 128] 0.026 vs 0.020; fp16 loses at 1 row (0.16
# vs 0.20). On a 2-core AMD EPYC (Zen 3, AVX2), 2026-11-27, oneDNN / MKL packed: [N, K] at 128
# rows [30522, 768] 0.72, [50257, 768] 0.60, [32000, 512] 0.65, [30522, 128] 0.61, [30000, 128]
# 0.87; [2048, 512] 0.69, [1536, 512] 0.75, [768, 512] 0.77, [1024, 256] 0.88, [4096, 768] 0.91,
# [3072, 768] 0.96; at 32 rows [3072, 768] 0.60, at 256 0.78; [30522, 768] at 8 rows 0.45, at 394
# and 1024 0.83; but N <= K ([768, 3072] 0.97, [256, 1024] 1.08, [128, 512] 1.20) favours MKL. At 394
# rows one process gave [3072, 768] 1.06; on 2026-11-28, ten processes gave 0.77-1.10 (median 0.94)
# and oneDNN's times spread far less than MKL's; in ViT-base (394 rows) routing its [2304, 768] and
# [3072, 768] to oneDNN made the whole model 0.92x, 0.92x, 0.98x as long (one process each, both
# copies interleaved; ConvNeXt-tiny, Swin-tiny and MobileViT-small, routed alike both ways, spread
# 0.97-1.005x). At 512 rows it is even ([3072, 768] 1.02, 0.99; [2304, 768] 1.06, 1.07).
LINEAR_PACKINGS = (
    (torch.float32, "static", ("amd",), "dnn_linear", _dnn_linear_available, _wide),
    (torch.float32, "static", CPU_VENDORS, "linear", mkl_available, _at_least(MIN_WEIGHT, MIN_ROWS)),
    (torch.float32, "symbolic", CPU_VENDORS, "dnn_linear", _dnn_linear_available, _at_least(1 << 19, 16)),
    (torch.bfloat16, "any", CPU_VENDORS, "dnn_linear", _dnn_bf16, _at_least(MIN_WEIGHT, 1)),
    (torch.float16, "any", CPU_VENDORS, "dnn_linear", _dnn_fp16, _at_least(1 << 19, 4)),
)


def _linear_gelu(kernel, _config):
    """linear_gelu.py's fused call: its weight a contiguous [N, K] float32 graph input."""
    x, w, bias, attr, scalars, algorithm = kernel.args
    if _weight_input(w, torch.float32)[0] is not w or (attr, list(scalars), algorithm) != ("gelu", [], "none") \
            or not _vector(bias, w.size[0]):
        return None
    return "dnn_linear", (x, w, bias, False, "gelu")


PACKERS = {
    aten.addmm.default: _linear(1, 2, 0),
    aten.mm.default: _linear(0, 1, None),
    aten.convolution.default: _conv,
}
if LINEAR_POINTWISE is not None:
    PACKERS[LINEAR_POINTWISE.default] = _linear_gelu


def slot_key(method: str, args: tuple) -> tuple:
    """Calls that pack one graph input the same way share a slot, so one packed copy serves them:
    ALBERT's twelve layers reuse one set of weights, and each layer's own copy (twelve times its
    working set) would not stay in cache. The key holds what the packing depends on: the weight,
    its orientation, and the row count (MKL) or the input's shape and the geometry (convolution)."""
    shape = lambda x: tuple(str(s) for s in x.size)   # noqa: E731 (sizes may be symbolic)
    if method == "conv":
        x, w, _bias, *geometry = args
        return method, w.name, shape(x), repr(geometry)
    x, w, _bias, kn, *_attr = args   # oneDNN's post-op does not change the packing
    return (method, w.name, kn) + ((str(x.size[0]),) if method == "linear" else ())


def _mkl_pack(w: torch.Tensor, rows: int) -> Optional[torch.Tensor]:
    """`w` packed by MKL for `rows` rows, or None when the copy would exceed MAX_PACKED_RATIO
    times `w` (the shape is then remembered, so it is packed once per process)."""
    shape = (*w.shape, rows)
    if shape in _PLAIN:
        return None
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w.contiguous(), rows)
    if packed.numel() * packed.element_size() > MAX_PACKED_RATIO * w.nbytes:
        _PLAIN.add(shape)
        return None
    return packed


class PackedWeights:
    """One compiled graph's packed weights, a slot per packed weight (slot_key)."""

    def __init__(self):
        self.slots = {}
        self.made = {}    # (site, id(w)) -> (weak ref to w, (data_ptr, version), weak ref to bias or None, call)

    def take(self, specs) -> list:
        """This call's `(op, arguments after the input)` for each packed call `(site, slot, method,
        w, bias, extra, how)` (wrapper.py's prologue): the one made before while `w` is the
        tensor it was made for, with the same storage and version, and `bias` the same tensor;
        else made anew (`_made`). None where the call must take its method's own path (a GELU
        linear on an inference tensor). The steady state runs no Python function per call:
        wrapper.py's prologue says why."""
        out, made = [], self.made
        for site, slot, method, w, bias, extra, how in specs:
            entry = made.get((site, id(w)))
            if entry is not None and entry[0]() is w and not w.is_inference() \
                    and entry[1] == (w.data_ptr(), w._version) \
                    and (bias is None if entry[2] is None else entry[2]() is bias):
                out.append(entry[3])
            else:
                out.append(self._made(site, slot, method, w, bias, extra, how))
        return out

    def _made(self, site, slot, method, w, bias, extra, how):
        call = MAKE_CALL[method](self, slot, w, bias, extra, *how)
        if call is not None and not w.is_inference():
            key = (site, id(w))
            ref = weakref.ref(w, self._dropper(key))
            self.made[key] = (ref, (w.data_ptr(), w._version), None if bias is None else weakref.ref(bias), call)
        return call

    def _dropper(self, key):
        made = self.made

        def drop(ref):   # only the entry of this reference: the id may since name a newer tensor
            entry = made.get(key)
            if entry is not None and entry[0] is ref:
                del made[key]
        return drop

    def linear(self, slot: int, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor], kn: bool = False):
        """x @ W.t() + bias (W = w, or w.t() when `kn`: w stored [K, N]), with W packed for x's
        row count (repacked when `w` changed). When MKL's copy would exceed MAX_PACKED_RATIO:
        oneDNN's packed weight where a DNN_INSTEAD row holds, else plain addmm/mm (the graph's
        own op)."""
        op, args = _linear_call(self, slot, w, bias, x.shape[0], kn)
        return op(x, *args)

    def dnn_linear(self, slot: int, x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor],
                   kn: bool = False, attr: str = "none"):
        """x @ W.t() + bias (W as for `linear`) through oneDNN on W reordered once for every row
        count (a symbolic one included), then `attr` ("gelu": exact GELU, linear_gelu.py) as its
        post-op; in bf16/fp16 within one ulp of eager's addmm (the bits where eager's is oneDNN on
        the same layout)."""
        call = _dnn_call(self, slot, w, bias, (), kn, attr)
        if call is None:
            # an inference tensor would be reordered on every call: addmm and aten's GELU are cheaper
            return torch.nn.functional.gelu(torch.addmm(bias, x, w if kn else w.t()) if bias is not None
                                            else torch.mm(x, w if kn else w.t()))
        return call[0](x, *call[1])

    def conv(self, slot: int, x, w, bias, padding, stride, dilation, groups):
        """aten.convolution(x, w, bias, stride, padding, dilation, False, [0, 0], groups) through
        oneDNN on `w` reordered once into the blocked format it wants for x's shape."""
        op, args = _conv_call(self, slot, w, bias, tuple(x.shape), padding, stride, dilation, groups)
        return op(x, *args)

    # the packed weight of each method; `take` calls these where its steady state does not hold
    def _mkl(self, slot, w, rows, kn):
        wt = w.t() if kn else w
        return self._held(slot, w, rows, lambda: _mkl_pack(wt, rows))

    def _dnn(self, slot, w, extra, kn, attr):
        if attr == "gelu" and tensor_version(w) is None:
            return None
        return self._held(slot, w, extra, lambda: torch.ops.mkldnn._reorder_linear_weight(w.t() if kn else w, None))

    def _conv(self, slot, w, shape, padding, stride, dilation, groups):
        return self._held(slot, w, shape, lambda: torch.ops.mkldnn._reorder_convolution_weight(
            w, list(padding), list(stride), list(dilation), groups, list(shape)))

    def _held(self, slot, w: torch.Tensor, extra: tuple, make):
        """The slot's packed copy of `w`, made by `make()` for each weight tensor the slot meets
        (one graph serves every instance of a module class: weight_cache.py) and again when `w`
        was written in place (its version) or `extra` (what the packing depends on) changed."""
        cache = self.slots.get(slot)
        if cache is None:
            cache = self.slots[slot] = PerTensors()
        return cache.get((w,), extra, make)


def _conv_call(self, slot, w, bias, shape, padding, stride, dilation, groups):
    packed = self._conv(slot, w, shape, padding, stride, dilation, groups)
    return OPS["conv"], (packed, bias, list(padding), list(stride), list(dilation), groups, "none", [], "")


def _linear_call(self, slot, w, bias, rows, kn):
    # an alias, never `w` itself: the call is kept until `w` is freed, which holding `w` would prevent
    wt = w.t() if kn else w.detach()
    packed = self._mkl(slot, w, rows, kn)
    if packed is not None:
        return OPS["mkl"], (packed, wt, bias, rows)
    # an inference tensor (no version) would be reordered on every call: plain addmm is cheaper
    if any(rows >= r and wt.numel() >= n for r, n in DNN_INSTEAD) and tensor_version(w) is not None \
            and _dnn_linear_available():
        return _dnn_call(self, ("dnn", slot), w, bias, (), kn, "none")
    return torch.nn.functional.linear, (wt, bias)   # addmm(bias, x, wt.t()), or mm without a bias


def _dnn_call(self, slot, w, bias, extra, kn, attr):
    packed = self._dnn(slot, w, extra, kn, attr)
    if packed is None:
        return None
    return OPS["dnn"], (packed, bias, attr, [], "none" if attr == "gelu" else "")


# method -> the maker of its call for PackedWeights.take: (self, slot, w, bias, extra, *how) -> (op, arguments
# after the input) running what the method itself would, or None (the method's own path)
MAKE_CALL = {"conv": _conv_call, "linear": _linear_call, "dnn_linear": _dnn_call}


def _builtin(namespace: str, op: str):
    """The op's default overload as the builtin its Python __call__ forwards to (no frame)."""
    overload = getattr(getattr(getattr(torch.ops, namespace), op, None), "default", None)
    return getattr(overload, "_op", overload)


OPS = {"conv": _builtin("mkldnn", "_convolution_pointwise"), "mkl": _builtin("mkl", "_mkl_linear"),
       "dnn": _builtin("mkldnn", "_linear_pointwise")}


def take_spec(method: str, args: tuple) -> tuple:
    """(bias, extra, how) of a packed call for PackedWeights.take, from the method's IR arguments
    (after the slot): its bias, what its packed weight depends on besides the weight (as `_held`
    keys it) and what making the call needs."""
    if method == "conv":
        x, _w, bias, padding, stride, dilation, groups = args
        return bias, tuple(x.size), (tuple(padding), tuple(stride), tuple(dilation), groups)
    x, _w, bias, kn, *attr = args
    if method == "linear":
        return bias, x.size[0], (kn,)
    return bias, (), (kn, attr[0] if attr else "none")
