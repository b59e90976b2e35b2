"""Which buffers are alive at a call's measured peak, and where they come from.

Two observations made during the measured call itself (memory.track), joined by storage pointer:

- the allocator's events (memory.Trace) say which allocations are alive at the peak, their exact
  sizes, and the aten op each was allocated under (the outermost `aten::` range around it);
- `LocalNames`, a `sys.settrace` hook limited to generated graph code (FX's `<eval_with_key>`
  modules, tdbg's output_code.py, Inductor's generated modules), records the local variable each
  new tensor storage is first bound to: an FX node's name, or a compiled graph's `bufN`.

`Namer` then turns a name into FX nodes and the user's line: for FX code by the node of that name;
for tdbg's output_code.py by the kernel that first writes `bufN` (CompiledGraph.kernel_nodes),
or by the extern call that returns it; for Inductor's generated module the same way, its C++
kernels' FX nodes being the origins Inductor recorded while generating them
(inductor_hooks.kernel_origins) and its extern calls' the `Source Nodes` comment Inductor writes
above them (a buffer renamed by `bufM = bufN; del bufN  # reuse` is followed to its writer). A storage never bound to a local in graph code (a
temporary inside one aten op, a backend's own Python) keeps only its allocating op.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Optional

TOP_BUFFERS = 8      # buffers kept per call and side (the largest at the peak)
# tdbg's output_code.py allocates with `empty_strided` (or its pool's), Inductor's with `empty_strided_cpu`
_ALLOC_LINE = re.compile(r"^\s*(\w+) = (?:_pool\.)?empty_strided(?:_cpu)?\(")
# a statement calling a kernel by name: Inductor's `cpp_fused_add_0(...)`, tdbg's `_status = _k_NAME(...)`
_CALL = re.compile(r"^\s*(?:\w+ = )?(\w+)\(")
_EXTERN_CALL = re.compile(r"^\s*(\w+) = (torch\.ops\.[\w.]+|aten\.[\w.]+|torch\.\w+|extern_kernels\.\w+)\(")
_OP = re.compile(r"(torch\.ops\.[\w.]+|aten\.[\w.]+|torch\.\w+|extern_kernels\.\w+)\(")
_REUSE = re.compile(r"^\s*(\w+) = (\w+); del \2\b")   # Inductor: `buf3 = buf1; del buf1  # reuse`
# Inductor's comment above an extern kernel call: the FX nodes it comes from
_SOURCE_NODES = re.compile(r"^\s*# (?:Topologically Sorted|Unsorted) Source Nodes: \[([^\]]*)\]")


def _generated(filename: str) -> bool:
    if filename.startswith(("<eval_with_key>", "<tdbg output code")) or os.path.basename(filename) == "output_code.py":
        return True
    from tdbg.minifier.runs.instrument import _in_inductor_cache
    return filename.endswith(".py") and _in_inductor_cache(os.path.realpath(filename))


class LocalNames:
    """`with LocalNames() as names:` -> names.first: storage ptr -> [(local name, storage bytes), ...],
    one per new tensor bound at that storage by generated graph code inside the block, in order
    (freed storage is reused: the n-th allocation of a size at a pointer is the n-th name of that
    size there, see `peak_buffers`)."""

    def __init__(self):
        self.first: dict = {}
        self._bound: dict = {}    # (frame id, local name) -> storage ptr it was last seen at
        self._saved = None

    def __enter__(self):
        self._saved = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._saved)
        return False

    def _call(self, frame, event, arg):
        if event == "call" and _generated(frame.f_code.co_filename):
            return self._line
        return None

    def _line(self, frame, event, arg):
        import torch
        bound, views, sizes = {}, set(), {}
        for name, value in frame.f_locals.items():
            if isinstance(value, torch.Tensor):
                try:
                    storage = value.untyped_storage()
                    bound[name], sizes[name] = storage.data_ptr(), storage.nbytes()
                except (RuntimeError, NotImplementedError):   # a tensor without storage (sparse, meta)
                    continue
                if value._is_view():
                    views.add(name)
        owners = {}
        for (fid, name), ptr in self._bound.items():
            if fid == id(frame):
                owners.setdefault(ptr, set()).add(name)
        for name, ptr in bound.items():
            if self._bound.get((id(frame), name)) == ptr:
                continue
            self._bound[(id(frame), name)] = ptr
            # a new storage, or one whose earlier holders in this frame all let it go (freed, reused);
            # a view is never a new allocation (FX code binds `view = h.view(...);  h = None` on
            # one line: the storage is h's, still alive)
            holders = owners.get(ptr, set())
            if ptr not in self.first or (name not in views and not any(bound.get(h) == ptr for h in holders)):
                self.first.setdefault(ptr, []).append((name, sizes[name]))
        return self._line


class Namer:
    """name -> {"fx_nodes", "source"} for one graph's code: `gm` (the FX graph whose generated code
    runs, or whose nodes a compiled graph's kernels name) and optionally `compiled_graph` (a tdbg
    CompiledGraph or Inductor's compiled graph: anything with `source_code`; its `bufN` are named
    by the statement that first writes them). `kernels`: kernel name -> [(FX node, stack trace)]
    for kernels the compiled graph does not carry itself (Inductor's, inductor_hooks.kernel_origins);
    `also` (FX graphs): more nodes whose user lines may be looked up (Inductor's comments name the
    Dynamo graph's nodes)."""

    def __init__(self, gm=None, compiled_graph=None, kernels: Optional[dict] = None, also: tuple = ()):
        from tdbg.minifier.diagnose.checks import node_source, trace_source
        from tdbg.minifier.runs.instrument import is_user_file
        self.sources: dict = {}
        for graph in (*also[::-1], gm):   # gm's own nodes win over the others' of the same name
            if graph is not None:
                self.sources.update({n.name: node_source(n, is_user_file) for n in graph.graph.nodes})
        # kernel call name -> its FX nodes: tdbg's `_k_NAME(...)`, Inductor's `cpp_fused_..._N(...)`
        calls = {f"_k_{k}": list(v) for k, v in (getattr(compiled_graph, "kernel_nodes", {}) or {}).items()}
        for kernel, nodes in (kernels or {}).items():
            calls[kernel] = [name for name, _ in nodes]
            for name, trace in nodes:
                if not self.sources.get(name):
                    self.sources[name] = trace_source(trace or "", is_user_file)
        self.writers: dict = {}
        lines = (getattr(compiled_graph, "source_code", "") or "").splitlines()
        for i, line in enumerate(lines):
            alloc = _ALLOC_LINE.match(line)
            extern = _EXTERN_CALL.match(line)
            if extern:       # `bufN = torch.ops.aten.mm.default(...)`: the op made it
                self.writers.setdefault(extern.group(1), _commented(lines, i) or [extern.group(2)])
            if alloc:
                self.writers[alloc.group(1)] = self._writer(lines, i, alloc.group(1), calls)

    @staticmethod
    def _writer(lines: list, i: int, buf: str, calls: dict) -> list:
        """The FX nodes (or the op) of the first statement after line `i` that names `buf`,
        following `new = buf; del buf` renames."""
        for j in range(i + 1, len(lines)):
            line = lines[j]
            if line.lstrip().startswith("#") or not re.search(rf"\b{buf}\b", line):
                continue
            reuse = _REUSE.match(line)
            if reuse and reuse.group(2) == buf:
                buf = reuse.group(1)
                continue
            call, op = _CALL.match(line), _OP.search(line)
            if call and call.group(1) in calls:
                return calls[call.group(1)] or [call.group(1)]
            if call and call.group(1).startswith("_k_"):   # a tdbg kernel whose nodes are not known
                return [call.group(1)[3:]]
            if op:
                return _commented(lines, j) or [op.group(1)]
            return []
        return []

    def describe(self, name: Optional[str]) -> dict:
        """{"made_by": the FX nodes that compute the buffer (a kernel's nodes, or the node of that
        name), or the aten op of an extern call; "source": the first of their user lines}."""
        if name is None:
            return {"made_by": [], "source": None}
        nodes = self.writers.get(name) or ([name] if name in self.sources else [])
        source = next((self.sources[n] for n in nodes if self.sources.get(n)), None)
        return {"made_by": nodes, "source": source}


def _commented(lines: list, j: int) -> list:
    """The FX nodes Inductor's `# ... Source Nodes: [a, b], ...` comment right above line `j` names."""
    k = j - 1
    while k >= 0 and lines[k].lstrip().startswith("#"):
        found = _SOURCE_NODES.match(lines[k])
        if found:
            return [n.strip() for n in found.group(1).split(",") if n.strip()]
        k -= 1
    return []


def live_at_peak(trace) -> dict:
    """ptr -> (bytes, event index, how many earlier allocations of the call of that size used that
    ptr) of the call's allocations alive at the first instant of its peak."""
    live: dict = {}
    uses: dict = {}
    best, best_live, total = 0, {}, 0
    for i, (_, delta, ptr) in enumerate(trace.events):
        total += delta
        if delta > 0:
            live[ptr] = (delta, i, uses.get((ptr, delta), 0))
            uses[(ptr, delta)] = uses.get((ptr, delta), 0) + 1
        else:
            live.pop(ptr, None)
        if total > best:
            best, best_live = total, dict(live)
    return best_live


def peak_buffers(trace, names: dict, namer: Namer, limit: int = TOP_BUFFERS) -> list:
    """The largest buffers alive at the peak: {"bytes", "name", "op", "made_by", "source"}. The
    n-th allocation of a size at a pointer takes the n-th name bound there to a storage of that
    size (the last one when the names run out: an allocation of the same size never bound to a
    local shifts the count, so the name is a best match; sizes keep temporaries of another size
    from shifting it, which named BERT's buffers after the wrong nodes)."""
    rows = []
    for ptr, (size, index, nth) in live_at_peak(trace).items():
        bound = [name for name, nbytes in names.get(ptr) or [] if nbytes == size]
        name = bound[min(nth, len(bound) - 1)] if bound else None
        op = trace.ops[index] if index < len(trace.ops) else None
        rows.append({"bytes": size, "name": name, "op": op, **namer.describe(name)})
    return sorted(rows, key=lambda r: -r["bytes"])[:limit]
