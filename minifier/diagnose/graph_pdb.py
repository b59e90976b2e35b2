"""Stop in pdb inside a compiled graph's own Python code, at the ops of one user line.

`GraphBreakpoints(at, script)` is a Dynamo-graph edit (instrument.Session.graph_edit): in every
graph the backend gets, the first op traced from FILE:LINE that reads a tensor has that tensor
passed through `tdbg::stop_at` first. At run time the op's kernel finds the FX-generated frame
that called it (a GraphModule's `forward`, file `<eval_with_key>.N`, the code that carries the
`# File: ..., code: ...` comments of the user's lines) and starts pdb there, so the debugger's
next line is the graph's first statement from the user's line, with the graph's values in scope.

Why an op and not a `breakpoint()` call: a Python call in the Dynamo graph would run once, at
trace time, for backends that trace the graph again (AOTAutograd). As an op it survives
AOTAutograd into the aten graph, so the stop is in the Python that runs: the Dynamo graph under
the `eager` backend, the aten forward graph under `aot_eager`. A compiler (tdbg's, Inductor) does
not lower the op: it stays an aten call in the compiled graph's Python wrapper (tdbg's
output_code.py, Inductor's generated module), between the kernels, so pdb stops there, before the
kernel that computes the user's line (the stop op splits fusion at that point: the kernels around
it are not the ones the run compiles without --break-at). tdbg's output code is exec'd from a
string; its text is put in linecache so that pdb lists it.

The op returns a copy of its input (a new tensor keeps it functional; its gradient passes
through), so a graph's values are unchanged.
"""
from __future__ import annotations

import linecache
import os
import re
import sys
from typing import Optional

_OP = None   # torch.ops.tdbg.stop_at.default, registered on first use


def stop_op():
    """The `tdbg::stop_at(Tensor x, str where) -> Tensor` op (registered once per process)."""
    global _OP
    if _OP is None:
        import torch

        # the schema spelled out: this module's annotations are strings (PEP 563)
        @torch.library.custom_op("tdbg::stop_at", mutates_args=(), schema="(Tensor x, str where) -> Tensor")
        def stop_at(x, where):
            _stop(where)
            return x.clone()

        @stop_at.register_fake
        def _(x, where):
            return torch.empty_like(x)

        stop_at.register_autograd(lambda ctx, grad: (grad, None))
        _OP = torch.ops.tdbg.stop_at.default
    return _OP


def _stop(where: str) -> None:
    """Start pdb in the nearest FX-generated frame up the stack (the graph's forward)."""
    frame = sys._getframe(1)
    while frame is not None and not _graph_code(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:   # called outside a graph (e.g. by hand): nothing to stop in
        return
    _register_source(frame)
    # FX clears each value after its last use, so only the live ones are worth naming
    live = ", ".join(k for k, v in frame.f_locals.items() if k != "self" and v is not None)
    # the statement running the stop op binds its result: FX's node `stop_at`, a compiled graph's bufN
    bound = re.match(r"\s*(\w+) = ", linecache.getline(frame.f_code.co_filename, frame.f_lineno))
    sys.stdout.write(f"tdbg: stopped in graph code {frame.f_code.co_filename} at the first op of {where}; "
                     f"`{bound.group(1) if bound else 'stop_at'}` is the tensor that op reads (live values: {live}). "
                     "`l` lists the graph's code, `c` continues.\n")
    sys.stdout.flush()
    debugger = _debugger()
    # Bdb.set_trace(frame) steps into the next event anywhere (here: torch's checks of this op's
    # result); stepping over to the next line of the graph's own frame lands on the user's ops.
    debugger.reset()
    f = frame
    while f is not None:
        f.f_trace = debugger.trace_dispatch
        debugger.botframe = f
        f = f.f_back
    debugger.set_next(frame)
    sys.settrace(debugger.trace_dispatch)


def _register_source(frame) -> None:
    """tdbg's output code is exec'd from a string: put its text in linecache (pdb's `l` reads it
    there), from the CompiledGraph (`source_code`) found as a local of a caller frame."""
    name = frame.f_code.co_filename
    if not name.startswith("<tdbg output code") or linecache.getline(name, 1):
        return
    f = frame.f_back
    while f is not None:
        source = next((v.source_code for v in f.f_locals.values()
                       if isinstance(getattr(v, "source_code", None), str) and v.source_code), None)
        if source:
            linecache.cache[name] = (len(source), None, source.splitlines(True), name)
            return
        f = f.f_back


def _graph_code(filename: str) -> bool:
    """A compiled graph's own Python: FX's generated forward, or tdbg's output_code.py (its call
    of the stop op is an aten fallback between kernels, under the user line's comment)."""
    if filename.startswith(("<eval_with_key>", "<tdbg output code")) or os.path.basename(filename) == "output_code.py":
        return True
    from tdbg.minifier.runs.instrument import _in_inductor_cache   # Inductor's generated module
    return filename.endswith(".py") and _in_inductor_cache(os.path.realpath(filename))


def _debugger():
    import pdb

    class GraphPdb(pdb.Pdb):
        """pdb that keeps FX's `<eval_with_key>.N` file names as they are: made absolute (Bdb.canonic)
        they miss the linecache entries FX registers, and pdb would show no graph line."""

        def canonic(self, filename):
            return filename if filename.startswith("<") else super().canonic(filename)
    return GraphPdb()


class GraphBreakpoints:
    """The graph edit for `at` ('FILE:LINE' or 'LINE' of `script`); `placed` lists, per edited
    graph, {graph, node, line} (empty when no graph had an op from that line)."""

    def __init__(self, at: str, script: str):
        self.file, self.line = parse_at(at, script)
        self.placed: list = []
        self._graphs = 0

    def __call__(self, gm) -> None:
        index, self._graphs = self._graphs, self._graphs + 1
        node, arg = self._target(gm)
        if node is None:
            return
        code = linecache.getline(self.file, self.line).strip()
        where = f"{os.path.basename(self.file)}:{self.line} `{code}`"
        with gm.graph.inserting_before(node):
            stop = gm.graph.create_node("call_function", stop_op(), (arg, where), name="stop_at")
        stop.meta.update({k: v for k, v in arg.meta.items() if k in ("example_value", "val", "tensor_meta")})
        stop.meta["stack_trace"] = node.meta.get("stack_trace")
        node.replace_input_with(arg, stop)
        gm.recompile()
        self.placed.append({"graph": index, "node": node.name, "line": f"{_rel(self.file)}:{self.line}",
                            "code": code})

    def _target(self, gm):
        """(first op from the line reading a tensor, that tensor's node), or (None, None)."""
        for node in gm.graph.nodes:
            if not node.op.startswith("call_") or not self._from_line(node.meta.get("stack_trace") or ""):
                continue
            arg = next((a for a in node.all_input_nodes if _is_tensor(a)), None)
            if arg is not None:
                return node, arg
        return None, None

    def _from_line(self, trace: str) -> bool:
        frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
        return any(os.path.realpath(f) == self.file and int(n) == self.line for f, n in frames)


def _rel(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _is_tensor(node) -> bool:
    import torch
    value = node.meta.get("example_value", node.meta.get("val"))
    return isinstance(value, torch.Tensor)


def parse_at(at: str, script: str) -> tuple:
    """'FILE:LINE' or 'LINE' (in `script`) -> (real path, line); ValueError with the reason."""
    m = re.match(r"^(?:(?P<file>.+):)?(?P<line>\d+)$", at.strip())
    if not m:
        raise ValueError(f"--break-at takes FILE:LINE or LINE (a line of the script), not {at!r}")
    path = m["file"] or script
    if not os.path.isfile(path):
        raise ValueError(f"--break-at {at}: {path!r} is not a file")
    return os.path.realpath(path), int(m["line"])


def check_at(at: str, script: str) -> Optional[str]:
    """A one-paragraph problem with `at`, or None (the CLI asks before any run)."""
    try:
        parse_at(at, script)
    except ValueError as e:
        return str(e)
    return None
