"""THE op table: one row per pointwise aten op tdbg lowers to C++.

Each `OpRow` says how the op is lowered (`kind`), how its scalar result is spelled in C++
(a format string over the operand expressions `{0}`, `{1}`, ..., or a dict keyed by operand
dtype class "bool" / "int" / "float" with "default"), which PyTorch type-promotion rule picks
the compute and result dtypes (`promotion`, an ELEMENTWISE_TYPE_PROMOTION_KIND name), and a slot
for the vectorized spelling (`vec`, filled by the vectorization work). `accuracy_bug` is the
wrong spelling `inject_bug=(op, "accuracy")` uses; rows without one get a generic wrong result.

Lowerings of non-pointwise ops (views, reductions, cat, ...) live in lowering.py (random ops in
lowering_random.py); ops handled there are listed in OTHER_LOWERINGS for documentation and tests.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from .torch_compat import ELEMENTWISE_TYPE_PROMOTION_KIND as PROMO

aten = torch.ops.aten

CPP_TYPES = {
    torch.bool: "bool", torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t",
    torch.int32: "int32_t", torch.int64: "int64_t", torch.float32: "float", torch.float64: "double",
}
# bf16 / fp16: values inside a kernel are float (eager's CPU kernels compute these dtypes in float
# too); memory holds the 16 bits as uint16_t, converted by the prelude's helpers on load and
# rounded to nearest even on store and on a cast to the dtype (docs/compiler.md "bf16 and fp16").
CPP_TYPES.update({torch.bfloat16: "float", torch.float16: "float"})
# {dtype: (load: bits -> float, store: float -> bits rounded)} (cpp_prelude.h)
LOWP_CONVERT = {
    torch.bfloat16: ("tdbg_bf16_to_float", "tdbg_float_to_bf16"),
    torch.float16: ("tdbg_f16_to_float", "tdbg_float_to_f16"),
}
STORAGE_TYPES = {**CPP_TYPES, **{d: "uint16_t" for d in LOWP_CONVERT}}
SUPPORTED_DTYPES = frozenset(CPP_TYPES)


def storage_type(dtype: torch.dtype) -> str:
    """The C++ element type of a kernel pointer to a `dtype` buffer."""
    return STORAGE_TYPES[dtype]


def dtype_class(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    return "float" if dtype.is_floating_point else "int"


@dataclass(frozen=True)
class OpRow:
    name: str                       # the handler method: ops.<name>(...)
    aten: tuple                     # aten overload packets lowered by this row
    cpp: Union[str, dict]           # scalar spelling
    promotion: str = "DEFAULT"      # ELEMENTWISE_TYPE_PROMOTION_KIND member name
    nargs: int = 1
    kind: str = "pointwise"
    vec: Optional[str] = None       # vector spelling (later issue)
    accuracy_bug: Optional[str] = None
    int_ok: bool = True             # eager accepts integer operands
    bool_ok: bool = True            # eager accepts bool operands
    float_ok: bool = True
    domain: str = "any"             # test inputs: "any" | "positive" | "unit" (-1..1) | "small"

    def spelling(self, dtype: torch.dtype) -> str:
        if isinstance(self.cpp, str):
            return self.cpp
        return self.cpp.get(dtype_class(dtype), self.cpp["default"])

    def result_dtype(self, compute: torch.dtype) -> torch.dtype:
        return torch.bool if self.promotion == "ALWAYS_BOOL" else compute

    @property
    def promotion_kind(self):
        return getattr(PROMO, self.promotion)


def _u(name, cpp, promotion="INT_TO_FLOAT", **kw):
    return OpRow(name, (getattr(aten, name),), cpp, promotion, 1, **kw)


def _b(name, cpp, promotion="DEFAULT", **kw):
    return OpRow(name, (getattr(aten, name),), cpp, promotion, 2, **kw)


_FLOAT_ONLY = dict(int_ok=True, bool_ok=True)
_INT_ONLY = dict(float_ok=False)

ROWS = [
    # unary, result dtype = input dtype
    _u("neg", "decltype({0})(-{0})", "DEFAULT", accuracy_bug="decltype({0})(-2*{0})", bool_ok=False),
    _u("abs", "tdbg_abs({0})", "COMPLEX_TO_FLOAT"),
    _u("relu", "tdbg_relu({0})", "DEFAULT", bool_ok=False),
    _u("sign", "tdbg_sign({0})", "DEFAULT"),
    _u("floor", "tdbg_floor({0})", "DEFAULT"),
    _u("ceil", "tdbg_ceil({0})", "DEFAULT"),
    _u("trunc", "tdbg_trunc({0})", "DEFAULT"),
    _u("round", "tdbg_round({0})", "DEFAULT"),
    _u("frac", "tdbg_frac({0})", "DEFAULT", int_ok=False, bool_ok=False),
    _u("bitwise_not", {"bool": "!{0}", "default": "decltype({0})(~{0})"}, "DEFAULT", **_INT_ONLY),
    _u("logical_not", "!{0}", "ALWAYS_BOOL"),
    _u("isnan", "tdbg_isnan({0})", "ALWAYS_BOOL"),
    _u("isinf", "tdbg_isinf({0})", "ALWAYS_BOOL"),
    _u("signbit", "tdbg_signbit({0})", "ALWAYS_BOOL"),
    # unary, integer -> float
    _u("exp", "tdbg_exp({0})"),
    _u("exp2", "tdbg_exp2({0})"),
    _u("expm1", "tdbg_expm1({0})"),
    _u("log", "tdbg_log({0})", domain="positive"),
    _u("log2", "tdbg_log2({0})", domain="positive"),
    _u("log10", "tdbg_log10({0})", domain="positive"),
    _u("log1p", "tdbg_log1p({0})", domain="positive"),
    _u("sqrt", "tdbg_sqrt({0})", domain="positive"),
    _u("rsqrt", "tdbg_rsqrt({0})", domain="positive"),
    _u("reciprocal", "tdbg_reciprocal({0})"),
    _u("sin", "tdbg_sin({0})"),
    _u("cos", "tdbg_cos({0})"),
    _u("tan", "tdbg_tan({0})"),
    _u("asin", "tdbg_asin({0})", domain="unit"),
    _u("acos", "tdbg_acos({0})", domain="unit"),
    _u("atan", "tdbg_atan({0})"),
    _u("sinh", "tdbg_sinh({0})"),
    _u("cosh", "tdbg_cosh({0})"),
    _u("tanh", "tdbg_tanh({0})"),
    _u("asinh", "tdbg_asinh({0})"),
    _u("acosh", "tdbg_acosh({0})", domain="positive"),
    _u("atanh", "tdbg_atanh({0})", domain="unit"),
    _u("erf", "tdbg_erf({0})"),
    _u("erfc", "tdbg_erfc({0})"),
    _u("lgamma", "tdbg_lgamma({0})", domain="positive"),
    _u("sigmoid", "tdbg_sigmoid({0})"),
    # binary arithmetic
    _b("add", {"bool": "{0} || {1}", "default": "{0} + {1}"}),
    _b("sub", "{0} - {1}", bool_ok=False),
    _b("mul", {"bool": "{0} && {1}", "default": "{0} * {1}"}),
    _b("div", "{0} / {1}", "INT_TO_FLOAT"),
    _b("floor_divide", "tdbg_floordiv({0}, {1})", bool_ok=False, domain="nonzero"),
    _b("remainder", "tdbg_remainder({0}, {1})", bool_ok=False, domain="nonzero"),
    _b("fmod", "tdbg_fmod({0}, {1})", bool_ok=False, domain="nonzero"),
    _b("pow", "tdbg_pow({0}, {1})", "BOOL_TO_LONG", domain="small"),
    _b("maximum", "tdbg_maximum({0}, {1})"),
    _b("minimum", "tdbg_minimum({0}, {1})"),
    _b("fmax", "tdbg_fmax({0}, {1})", int_ok=False, bool_ok=False),
    _b("fmin", "tdbg_fmin({0}, {1})", int_ok=False, bool_ok=False),
    _b("atan2", "tdbg_atan2({0}, {1})", "INT_TO_FLOAT"),
    _b("hypot", "tdbg_hypot({0}, {1})", "DEFAULT", int_ok=False, bool_ok=False),
    _b("copysign", "tdbg_copysign({0}, {1})", "INT_TO_FLOAT"),
    # comparisons and logic
    _b("eq", "{0} == {1}", "ALWAYS_BOOL"),
    _b("ne", "{0} != {1}", "ALWAYS_BOOL"),
    _b("lt", "{0} < {1}", "ALWAYS_BOOL"),
    _b("le", "{0} <= {1}", "ALWAYS_BOOL"),
    _b("gt", "{0} > {1}", "ALWAYS_BOOL"),
    _b("ge", "{0} >= {1}", "ALWAYS_BOOL"),
    _b("logical_and", "static_cast<bool>({0}) && static_cast<bool>({1})", "ALWAYS_BOOL"),
    _b("logical_or", "static_cast<bool>({0}) || static_cast<bool>({1})", "ALWAYS_BOOL"),
    _b("logical_xor", "static_cast<bool>({0}) != static_cast<bool>({1})", "ALWAYS_BOOL"),
    _b("bitwise_and", {"bool": "{0} && {1}", "default": "{0} & {1}"}, **_INT_ONLY),
    _b("bitwise_or", {"bool": "{0} || {1}", "default": "{0} | {1}"}, **_INT_ONLY),
    _b("bitwise_xor", {"bool": "{0} != {1}", "default": "{0} ^ {1}"}, **_INT_ONLY),
    _b("bitwise_left_shift", "tdbg_shl({0}, {1})", float_ok=False, bool_ok=False, domain="small"),
    _b("bitwise_right_shift", "tdbg_shr({0}, {1})", float_ok=False, bool_ok=False, domain="small"),
    # ternary
    OpRow("where", (aten.where,), "{0} ? {1} : {2}", "NO_OPMATH", 3, kind="special"),
]

# Handler-level helpers lowerings compose with (not aten ops; no promotion of their own).
HELPER_SPELLINGS = {
    "truncdiv": "tdbg_truncdiv({0}, {1})",
    "floordiv": "tdbg_floordiv({0}, {1})",
}

TABLE = {row.name: row for row in ROWS}
POINTWISE = [row for row in ROWS if row.kind == "pointwise"]

# Everything else tdbg lowers itself (see lowering.py): views, reductions, data movement.
OTHER_LOWERINGS = {
    "view": ("view", "reshape", "_unsafe_view", "permute", "transpose", "t", "expand", "slice",
             "select", "squeeze", "unsqueeze", "as_strided", "alias", "clone"),
    "reduction": ("sum", "mean", "prod", "amax", "amin", "argmax", "argmin", "max", "min",
                  "var", "any", "all"),
    "special": ("cat", "constant_pad_nd", "embedding", "gather", "index_select", "where",
                "full", "full_like", "scalar_tensor", "arange", "iota", "convert_element_type", "_to_copy",
                "clamp", "clamp_min", "clamp_max", "copy", "rsub", "div.Tensor_mode"),
    # lowering_random.py: values from an in-kernel Philox stream (config.fallback_random: aten)
    "random": ("rand", "rand_like", "randn", "randn_like", "uniform", "bernoulli", "native_dropout",
               "native_dropout_backward"),
    # lowering_index/shape/scan/math/pool.py (OpInfo coverage, issue 23)
    "indexing and shape": ("index.Tensor", "empty", "empty_permuted", "empty_strided", "rev", "diagonal",
                           "unsafe_split", "unsafe_split_with_sizes"),
    "scan, pooling, parameterized pointwise": ("cumsum", "cumprod", "cummax", "cummin", "avg_pool2d",
                                               "round.decimals"),
}

# ops that only re-index their input (no copy, no arithmetic): graph passes look through them
VIEW_OPS = frozenset(OTHER_LOWERINGS["view"]) - {"clone"}


def op_name(target) -> str:
    """aten.neg.default -> 'neg'; prims.convert_element_type.default -> 'convert_element_type'."""
    packet = getattr(target, "overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(target, "__name__", str(target))


def op_matches(spec: str, target) -> bool:
    """Does a user-given op name ("neg", "aten.neg", "aten.neg.default") name `target`?"""
    full = str(target)
    name = op_name(target)
    return spec in (name, full, f"aten.{name}") or full.startswith(spec + ".") and spec.count(".") >= 1
