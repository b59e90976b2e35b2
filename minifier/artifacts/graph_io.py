"""Graphs and their inputs as data: readable source, content-hashed tensors, load/save.

A `Case` is what the minifier shrinks: an FX GraphModule whose placeholders are, in order, the
`inputs` (InputSpec rows). Tensor values live in a `TensorStore` keyed by `InputSpec.key`: the
SHA-256 of their raw bytes (computed here with hashlib, never by the compiler under test) with the
dtype, shape and strides those bytes are read as, since equal bytes are not equal inputs (float32
and int32 zeros(4) share them). On disk each is `inputs/<sha256>.bin` holding exactly those bytes,
so `sha256sum` verifies it; inputs with equal bytes share the file.

The graph travels as Python source (`module_source`): a `class Repro(torch.nn.Module)` whose
`forward` is FX's own code for the graph, and one class per higher-order op body (`torch.cond`
branches, checkpointed regions), set as attributes in `Repro.__init__`. `trace_source` turns that
text back into the same graph by READING it (repro_templates/runtime.py `trace_repro`, which
repro.py carries too): one statement, one node, the same targets. Nothing is executed, so graphs
no tracer can re-run come back whole: functorch transforms (`_add_batch_dim` on a tensor that
only exists at run time), writes into views (`x[0] = y`, `y += 1`), factory calls without tensor
arguments (no folding into constants), higher-order ops.
"""
from __future__ import annotations

import ctypes
import hashlib
import itertools
import linecache
import os
import types
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch
import torch.fx as fx

from tdbg.repro_templates.runtime import GraphSourceError, trace_repro

INPUTS_DIR = "inputs"


@dataclass(frozen=True)
class InputSpec:
    """One graph input: a tensor (by content hash and metadata) or a plain Python value."""
    name: str
    sha: str = ""
    shape: tuple = ()
    stride: tuple = ()
    dtype: str = ""
    requires_grad: bool = False
    value: Any = None          # non-tensor inputs (ints, floats, bools)
    # the symbols its sizes had in the failing graph (`symbolic_dims`): per tensor dim the
    # size's expression as text or None (static); for an int input, a 1-tuple; () all static
    dynamic: tuple = ()

    @property
    def is_tensor(self) -> bool:
        return bool(self.dtype)

    @property
    def key(self) -> str:
        """The TensorStore key: the bytes' SHA-256 and the dtype, shape and strides they are read as."""
        return f"{self.sha}|{self.dtype}|{tuple(self.shape)}|{tuple(self.stride)}"

    def describe(self) -> str:
        if not self.is_tensor:
            return f"{self.name}={self.value!r}"
        return f"{self.name}: {self.dtype.replace('torch.', '')}{list(self.shape)}"


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().cpu()
    n = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), n) if n else b""


def tensor_sha256(t: torch.Tensor) -> str:
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def tensor_from_bytes(data: bytes, spec: InputSpec) -> torch.Tensor:
    dtype = dtype_from_str(spec.dtype)
    flat = (torch.frombuffer(bytearray(data), dtype=dtype).clone() if data
            else torch.empty(0, dtype=dtype))
    from tdbg.repro_templates.runtime import with_strides
    t = with_strides(flat.reshape(spec.shape), spec.stride)
    return t.requires_grad_(spec.requires_grad) if spec.requires_grad else t


def dtype_from_str(name: str) -> torch.dtype:
    dtype = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


class TensorStore:
    """InputSpec.key -> tensor, the values behind InputSpecs. Stored tensors are detached,
    contiguous copies of the spec's dtype and shape (`value` gives them the spec's strides)."""

    def __init__(self):
        self.tensors: dict = {}

    def spec(self, name: str, value: Any) -> InputSpec:
        if not isinstance(value, torch.Tensor):
            return InputSpec(name, value=value)
        t = value.detach().contiguous()
        spec = InputSpec(name, tensor_sha256(t), tuple(t.shape), tuple(value.stride()), str(t.dtype),
                         bool(value.requires_grad and value.is_leaf))
        self.tensors.setdefault(spec.key, t)
        return spec

    def value(self, spec: InputSpec, clone: bool = True) -> Any:
        if not spec.is_tensor:
            return spec.value
        t = self.tensors[spec.key]
        if tuple(t.stride()) != tuple(spec.stride) and t.numel() > 0:
            t = torch.empty_strided(spec.shape, spec.stride, dtype=t.dtype).copy_(t)
        elif clone:
            t = t.clone()
        return t.requires_grad_(True) if spec.requires_grad and t.is_floating_point() else t

    def values(self, specs, clone: bool = True) -> list:
        return [self.value(s, clone) for s in specs]

    def save(self, specs, directory: str) -> None:
        """Write inputs/<sha>.bin for each tensor spec (existing identical files are kept)."""
        folder = os.path.join(directory, INPUTS_DIR)
        os.makedirs(folder, exist_ok=True)
        for s in specs:
            path = os.path.join(folder, f"{s.sha}.bin")
            if s.is_tensor and not os.path.exists(path):
                tmp = f"{path}.tmp{os.getpid()}"
                with open(tmp, "wb") as f:
                    f.write(tensor_bytes(self.tensors[s.key]))
                os.replace(tmp, path)

    def load(self, specs, directory: str) -> None:
        for s in specs:
            if s.is_tensor and s.key not in self.tensors:
                with open(os.path.join(directory, INPUTS_DIR, f"{s.sha}.bin"), "rb") as f:
                    data = f.read()
                if hashlib.sha256(data).hexdigest() != s.sha:
                    raise ValueError(f"input file {s.sha}.bin does not match its SHA-256 name")
                self.tensors[s.key] = tensor_from_bytes(data, replace(s, stride=(), requires_grad=False))


@dataclass
class Case:
    """A graph and its inputs (placeholders in order). `key` identifies it for verdict caching."""
    gm: fx.GraphModule
    inputs: tuple
    # the graph's tensor constants (its get_attr nodes, each a flat attribute of `gm` named by
    # InputSpec.name; the values are in the TensorStore): inline, as the failing graph had them
    constants: tuple = ()
    _key: Optional[str] = field(default=None, repr=False)

    @property
    def key(self) -> str:
        if self._key is None:
            rows = [f"{s.sha}|{s.shape}|{s.stride}|{s.dtype}|{s.requires_grad}|{s.value!r}|{s.dynamic}"
                    for s in self.inputs]
            rows += [f"constant {s.name}|{s.sha}|{s.shape}|{s.stride}|{s.dtype}" for s in self.constants]
            text = module_source(self.gm.graph) + "\n" + "\n".join(rows)
            self._key = hashlib.sha256(text.encode()).hexdigest()
        return self._key

    @property
    def num_nodes(self) -> int:
        return len(self.gm.graph.nodes)

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def compute_nodes(self) -> list:
        return [n for n in self.gm.graph.nodes if n.op not in ("placeholder", "output")]

    def derive(self, graph: fx.Graph, inputs: tuple) -> "Case":
        """A Case of an edited copy of this graph: its constants are the ones `graph` still reads."""
        used = {n.target for n in graph.nodes if n.op == "get_attr"}
        return Case(make_gm(graph, self.gm), tuple(inputs), tuple(c for c in self.constants if c.name in used))


def symbolic_dims(value) -> tuple:
    """The symbols of a traced value's sizes (a placeholder's fake value): for a tensor one entry
    per dim, the size's sympy expression as text where it has free symbols, else None; for a
    SymInt a 1-tuple; () when nothing is symbolic. Read from the expressions, never by comparing
    sizes (that would add guards to the ShapeEnv of a graph still being compiled)."""
    def text(size):
        expr = size.node.expr if isinstance(size, torch.SymInt) else None
        return str(expr) if expr is not None and expr.free_symbols else None
    if isinstance(value, torch.SymInt):
        return (text(value),) if text(value) else ()
    if isinstance(value, torch.Tensor):
        dims = tuple(text(size) for size in value.shape)
        return dims if any(dims) else ()
    return ()


def dynamic_table(specs) -> dict:
    """{input name: its dynamic tuple} for the inputs that have symbolic sizes: the spec's
    "dynamic" (runtime.py) and repro.py's DYNAMIC."""
    return {s.name: tuple(s.dynamic) for s in specs if s.dynamic}


def symbolic_text(specs) -> str:
    """The dynamic inputs in one line, each size as `symbol=size`: "x: float32[s77=100, 8], s77=100"
    ("" when none is dynamic)."""
    parts = []
    for s in specs:
        if not s.dynamic:
            continue
        if s.is_tensor:
            dims = ", ".join(f"{sym}={d}" if sym else str(d) for d, sym in zip(s.shape, s.dynamic))
            parts.append(f"{s.name}: {s.dtype.replace('torch.', '')}[{dims}]")
        else:
            symbol = f"{s.dynamic[0]}={s.value!r}"
            parts.append(symbol if s.name == s.dynamic[0] else f"{s.name}: {symbol}")
    return ", ".join(parts)


def symbol_sizes(inputs) -> dict:
    """{plain symbol: its size now} over the dynamic inputs (tensor dims and int inputs)."""
    sizes = {}
    for s in inputs:
        for size, symbol in zip(s.shape if s.is_tensor else (s.value,), s.dynamic):
            if symbol and symbol.isidentifier() and isinstance(size, int):
                sizes.setdefault(symbol, size)
    return sizes


def size_of(text: str, sizes: dict) -> Optional[int]:
    """The value of a recorded size expression (`s21*s77`) at `sizes` ({symbol: int}); None when
    it names a symbol without a size or is not an integer expression."""
    import re

    import sympy
    names = set(re.findall(r"[A-Za-z_]\w*", text))
    if not names <= set(sizes):
        return None
    try:
        value = sympy.sympify(text, locals={n: sympy.Integer(sizes[n]) for n in names})
    except (sympy.SympifyError, TypeError, SyntaxError):
        return None
    return int(value) if getattr(value, "is_Integer", False) else None


def duck_dims(spec: InputSpec, inputs) -> InputSpec:
    """`spec` (a value the minifier turned into an input) with the symbols of its sizes, taken
    from the dynamic `inputs` by size as Dynamo's duck sizing does: a dim whose size is the
    current size of a symbol (a plain one, of size > 1) gets it. A spec that has its own, or a
    graph without symbols, is returned unchanged."""
    sizes: dict = {}   # size -> the first symbol of that size
    for symbol, size in symbol_sizes(inputs).items():
        if size > 1:
            sizes.setdefault(size, symbol)
    if spec.dynamic or not sizes:
        return spec
    if spec.is_tensor:
        dims = tuple(sizes.get(d) for d in spec.shape)
    else:
        dims = (sizes.get(spec.value),) if isinstance(spec.value, int) and not isinstance(spec.value, bool) else ()
    return replace(spec, dynamic=dims if any(dims) else ())


def make_gm(graph: fx.Graph, root: Optional[torch.nn.Module] = None) -> fx.GraphModule:
    """A GraphModule of `graph`; `root` supplies what its get_attr nodes read (a higher-order
    op's body GraphModules), so an edited copy of a Case's graph passes its case.gm."""
    graph.lint()
    return fx.GraphModule(root if root is not None else torch.nn.Module(), graph)


def with_constants(module: torch.nn.Module, constants, store: TensorStore) -> torch.nn.Module:
    """`module` with each constant (InputSpec) set as a plain tensor attribute, in its recorded
    dtype, shape and strides, so tracing `module` reads it back as the same get_attr node."""
    for spec in constants:
        setattr(module, spec.name, store.value(spec))
    return module


def from_graph_module(gm: fx.GraphModule, example_inputs, store: TensorStore, *,
                      inline_constants: bool = True) -> Case:
    """Normalize a captured graph into a Case: placeholders become inputs (in order), outputs a
    tuple. A get_attr of a tensor stays a get_attr (a constant: backends treat it unlike an input,
    e.g. Inductor may fold it into its code), renamed to a flat attribute; its value keeps its
    dtype, shape and strides. `inline_constants=False`: every get_attr becomes an input after the
    graph's own (the --save-io folder's format, whose graph.py holds no constants)."""
    graph = fx.Graph()
    env, specs, constants = {}, [], []
    values = list(example_inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(values):
        raise ValueError(f"graph has {len(placeholders)} inputs but {len(values)} values were given")
    for node, value in zip(placeholders, values):
        env[node] = graph.placeholder(node.name)
        meta = node.meta.get("example_value", node.meta.get("val"))
        specs.append(replace(store.spec(node.name, value), dynamic=symbolic_dims(meta)))
    root = torch.nn.Module()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and not isinstance(_fetch_attr(gm, node.target), fx.GraphModule) and not (
                inline_constants and _holds_tensor(gm, node)):
            # the save-io format, or a non-tensor attribute (no constant a repro file can hold)
            env[node] = graph.placeholder(node.name)
            specs.append(store.spec(node.name, _fetch_attr(gm, node.target)))
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node in env:
            continue
        if node.op == "get_attr" and isinstance(_fetch_attr(gm, node.target), fx.GraphModule):
            setattr(root, _attribute(node.target), _body(_fetch_attr(gm, node.target)))   # a HOP body
        elif node.op == "get_attr":
            value = _fetch_attr(gm, node.target)
            spec = store.spec(node.name, value)
            constants.append(spec)
            setattr(root, node.name, store.value(spec))
            env[node] = graph.get_attr(node.name)
            continue
        if node.op == "call_module":
            raise ValueError(f"graph calls submodule {node.target!r}; tdbg's minifier needs "
                             "functional graphs (Dynamo inlines nn.Modules by default)")
        if node.op == "output":
            outs = node.args[0]
            outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
            graph.output(tuple(fx.node.map_arg(outs, lambda n: env[n])))
            continue
        env[node] = graph.node_copy(node, lambda n: env[n])
        env[node].meta, env[node].type = {}, None
    return Case(make_gm(graph, root), tuple(specs), tuple(constants))


def _body(gm: fx.GraphModule) -> fx.GraphModule:
    """A higher-order op's body as a plain GraphModule (no meta, no types), bodies inside it too;
    it must be functional: values it reads come in as its arguments."""
    graph, env, root = fx.Graph(), {}, torch.nn.Module()
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = _fetch_attr(gm, node.target)
            if not isinstance(value, fx.GraphModule):
                raise ValueError(f"a higher-order op's body reads {node.target!r} (a {type(value).__name__}), "
                                 "which tdbg cannot carry in a graph's source")
            setattr(root, _attribute(node.target), _body(value))
        elif node.op == "call_module":
            raise ValueError(f"a higher-order op's body calls submodule {node.target!r}")
        env[node] = graph.node_copy(node, lambda n: env[n])
        env[node].meta, env[node].type = {}, None
    return make_gm(graph, root)


def _attribute(target: str) -> str:
    if not target.isidentifier():
        raise ValueError(f"graph reads attribute {target!r}; tdbg carries only top-level attributes")
    return target


def _holds_tensor(gm, node) -> bool:
    return isinstance(_fetch_attr(gm, node.target), torch.Tensor)


def _fetch_attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------- source <-> graph

_STANDARD_IMPORTS = ("import math", "import operator", "import torch", "from math import inf, nan",
                     "from torch import device")


def forward_source(graph: fx.Graph) -> str:
    """FX's code for the graph as `def forward(self, ...)`, stripped of blank edges."""
    return "\n".join(line.rstrip() for line in graph.python_code(root_module="self").src.strip().splitlines()) + "\n"


def imports_for(graph: fx.Graph) -> str:
    """Import lines that make forward_source's globals resolvable in a fresh module (those of the
    higher-order op bodies included)."""
    lines = list(_STANDARD_IMPORTS)
    for g in _graphs(graph):
        for name, value in g.python_code(root_module="self").globals.items():
            line = _import_line(name, value)
            if line and line not in lines:
                lines.append(line)
    return "\n".join(lines)


def _graphs(graph: fx.Graph) -> list:
    """`graph` and, depth first, the graphs of the GraphModules its get_attr nodes read."""
    return [graph] + [g for _, sub in _bodies(graph) for g in _graphs(sub.graph)]


def _bodies(graph: fx.Graph) -> list:
    """(attribute, GraphModule) per higher-order op body that `graph`'s get_attr nodes read."""
    owner, seen = graph.owning_module, {}
    for node in graph.nodes:
        if node.op == "get_attr" and owner is not None and node.target not in seen:
            value = getattr(owner, node.target, None)
            if isinstance(value, fx.GraphModule):
                seen[node.target] = value
    return list(seen.items())


_KNOWN_GLOBALS = {"inf", "nan", "torch", "device", "math", "operator"}
_SPECIAL = {"NoneType": "NoneType = type(None)",
            "fx_pytree": "import torch.fx._pytree as fx_pytree",
            "pytree": "import torch.utils._pytree as pytree"}


def _import_line(name: str, value: Any) -> Optional[str]:
    if name in _KNOWN_GLOBALS:
        return None
    if name in _SPECIAL:
        return _SPECIAL[name]
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__} as {name}" if value.__name__ != name else f"import {name}"
    module, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if module and qual and "." not in qual and "<" not in qual:
        return f"from {module} import {qual} as {name}" if qual != name else f"from {module} import {name}"
    raise ValueError(f"graph refers to {value!r} ({name}), which a standalone file cannot import")


def module_source(graph: fx.Graph, name: str = "Repro") -> str:
    """`class Repro(torch.nn.Module)` with the graph's forward, readable and standalone. Each
    higher-order op body is a class of its own before it (`Repro_cond_true_0`), which
    `Repro.__init__` sets as the attribute the graph's get_attr reads; plain Python runs it
    eagerly, trace_source reads every class back as a GraphModule."""
    parts, init = [], []
    for attr, sub in _bodies(graph):
        parts.append(module_source(sub.graph, f"{name}_{attr}"))
        init.append(f"        self.{attr} = {name}_{attr}()")
    body = "\n".join("    " + line if line else "" for line in forward_source(graph).splitlines())
    if init:
        body = "    def __init__(self):\n        super().__init__()\n" + "\n".join(init) + "\n\n" + body
    parts.append(f"class {name}(torch.nn.Module):\n{body}\n")
    return "\n\n".join(parts)


def trace_module(module: torch.nn.Module) -> fx.GraphModule:
    """The GraphModule of a module_source class instance (its file's source is read, see
    trace_source); GraphSourceError when the source holds what FX does not write."""
    return trace_repro(module)


_SOURCE_IDS = itertools.count()


def trace_source(source: str, filename: str = "", constants=(), store: Optional[TensorStore] = None) -> fx.GraphModule:
    """The graph of a module_source text (with its imports): exec'd for its globals and classes,
    then read statement by statement (runtime.trace_repro). The text is registered with
    linecache under `filename` (a fresh `<tdbg graph N>` by default), so the reader and any
    traceback through the graph's forward show its lines. `constants` (InputSpecs of
    Case.constants, values in `store`) are set on `Repro()` first."""
    filename = filename or f"<tdbg graph {os.getpid()}-{next(_SOURCE_IDS)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        namespace: dict = {"__name__": "tdbg_graph"}
        exec(compile(source, filename, "exec"), namespace)
        return trace_module(with_constants(namespace["Repro"](), constants, store))
    finally:
        linecache.cache.pop(filename, None)


def case_source(case: Case) -> str:
    return imports_for(case.gm.graph) + "\n\n\n" + module_source(case.gm.graph)
