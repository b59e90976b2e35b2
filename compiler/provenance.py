"""Provenance: which lines of the FX graph, the loop IR and the C++ each FX node became.

`build(c, fx_text)` takes a finished (or partly finished) `Compilation` and the text of the FX
graph file it was compiled from (`fx_graph_readable.py`) and returns a `Provenance` with

- `ir_text`: the loop IR after scheduling, one block per IR node (its buffer, kind, FX origins,
  ranges, reads and body), every body statement tagged `# <fx node>` with the node whose
  lowering emitted it;
- `cpp_text`: every kernel's C++ source, one after the other;
- `nodes`: FX node name -> {"fx_lines", "ir_lines", "cpp_lines", "kernel", "source"}, line
  numbers 1-based into the FX file, `ir_text` and `cpp_text`; `kernel` is the first kernel (in
  execution order) holding the node's code, None for nodes that run as aten calls or views;
  `source` is the user's line (`file:line  code`) from the node's stack trace, "" when it has none.

How a line is attributed (nothing is guessed from line order alone):
- FX: the line that assigns the node (`name: "f32[..]" = ...` in `print_readable` output).
- IR: body statements emitted while the node's `ops.origin(node)` context was open; a block's
  header, reduction and store lines belong to the IR node's own FX node (its first origin);
  an extern call's block belongs to its FX node.
- C++: the `// FX: <node line>` comment and every statement codegen emitted under that node's
  origin (`KernelInfo.line_origins`); a reduction's `// accumulate` comment, the combine line
  after it and every line using that accumulator belong to the reduction's FX node, matched by
  order when the kernel has as many `// accumulate` comments as reductions (otherwise, e.g. in
  fused row+column reductions, those lines stay unattributed rather than guessed); a store of a
  single temporary (`out_ptr0[x0] = tmp6;`) belongs to the node that computed the temporary.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field

FX_FILE, IR_FILE, CPP_FILE = "fx_graph_readable.py", "ir.txt", "kernels.cpp"
PROVENANCE_FILE = "provenance.json"
# the comment codegen writes above each FX node's C++ (the HTML report reads older folders by it)
FX_COMMENT = re.compile(r"^\s*// FX: (?P<node>[A-Za-z_]\w*) = ")

_FX_ASSIGN = re.compile(r"^\s*([A-Za-z_]\w*)(?:\s*:\s*\"[^\"]*\")?\s*=\s")
_ACC = re.compile(r"\b(acc\d+)")
_DEF = re.compile(r"^[\w:<> ]+\s(tmp\d+) = ")
_STORE = re.compile(r"^[\w\[\]()+*/%\s-]+ = (tmp\d+);$")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)')


@dataclass
class Provenance:
    ir_text: str = ""
    cpp_text: str = ""
    nodes: dict = field(default_factory=dict)
    kernels_of: dict = field(default_factory=dict)    # FX node -> every kernel holding its code

    def document(self, fx: str = FX_FILE, ir: str = IR_FILE, cpp: str = CPP_FILE) -> dict:
        """The provenance.json document (file names: where the three texts were written)."""
        return {"fx": fx, "ir": ir, "cpp": cpp, "nodes": self.nodes}

    def node_mappings(self) -> dict:
        """Inductor's `inductor_provenance_tracking_node_mappings` shape (version 2.0), which
        tlparse's provenance view reads: kernel <-> graph node. tdbg has no pre-grad graph, so
        preToPost/postToPre are empty."""
        post_to_kernel = {name: list(ks) for name, ks in self.kernels_of.items() if ks}
        kernel_to_post = {}
        for name, kernels in post_to_kernel.items():
            for k in kernels:
                kernel_to_post.setdefault(k, []).append(name)
        return {"preToPost": {}, "postToPre": {}, "cppCodeToPost": kernel_to_post,
                "postToCppCode": post_to_kernel, "version": 2.0}

    def kernel_stack_traces(self) -> dict:
        """kernel -> the user lines of its FX nodes (Inductor's `..._kernel_stack_traces` shape)."""
        out = {}
        for name, kernels in self.kernels_of.items():
            source = self.nodes[name]["source"]
            for k in kernels:
                lines = out.setdefault(k, [])
                if source and source not in lines:
                    lines.append(source)
        return out


def user_source(stack_trace: str) -> str:
    """`file:line  code` of the last frame of an FX stack trace (the user's own line), or ""."""
    frames = _FRAME.findall(stack_trace or "")
    if not frames:
        return ""
    path, line, code = frames[-1]
    return f"{path}:{line}  {code.strip()}"


def fx_lines(fx_text: str) -> dict:
    """FX node name -> the 1-based lines assigning it in `print_readable` text (first graph only:
    a nested submodule reusing a name does not steal the top graph's line)."""
    out = {}
    for i, line in enumerate(fx_text.splitlines(), 1):
        m = _FX_ASSIGN.match(line)
        if m and not line.lstrip().startswith(("def ", "class ", "#", "return")):
            out.setdefault(m.group(1), [i])
    return out


class _OriginTextOps:
    """The IR printer's op handler (ir.TextOps) that also records, per statement, the FX node
    whose `origin` context was open when it was emitted."""

    def __init__(self):
        from .ir import TextOps
        self._text = TextOps()
        self._stack = []
        self.origins = []          # parallel to self._text.lines

    @property
    def lines(self):
        return self._text.lines

    @contextlib.contextmanager
    def origin(self, node):
        self._stack.append(node.name)
        try:
            yield
        finally:
            self._stack.pop()

    def _sync(self):
        while len(self.origins) < len(self._text.lines):
            self.origins.append(self._stack[-1] if self._stack else None)

    def inject_bug(self, kind, value, node):
        with self.origin(node):     # as codegen_cpp: the injected statement is the culprit's
            result = self._text.inject_bug(kind, value, node)
            self._sync()
        return result

    def masked(self, mask, body, other):
        def tracked():
            value = body()
            self._sync()
            return value
        result = self._text.masked(mask, tracked, other)
        self._sync()
        return result

    def __getattr__(self, name):
        attr = getattr(self._text, name)
        if not callable(attr):
            return attr

        def op(*args, **kwargs):
            result = attr(*args, **kwargs)
            self._sync()
            return result
        return op


def _body(node):
    """(statement lines, their FX origins) of a scheduler node's loop body."""
    from .ir import Reduction
    handler = _OriginTextOps()
    data = node.buffer.data
    if isinstance(data, Reduction):
        result = data.inner_fn(handler, node.index, node.rindex)
    else:
        result = data.inner_fn(handler, node.index)
    lines, origins = list(handler.lines), list(handler.origins)
    own = node.origins[0].name if node.origins else None
    if isinstance(data, Reduction):
        lines.append(f"acc = {data.reduction_type}-reduce {result} over {list(data.reduction_ranges)}")
        origins.append(own)
        result = "acc"
    lines.append(f"store({node.buffer.name}, {node.store_index}, {result})")
    origins.append(own)
    return lines, origins


class _Text:
    """Lines with an FX-node attribution each (None = no node)."""

    def __init__(self):
        self.lines, self.owners = [], []

    def add(self, text, owner=None):
        self.lines.append(text)
        self.owners.append(owner)

    def index(self) -> dict:
        out = {}
        for i, owner in enumerate(self.owners, 1):
            if owner is not None:
                out.setdefault(owner, []).append(i)
        return out

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def ir_text(items, kernels) -> _Text:
    """The scheduled IR, one block per IR node, every statement tagged with its FX node."""
    from .scheduler import KernelGroup
    from .wrapper import pyexpr
    kernel_of = {k.group_index: k.name for k in kernels or ()}
    out = _Text()
    for pos, item in enumerate(items):
        if isinstance(item, KernelGroup):
            out.add(f"# group {pos}: kernel {kernel_of.get(pos, '?')}, {len(item.nodes)} IR node(s) "
                    f"over ranges {list(item.ranges)}")
            for node in item.nodes:
                own = node.origins[0].name if node.origins else None
                data = node.buffer.data
                kind = type(data).__name__
                if hasattr(data, "reduction_type"):
                    kind += f" {data.reduction_type} over {list(data.reduction_ranges)}"
                out.add(f"{node.buffer!r}: {kind}{' (local)' if node.local else ''}", own)
                out.add(f"  origins: {[o.name for o in node.origins]}")
                out.add(f"  ranges: {list(node.ranges)}" + (f" x {list(node.rranges)}" if node.rranges else ""))
                out.add(f"  reads: {sorted(node.read_names())}")
                out.add("  body:")
                lines, origins = _body(node)
                width = max(len(line) for line in lines) + 6
                for line, origin in zip(lines, origins):
                    text = f"    {line}"
                    out.add(f"{text:<{width}}# {origin}" if origin else text, origin)
        else:
            k = item.kernel
            out.add(f"# group {pos}: extern call")
            out.add(f"ExternKernel({k.name}): {k.target}", k.node.name)
            out.add(f"  origins: [{k.node.name}]", k.node.name)
            out.add(f"  reads: {sorted({pyexpr(x) for x in k.inputs})}", k.node.name)
            out.add(f"  writes: {[b.name for b in k.outputs] + [b.name for b in k.mutated]}", k.node.name)
        out.add("")
    return out


def _reduction_origins(items, kernel) -> list:
    """FX nodes of a kernel's reductions in group order, or None when the kernel's accumulate
    comments cannot be matched to them one to one (fused row+column reductions)."""
    item = items[kernel.group_index]
    if getattr(item, "columns", None) is not None:
        return None
    return [n.origins[0].name for n in item.nodes if n.is_reduction and n.origins]


def cpp_text(items, kernels) -> _Text:
    """Every kernel's source, each line attributed to an FX node where codegen says so."""
    from .codegen_reduction import REDUCTION_COMMENT
    out = _Text()
    for k in kernels:
        out.add(f"// kernel {k.name} (group {k.group_index}): FX nodes {', '.join(k.fx_nodes)}")
        lines = k.source.rstrip("\n").split("\n")
        owners = [None] * len(lines)
        reductions = _reduction_origins(items, k)
        accumulates = [i for i, line in enumerate(lines) if line.strip() == REDUCTION_COMMENT]
        accs = {}
        if reductions is not None and len(accumulates) == len(reductions):
            for i, fx in zip(accumulates, reductions):
                owners[i] = fx
                if i + 1 < len(lines):
                    owners[i + 1] = fx
                    m = _ACC.search(lines[i + 1])
                    if m:
                        accs[m.group(1)] = fx
        for i, line in enumerate(lines):
            if owners[i] is not None:
                continue
            stripped = line.strip()
            m = FX_COMMENT.match(line)
            if m:
                owners[i] = m.group(1)
            elif stripped in k.line_origins:
                owners[i] = k.line_origins[stripped]
            else:
                acc = _ACC.search(stripped)
                if acc and acc.group(1) in accs:
                    owners[i] = accs[acc.group(1)]
        # a store of one temporary (`out_ptr0[x0] = tmp6;`) belongs to the node that computed it
        defined = {}
        for line, owner in zip(lines, owners):
            m = _DEF.match(line.strip())
            if m and owner is not None:
                defined[m.group(1)] = owner
        for i, line in enumerate(lines):
            m = _STORE.match(line.strip())
            if owners[i] is None and m and m.group(1) in defined:
                owners[i] = defined[m.group(1)]
        for line, owner in zip(lines, owners):
            out.add(line, owner)
        out.add("")
    return out


def build(c, fx_text: str) -> Provenance:
    """Provenance of compilation `c` (see module docstring); IR and C++ parts are empty when the
    compilation stopped before scheduling / codegen."""
    gm_nodes = [n for n in c.gm.graph.nodes if n.op == "call_function"]
    fx = fx_lines(fx_text)
    ir = ir_text(c.items, c.kernels) if c.items is not None else _Text()
    cpp = cpp_text(c.items, c.kernels) if c.kernels is not None else _Text()
    ir_index, cpp_index = ir.index(), cpp.index()
    kernels_of = {}
    for k in c.kernels or ():
        for name in k.fx_nodes:
            kernels_of.setdefault(name, []).append(k.name)
    nodes = {}
    for n in gm_nodes:
        nodes[n.name] = {"fx_lines": fx.get(n.name, []), "ir_lines": ir_index.get(n.name, []),
                         "cpp_lines": cpp_index.get(n.name, []), "kernel": kernels_of.get(n.name, [None])[0],
                         "source": user_source(n.meta.get("stack_trace", ""))}
    return Provenance(ir.text() if ir.lines else "", cpp.text() if cpp.lines else "", nodes,
                      {n: kernels_of[n] for n in nodes if n in kernels_of})
