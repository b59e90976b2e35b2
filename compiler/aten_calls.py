"""Extern aten calls through torch's C++ Python bindings.

An OpOverload call (`aten.mm.default(a, b)`) parses its arguments against the schema in the
JIT's boxed path: ~3x the time of the same op's Python binding (`torch.mm(a, b)`, the C++
argument parser), 2-15 us per call by itself. The generated code still spells each call
`aten.<op>.<overload>(...)`, but `aten` there is the graph's own table (`op_table`): an
overload is bound to `torch.<op>` when that builtin can only run this overload for the call's
arguments (`python_binding`), and such a call passes every omitted argument at the schema's
default (`with_defaults`), else it is bound to the OpOverload itself.
"""
from __future__ import annotations

import sympy
import torch

from . import torch_compat
from .ir import IRNode, hint


def _arg_kind(x) -> str:
    if isinstance(x, IRNode):
        return "tensor"
    if isinstance(x, (list, tuple)):
        return "list"
    if x is None:
        return "none"
    if isinstance(x, (bool, int, float)):
        return "number"
    return "other"


def _may_bind(kind: str, schema_type: str) -> bool:
    """False only when torch's Python argument parser certainly refuses an argument of `kind` for
    a parameter of `schema_type` (str of the schema's JIT type); any doubt answers True."""
    if kind == "tensor":   # a 0-dim tensor parses as an int or a float (and maybe more), never a bool
        return schema_type not in ("bool", "Optional[bool]", "str", "Optional[str]")
    if kind == "list":
        return schema_type.startswith(("List[", "Optional[List["))
    if kind == "number":   # a number never parses as a list of tensors
        return not schema_type.startswith(("List[Tensor", "List[Optional[Tensor", "Optional[List[Tensor"))
    return True


def _binds(schema, kinds: list, keywords: dict) -> bool:
    """Whether a call with positional argument `kinds` and `keywords` (name -> kind) may parse
    against `schema` (always True when in doubt)."""
    params = list(schema.arguments)
    positional = [p for p in params if not p.kwarg_only]
    if len(kinds) > len(positional):
        return False
    by_name = {p.name: p for p in params}
    if any(k not in by_name for k in keywords):
        return False
    given = {p.name for p in positional[:len(kinds)]} | set(keywords)
    if any(p.name not in given and not p.has_default_value() for p in params):
        return False
    pairs = list(zip(kinds, positional)) + [(kind, by_name[k]) for k, kind in keywords.items()]
    return all(_may_bind(kind, str(p.type)) for kind, p in pairs)


_LITERALS = (type(None), bool, int, float, str)


def with_defaults(target, args, kwargs: dict):
    """(args, kwargs) of a call of aten overload `target` with every omitted argument (but `out`)
    given its schema default explicitly: positional ones in order while no positional one went
    by name, the others by name. None when a default is not a plain literal. A builtin's own
    defaults need not be the schema's: `torch.binary_cross_entropy_with_logits(x, t)` returns
    the unreduced loss, the overload's `reduction` defaults to the mean."""
    params = [p for p in target._schema.arguments if not p.is_out]
    args, kwargs = list(args), dict(kwargs)
    by_position = not any(p.name in kwargs for p in params if not p.kwarg_only)
    for p in params[len(args):]:
        if p.name in kwargs:
            continue
        if not p.has_default_value():
            return None
        value = p.default_value
        if not (isinstance(value, _LITERALS) or isinstance(value, (list, tuple))
                and all(isinstance(v, _LITERALS) for v in value)):
            return None
        if by_position and not p.kwarg_only:
            args.append(list(value) if isinstance(value, tuple) else value)
        else:
            kwargs[p.name] = list(value) if isinstance(value, tuple) else value
    return args, kwargs


def python_binding(target, args, kwargs: dict, out: bool = False):
    """The name `op` when `torch.op`, a C++ builtin, runs exactly `target` (an aten OpOverload)
    for a call with `args`/`kwargs` (IR values as tensors; `out` adds an `out=` tensor) and every
    omitted argument given explicitly (`with_defaults`, as the wrapper then calls it): no other
    overload of the op can parse those arguments, so the builtin's overload resolution has one
    candidate (torch's parser tries deprecated Python-only signatures last), and the builtin
    parses them. None otherwise (ops that mutate an input, calls without a tensor, no builtin,
    a default that is no plain literal, or any doubt)."""
    if not isinstance(target, torch_compat.OpOverload) or target.namespace != "aten":
        return None
    full = with_defaults(target, args, kwargs)
    if full is None:
        return None
    args, kwargs = full
    schema = target._schema
    if any(a.alias_info is not None and a.alias_info.is_write and not a.is_out for a in schema.arguments):
        return None
    # the check below runs the builtin on meta tensors: never a call without tensors (a factory
    # would run on the CPU)
    if not any(isinstance(x, IRNode) for x in torch_compat.pytree.tree_leaves((list(args), kwargs))):
        return None
    name = target.overloadpacket.__name__
    if type(getattr(torch, name, None)).__name__ != "builtin_function_or_method":
        return None
    kinds = [_arg_kind(a) for a in args]
    keywords = {k: _arg_kind(v) for k, v in kwargs.items()}
    if out:
        keywords["out"] = "tensor"
    if not _binds(schema, kinds, keywords):
        return None
    packet = target.overloadpacket
    others = [getattr(packet, o) for o in packet.overloads() if getattr(packet, o) is not target]
    if any(_binds(o._schema, kinds, keywords) for o in others):
        return None
    seeded = torch.Tag.nondeterministic_seeded in target.tags
    state = torch.get_rng_state() if seeded else None
    try:
        return name if _parses(getattr(torch, name), args, kwargs, out) else None
    finally:   # a random op's check leaves the generator as it found it (eager's stream stays)
        if seeded:
            torch.set_rng_state(state)


def _parses(fn, args, kwargs: dict, out: bool) -> bool:
    """Whether builtin `fn` accepts the call's arguments (meta tensors of the IR values' layouts):
    a builtin may not expose every overload of its op (method-only variants), and its argument
    parser says so with a TypeError. Any other error (no meta kernel, ...) comes after parsing."""
    def meta(x):
        if isinstance(x, IRNode):
            lay = getattr(x, "layout", None)
            if lay is None:
                raise LookupError
            # symbolic sizes: their hints (parsing depends on types, not values)
            return torch.empty_strided(tuple(map(hint, lay.size)), tuple(map(hint, lay.stride)), dtype=lay.dtype,
                                       device="meta")
        if isinstance(x, sympy.Expr):
            return hint(x)
        if isinstance(x, (list, tuple)):
            return type(x)(meta(v) for v in x)
        return x
    try:
        margs, mkwargs = meta(tuple(args)), {k: meta(v) for k, v in kwargs.items()}
        if out:
            mkwargs["out"] = torch.empty(0, device="meta")
    except LookupError:
        return False
    try:
        fn(*margs, **mkwargs)
    except TypeError:
        return False
    except Exception:   # parsed; the meta call itself failed (no meta kernel, data-dependent shape)
        return True
    return True


def op_table(namespace: str, calls: dict):
    """`namespace` ("aten") as output_code.py calls it: an object whose `<op>.<overload>`
    attribute is `torch.<binding>` for each `calls` entry {"op.overload": binding name or None}
    with a binding, else the OpOverload's builtin. Plain attributes: one dict lookup each per call."""
    from types import SimpleNamespace
    table = SimpleNamespace()
    ops = getattr(torch.ops, namespace)
    for qualified, binding in calls.items():
        op, overload = qualified.split(".")
        if not hasattr(table, op):
            setattr(table, op, SimpleNamespace())
        fn = getattr(torch, binding) if binding else getattr(getattr(ops, op), overload)
        # an OpOverload's builtin: its Python __call__ only forwards to it, at a frame a call
        # (wrapper.py's prologue says why the graph's calls keep off Python frames)
        setattr(getattr(table, op), overload, getattr(fn, "_op", fn))
    return table
