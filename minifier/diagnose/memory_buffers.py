"""Which buffers are alive at a call's measured peak, and where they come from.

Two observations made during the measured call itself (memory.track), joined by storage pointer:

- the allocator's events (memory.Trace) say which allocations are alive at the peak, their exact
  sizes, and the aten op each was allocated under (the outermost `aten::` range around it);
- `LocalNames`, a `sys.settrace` hook limited to generated graph code (FX's `<eval_with_key>`
  modules, tdbg's output_code.py, Inductor's generated modules), records the local variable each
  new tensor storage is first bound to: an FX node's name, or a compiled graph's `bufN`.

`Namer` then turns a name into FX nodes and the user's line: for FX code by the node of that name;
for tdbg's output_code.py by the kernel that first writes `bufN` (CompiledGraph.kernel_nodes),
or by the extern call that returns it. A storage never bound to a local in graph code (a
temporary inside one aten op, a backend's own Python) keeps only its allocating op.
"""
from __future__ import annotations

import os
import re
import sys
from typing import Optional

TOP_BUFFERS = 8      # buffers kept per call and side (the largest at the peak)
_ALLOC_LINE = re.compile(r"^\s*(\w+) = (?:_pool\.)?empty_strided\(")
_KERNEL_CALL = re.compile(r"_k_(\w+)\(")
_EXTERN_CALL = re.compile(r"^\s*(\w+) = (torch\.ops\.[\w.]+|aten\.[\w.]+|torch\.\w+)\(")
_OP = re.compile(r"(torch\.ops\.[\w.]+|aten\.[\w.]+|torch\.\w+)\(")


def _generated(filename: str) -> bool:
    if filename.startswith(("<eval_with_key>", "<tdbg output code")) or os.path.basename(filename) == "output_code.py":
        return True
    from tdbg.minifier.runs.instrument import _in_inductor_cache
    return filename.endswith(".py") and _in_inductor_cache(os.path.realpath(filename))


class LocalNames:
    """`with LocalNames() as names:` -> names.first: storage ptr -> [local name, ...], one name per
    new tensor bound at that storage by generated graph code inside the block, in order (freed
    storage is reused: the n-th allocation at a pointer is the n-th name, see `peak_buffers`)."""

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
        bound = {}
        for name, value in frame.f_locals.items():
            if isinstance(value, torch.Tensor):
                try:
                    bound[name] = value.untyped_storage().data_ptr()
                except (RuntimeError, NotImplementedError):   # a tensor without storage (sparse, meta)
                    continue
        owners = {}
        for (fid, name), ptr in self._bound.items():
            if fid == id(frame):
                owners.setdefault(ptr, set()).add(name)
        for name, ptr in bound.items():
            if self._bound.get((id(frame), name)) == ptr:
                continue
            self._bound[(id(frame), name)] = ptr
            # a new storage, or one whose earlier holders in this frame all let it go (freed, reused)
            holders = owners.get(ptr, set())
            if ptr not in self.first or not any(bound.get(h) == ptr for h in holders):
                self.first.setdefault(ptr, []).append(name)
        return self._line


class Namer:
    """name -> {"fx_nodes", "source"} for one graph's code: `gm` (the FX graph whose generated code
    runs, or whose nodes a tdbg CompiledGraph's kernels name) and optionally `compiled_graph` (a
    tdbg CompiledGraph: its output code's `bufN` are named by the statement that first writes them)."""

    def __init__(self, gm=None, compiled_graph=None):
        from tdbg.minifier.diagnose.checks import node_source
        from tdbg.minifier.runs.instrument import is_user_file
        self.sources = {n.name: node_source(n, is_user_file) for n in gm.graph.nodes} if gm is not None else {}
        self.writers: dict = {}
        lines = (getattr(compiled_graph, "source_code", "") or "").splitlines()
        kernel_nodes = getattr(compiled_graph, "kernel_nodes", {}) or {}
        for i, line in enumerate(lines):
            alloc = _ALLOC_LINE.match(line)
            extern = _EXTERN_CALL.match(line)
            if extern:       # `bufN = torch.ops.aten.mm.default(...)`: the op made it
                self.writers.setdefault(extern.group(1), [extern.group(2)])
            if not alloc:
                continue
            # an allocated buffer is written by the first statement after it that names it
            buf = alloc.group(1)
            use = next((ln for ln in lines[i + 1:] if re.search(rf"\b{buf}\b", ln)), "")
            kernel, op = _KERNEL_CALL.search(use), _OP.search(use)
            if kernel:
                self.writers[buf] = list(kernel_nodes.get(kernel.group(1), [])) or [kernel.group(1)]
            elif op:
                self.writers[buf] = [op.group(1)]

    def describe(self, name: Optional[str]) -> dict:
        """{"made_by": the FX nodes that compute the buffer (a kernel's nodes, or the node of that
        name), or the aten op of an extern call; "source": the first of their user lines}."""
        if name is None:
            return {"made_by": [], "source": None}
        nodes = self.writers.get(name) or ([name] if name in self.sources else [])
        source = next((self.sources[n] for n in nodes if self.sources.get(n)), None)
        return {"made_by": nodes, "source": source}


def live_at_peak(trace) -> dict:
    """ptr -> (bytes, event index, how many earlier allocations of the call used that ptr) of the
    call's allocations alive at the first instant of its peak."""
    live: dict = {}
    uses: dict = {}
    best, best_live, total = 0, {}, 0
    for i, (_, delta, ptr) in enumerate(trace.events):
        total += delta
        if delta > 0:
            live[ptr] = (delta, i, uses.get(ptr, 0))
            uses[ptr] = uses.get(ptr, 0) + 1
        else:
            live.pop(ptr, None)
        if total > best:
            best, best_live = total, dict(live)
    return best_live


def peak_buffers(trace, names: dict, namer: Namer, limit: int = TOP_BUFFERS) -> list:
    """The largest buffers alive at the peak: {"bytes", "name", "op", "made_by", "source"}. The
    n-th allocation at a pointer takes the n-th name bound there (the last one when the names run
    out: an allocation never bound to a local shifts the count, so the name is a best match)."""
    rows = []
    for ptr, (size, index, nth) in live_at_peak(trace).items():
        bound = names.get(ptr) or []
        name = bound[min(nth, len(bound) - 1)] if bound else None
        op = trace.ops[index] if index < len(trace.ops) else None
        rows.append({"bytes": size, "name": name, "op": op, **namer.describe(name)})
    return sorted(rows, key=lambda r: -r["bytes"])[:limit]
