"""Graphs and their inputs as data: readable source, content-hashed tensors, load/save.

A `Case` is what the minifier shrinks: an FX GraphModule whose placeholders are, in order, the
`inputs` (InputSpec rows). Tensor values live in a `TensorStore` keyed by `InputSpec.key`: the
SHA-256 of their raw bytes (computed here with hashlib, never by the compiler under test) with the
dtype, shape and strides those bytes are read as, since equal bytes are not equal inputs (float32
and int32 zeros(4) share them). On disk each is `inputs/<sha256>.bin` holding exactly those bytes,
so `sha256sum` verifies it; inputs with equal bytes share the file.

The graph travels as Python source (`module_source`): a `class Repro(torch.nn.Module)` whose
`forward` is FX's own code for the graph. `trace_source` turns that text back into the same
graph, recording every torch call (also factory calls such as `torch.ones(2)` that plain
symbolic tracing would fold into constants).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import types
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import torch
import torch.fx as fx

# The tracer lives in runtime.py, which repro.py carries verbatim: repro.py must rebuild exactly
# the graph the minifier's queries ran (plain symbolic_trace folds factory calls into constants).
from tdbg.repro_templates.runtime import CallTracer as _Tracer, RecordCalls as _RecordCalls  # noqa: F401

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
            rows = [f"{s.sha}|{s.shape}|{s.stride}|{s.dtype}|{s.requires_grad}|{s.value!r}" for s in self.inputs]
            rows += [f"constant {s.name}|{s.sha}|{s.shape}|{s.stride}|{s.dtype}" for s in self.constants]
            text = forward_source(self.gm.graph) + "\n" + "\n".join(rows)
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


def make_gm(graph: fx.Graph, root: Optional[torch.nn.Module] = None) -> fx.GraphModule:
    """A GraphModule of `graph`; its get_attr targets are taken from `root`."""
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
        specs.append(store.spec(node.name, value))
    root = torch.nn.Module()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and not (inline_constants and _holds_tensor(gm, node)):
            # a submodule (no constant a repro file can hold), or the save-io format
            env[node] = graph.placeholder(node.name)
            specs.append(store.spec(node.name, _fetch_attr(gm, node.target)))
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node in env:
            continue
        if node.op == "get_attr":
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
        env[node].meta = {}
    return Case(make_gm(graph, root), tuple(specs), tuple(constants))


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
    return graph.python_code(root_module="self").src.strip("\n") + "\n"


def imports_for(graph: fx.Graph) -> str:
    """Import lines that make forward_source's globals resolvable in a fresh module."""
    lines = list(_STANDARD_IMPORTS)
    for name, value in graph.python_code(root_module="self").globals.items():
        line = _import_line(name, value)
        if line and line not in lines:
            lines.append(line)
    return "\n".join(lines)


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


def module_source(graph: fx.Graph) -> str:
    """`class Repro(torch.nn.Module)` with the graph's forward, readable and standalone."""
    body = "\n".join("    " + line if line else "" for line in forward_source(graph).splitlines())
    return f"class Repro(torch.nn.Module):\n{body}\n"


def trace_module(module: torch.nn.Module) -> fx.GraphModule:
    # the tracer repro.py uses too (runtime.py): a query and the written repro see one graph
    graph = _Tracer().trace(module)
    for node in graph.nodes:
        node.type = None
    return make_gm(graph, module)   # the module's tensor constants stay its get_attr targets


def trace_source(source: str, filename: str = "<tdbg graph>", constants=(),
                 store: Optional[TensorStore] = None) -> fx.GraphModule:
    """Exec a module_source text (with its imports) and trace `Repro` back into a GraphModule;
    `constants` (InputSpecs of Case.constants, values in `store`) are set on it first."""
    namespace: dict = {"__name__": "tdbg_graph"}
    exec(compile(source, filename, "exec"), namespace)
    return trace_module(with_constants(namespace["Repro"](), constants, store))


def case_source(case: Case) -> str:
    return imports_for(case.gm.graph) + "\n\n\n" + module_source(case.gm.graph)
