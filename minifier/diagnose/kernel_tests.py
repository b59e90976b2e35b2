"""A pytest file per compiled kernel: `tdbg run --kernel-tests DIR`.

`write_kernel_tests(saved_dir, out_dir)` reads a `--save-io` folder (artifacts/saved_io.py) and, for
each saved aten graph (kind forward, backward or inference):

1. compiles it with tdbg's compiler (the process's Config without an injected bug: the kernels a
   healthy compiler makes) to learn which FX nodes each kernel computes
   (`CompiledGraph.kernel_nodes`);
2. runs it eagerly (an fx.Interpreter) on the saved inputs, keeping every node's value;
3. writes `test_<graph>__<kernel>.py` per kernel (repro_templates/kernel_test.py.tmpl; a pytest
   file that also runs alone, `python FILE`), and RUNNER beside them, which runs them all without
   pytest (`KernelTests.command` is how to run them: pytest when this Python has it): the
   kernel's nodes as a small FX graph whose inputs are the values flowing in from outside the
   kernel and whose outputs are its nodes used outside it (or returned by the graph), those
   tensors (tensors/<sha256>.bin beside the files), and a test that compiles just that graph
   with tdbg's compiler and compares with eager's values within accuracy.py's tolerances.

How a kernel's node set becomes a graph (`kernel_nodes`): the kernel's own nodes, plus the view
nodes between two of them (a view of a fused value read back inside the same kernel) and the
chains of view nodes it reads through (so the kernel indexes its input buffers as it did in the
full graph), and the fills it reads (full, zeros, arange: made from constants and sizes alone),
made again in the test because a lowering may depend on its operand being made in the graph; a
getitem of a tuple made outside is an input, the getitems of a tuple made inside are outputs. Nodes that draw random numbers are never computed by a test (eager's draws cannot
be reproduced): their eager values are inputs, and the file says so.

A saved graph with symbolic sizes (its placeholders carry the recorded symbols, saved_io's
`dynamic`) gives its tests those symbols: each test input's dims are the symbolic sizes its value
had in the symbolic graph (`node_symbols`, in the saved graph's own symbol names), written as the
file's DYNAMIC, and the test compiles its graph with them (runtime.compile_graph, as repro.py
does) instead of at the saved sizes. An int the kernel reads from outside it is written in as a
constant (it specializes that symbol in the test's graph).

A healthy compiler passes every test; a compiler bug in one op fails the tests of exactly the
kernels that compute that op, whatever the other kernels do, because each test starts from
eager's values (a fill is made again in the tests of the kernels that read it, so a bug in a fill
fails those too). Graphs of kind "dynamo" (a backend with no AOT stage saved its Dynamo graph)
have no tdbg kernels to split by: they are listed in `KernelTests.skipped`, as is a graph tdbg
cannot compile. Files are never overwritten: an existing test file is refused before anything is
written, an existing tensor file is kept only when its bytes match its name.
"""
from __future__ import annotations

import copy
import hashlib
import operator
import os
import pprint
import re
import string
from dataclasses import dataclass, field
from importlib import resources
from typing import Optional

from tdbg.compiler.errors import TdbgError

TEMPLATE = "kernel_test.py.tmpl"
RUNNER = "run_kernel_tests.py"      # runs every test of its folder without pytest (repro_templates/RUNNER.tmpl)
TENSORS = "tensors"
SPLITTABLE_KINDS = ("forward", "backward", "inference")
# aten view ops that are not marked as views in their schema but only re-index their input
_VIEW_LIKE = frozenset({"_unsafe_view"})


class KernelTestsError(TdbgError):
    """Kernel tests cannot be written: a file would be overwritten or a folder is unusable."""
    stage = "bad_input"


@dataclass
class KernelTest:
    """One written test file."""
    graph: str
    kernel: str
    path: str
    fx_nodes: list
    ops: list                   # the aten op names of those nodes ("tanh"), sorted, no repeats
    source: str                 # the user line of the kernel's earliest node ("" when unknown)
    inputs: int
    outputs: int


@dataclass
class KernelTests:
    """What `write_kernel_tests` wrote. `skipped`: (graph, reason) for graphs with no test."""
    out_dir: str
    tests: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    graphs: int = 0

    @property
    def files(self) -> list:
        return [t.path for t in self.tests]

    @property
    def kernels(self) -> int:
        return len(self.tests)

    @property
    def command(self) -> Optional[str]:
        """How to run the tests: `python -m pytest DIR` where this Python has pytest, else
        `python DIR/run_kernel_tests.py` (the main install has no pytest); None with no test."""
        if not self.tests:
            return None
        import importlib.util
        import shlex
        if importlib.util.find_spec("pytest") is not None:
            return f"python -m pytest {shlex.quote(self.out_dir)}"
        return f"python {shlex.quote(os.path.join(self.out_dir, RUNNER))}"

    def to_dict(self) -> dict:
        return {"out_dir": self.out_dir, "graphs": self.graphs, "kernels": self.kernels, "command": self.command,
                "tests": [dict(t.__dict__) for t in self.tests],
                "skipped": [{"graph": g, "reason": r} for g, r in self.skipped]}


def write_kernel_tests(saved_dir: str, out_dir: str) -> KernelTests:
    """Write one pytest file per kernel of every saved aten graph in `saved_dir` into `out_dir`
    (created if missing). Raises SavedIOError for an unusable saved folder and KernelTestsError
    when a file would be overwritten (checked for every file before the first is written)."""
    from tdbg.minifier.artifacts.saved_io import load_saved
    run = load_saved(saved_dir)
    context = {"script": run.manifest.get("script", "?"), "backend": run.manifest.get("backend", "?")}
    return write_tests([(g.name, g.kind, g.gm, g.inputs, g.node_sources) for g in run.graphs], out_dir, context)


def write_tests(graphs, out_dir: str, context: Optional[dict] = None) -> KernelTests:
    """The same for in-memory graphs: [(name, kind, aten GraphModule, inputs, node_sources)]."""
    result = KernelTests(out_dir, graphs=len(graphs))
    files: dict = {}                    # path -> text
    tensors: dict = {}                  # sha -> bytes
    for name, kind, gm, inputs, sources in graphs:
        if kind not in SPLITTABLE_KINDS:
            result.skipped.append((name, f"a {kind} graph is not split per kernel: tdbg's kernels are made from "
                                         "aten graphs after AOTAutograd, and this backend saved the Dynamo graph"))
            continue
        try:
            kernels = kernel_map(gm, inputs, name, kind)
        except Exception as e:  # any failure of the compiler under test: no partition to split by
            stage = getattr(e, "stage", type(e).__name__)
            result.skipped.append((name, f"tdbg's compiler fails on it ({stage}): {_first_line(e)}; "
                                         "`tdbg replay` shows that failure"))
            continue
        if not kernels:
            result.skipped.append((name, "tdbg's compiler made no kernels for it (every node runs through aten)"))
            continue
        try:
            values = eager_values(gm, inputs)
        except Exception as e:  # eager cannot run the saved graph: there is no truth to test against
            result.skipped.append((name, f"eager fails on it ({type(e).__name__}: {_first_line(e)})"))
            continue
        sources = dict(sources) or _sources_from_traces(gm)
        try:
            symbols = node_symbols(gm, inputs)
        except Exception as e:  # noqa: BLE001 - the symbolic graph cannot be rebuilt: its tests would be static
            result.skipped.append((name, f"its symbolic sizes cannot be rebuilt ({type(e).__name__}: "
                                         f"{_first_line(e)}); a static test would not test the compiled graph"))
            continue
        for kernel, nodes in kernels.items():
            test, text = _render(gm, values, name, kind, kernel, nodes, sources, tensors, out_dir, context or {},
                                 symbols)
            if test is None:
                result.skipped.append((f"{name}/{kernel}", text))
                continue
            files[test.path] = text
            result.tests.append(test)
    runner = {os.path.join(out_dir, RUNNER): _runner_text()} if files else {}
    _write_all(out_dir, files, tensors, runner)
    return result


# ---------------------------------------------------------------- which nodes each kernel computes

def kernel_map(gm, inputs, name: str, kind: str) -> dict:
    """kernel name -> its FX node names (graph order), from compiling a static copy of `gm`."""
    import torch

    from tdbg.compiler import compile_aten, config, specialize
    static = specialize(gm, list(inputs))
    for node in [n for n in static.graph.nodes if n.op == "placeholder" and not n.users]:
        if not isinstance(node.meta.get("val"), torch.Tensor):   # a scalar input, baked in by specialize
            static.graph.erase_node(node)
    static.recompile()
    args = [x.detach() for x in inputs if isinstance(x, torch.Tensor)]
    if len(args) != sum(1 for n in static.graph.nodes if n.op == "placeholder"):   # a scalar input still read
        args = [x.detach() if isinstance(x, torch.Tensor) else x for x in inputs]
    cfg = config.current().replace(inject_bug=None)   # the partition of a healthy compiler
    compiled = compile_aten(static, args, cfg, graph_name=f"kernel_map_{name}", kind=kind)
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    return {k: sorted((n for n in nodes if n in order), key=order.get)
            for k, nodes in compiled.kernel_nodes.items()}


def eager_values(gm, inputs) -> dict:
    """FX node name -> its eager value (tensors cloned when the graph mutates anything)."""
    import torch
    mutates = any(getattr(getattr(n.target, "_schema", None), "is_mutable", False) for n in gm.graph.nodes)
    values: dict = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n.name] = out.detach().clone() if mutates and isinstance(out, torch.Tensor) else out
            return out
    with torch.no_grad():
        Recorder(gm).run(*[x.detach() if isinstance(x, torch.Tensor) else x for x in inputs])
    return values


def node_symbols(gm, inputs) -> dict:
    """FX node name -> the symbols of its value's sizes (graph_io.symbolic_dims: per dim the size's
    expression as text, or None) for a graph whose placeholders carry recorded symbols
    (runtime.DYNAMIC_META); {} for a static graph. The graph is propagated on fakes of `inputs`
    with those symbols (runtime.symbolic_inputs), and the new ShapeEnv's symbols are written back
    with the recorded names, so a test's DYNAMIC uses the saved graph's symbols."""
    import sympy
    import torch
    from tdbg.compiler.torch_compat import FakeTensorProp

    from tdbg.minifier.artifacts.graph_io import symbolic_dims
    from tdbg.repro_templates.runtime import dynamic_dims, fresh, symbolic_inputs
    dims = dynamic_dims(gm, {})
    if not dims:
        return {}
    mode, fakes, _ = symbolic_inputs(fresh(list(inputs)), dims)
    names = {}     # this ShapeEnv's symbol -> the recorded one it stands for
    for fake, recorded in zip(fakes, dims):
        sizes = tuple(fake.shape) if isinstance(fake, torch.Tensor) else (fake,)
        for size, text in zip(sizes, recorded or ()):
            if text and text.isidentifier() and isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                names.setdefault(size.node.expr, sympy.Symbol(text, integer=True, positive=True))
    propagated = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))     # gm's own nodes' meta stay untouched
    with mode:
        FakeTensorProp(propagated, mode).propagate_dont_convert_inputs(*fakes)
    out = {}
    for node in propagated.graph.nodes:
        value = node.meta.get("val")
        if symbolic_dims(value):
            sizes = tuple(value.shape) if isinstance(value, torch.Tensor) else (value,)
            out[node.name] = tuple(str(d.node.expr.xreplace(names)) if isinstance(d, torch.SymInt)
                                   and d.node.expr.free_symbols else None for d in sizes)
    return out


def _is_view(node) -> bool:
    target = node.target
    return node.op == "call_function" and (getattr(target, "is_view", False)
                                           or getattr(target, "__name__", "").split(".")[0] in _VIEW_LIKE)


def _is_fill(node, values: dict) -> bool:
    """A call that makes a tensor from constants and sizes alone (full, zeros, arange), drawing
    nothing: its eager value is a tensor and its inputs' are plain numbers (sizes)."""
    import torch
    from tdbg.minifier.diagnose.same_draws import draws_random
    return (node.op == "call_function" and isinstance(values.get(node.name), torch.Tensor)
            and not draws_random(node)
            and all(type(values.get(a.name)) in (int, float, bool) for a in node.all_input_nodes))


def kernel_nodes(gm, names, values: dict) -> tuple:
    """(the nodes a kernel's test computes, in graph order; those among them it only reads
    through, never outputs: views of its inputs, fills it reads (_is_fill); [(node, why)] left to
    eager). `values`: each node's eager value, by name."""
    from tdbg.minifier.diagnose.same_draws import draws_random
    by_name = {n.name: n for n in gm.graph.nodes}
    own = [by_name[n] for n in names if by_name.get(n) is not None and by_name[n].op == "call_function"]
    not_tested = [(n.name, "draws random numbers; its eager value is an input") for n in own if draws_random(n)]
    chosen = {n for n in own if not draws_random(n)}
    chosen = {n for n in chosen if not (n.target is operator.getitem and n.args[0] not in chosen)}
    chosen |= {u for n in chosen for u in n.users if u.target is operator.getitem}
    # views between two of the kernel's nodes (e.g. a fused value expanded and read back)
    below = _reach(chosen, lambda n: n.users)
    above = _reach(chosen, lambda n: n.all_input_nodes)
    chosen |= {n for n in below & above if n.op == "call_function" and not draws_random(n)}
    # fills made from constants alone (a zero fill an index_put accumulates into) are made again
    # in the test: a lowering may depend on its operand being made in the graph (an input there
    # would send index_put_accumulate to aten, leaving the test no kernel to check)
    through: set = {a for n in chosen for a in n.all_input_nodes if a not in chosen and _is_fill(a, values)}
    # chains of views the kernel reads through: the kernel indexes their base buffers
    frontier = [a for n in chosen for a in n.all_input_nodes if a not in chosen and _is_view(a)]
    while frontier:
        v = frontier.pop()
        if v not in chosen and v not in through:
            through.add(v)
            frontier += [a for a in v.all_input_nodes if a not in chosen and _is_view(a)]
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    return sorted(chosen | through, key=order.get), through, not_tested


def _reach(start, step) -> set:
    seen, todo = set(), [x for n in start for x in step(n)]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += step(n)
    return seen


def subgraph(gm, nodes, values: dict, through=(), symbolic=()):
    """(fx.GraphModule of `nodes`, input names, output names). Inputs: tensors made outside, and
    int sizes made outside whose node is in `symbolic` (a size of the symbolic graph, e.g. a
    view's 2*s27: a constant would pin the symbols when the test compiles symbolic); another plain
    value made outside is written in as a constant. Outputs: the nodes used outside `nodes`, except
    the nodes in `through` (views of inputs and fills it reads, not the kernel's)."""
    import torch
    graph, env, inputs = torch.fx.Graph(), {}, []
    chosen = set(nodes)

    def arg(a):
        if a in env:
            return env[a]
        value = values[a.name]
        if isinstance(value, torch.Tensor) or (type(value) is int and a.name in symbolic):
            env[a] = graph.placeholder(a.name)
            inputs.append(a.name)
            return env[a]
        if isinstance(value, (int, float, bool)) or value is None:
            return value
        raise ValueError(f"it reads {a.name}, a {type(value).__name__} made outside the kernel")
    for node in nodes:
        for a in node.all_input_nodes:
            if a not in chosen:
                arg(a)
    for node in nodes:
        env[node] = graph.node_copy(node, lambda a: env[a] if a in env else arg(a))
        env[node].meta = {}
    outputs = [n for n in nodes if isinstance(values.get(n.name), torch.Tensor) and n not in through
               and any(u not in chosen for u in n.users)]
    graph.output(tuple(env[n] for n in outputs))
    graph.lint()
    return torch.fx.GraphModule(torch.nn.Module(), graph), inputs, [n.name for n in outputs]


# ---------------------------------------------------------------- rendering

def _render(gm, values, graph_name, kind, kernel, names, sources, tensors, out_dir, context, symbols=None):
    """(KernelTest, file text), or (None, why not). `symbols`: node_symbols of the graph."""
    from tdbg.minifier.artifacts.graph_io import imports_for, module_source, tensor_bytes
    nodes, through, not_tested = kernel_nodes(gm, names, values)
    if not nodes:
        return None, "none of its nodes can be computed alone (only random draws)"
    try:
        sub, input_names, output_names = subgraph(gm, nodes, values, through, symbols or {})
    except ValueError as e:
        return None, f"no test: {e}"
    if not output_names:
        return None, "no test: none of its values is used outside it"

    def rows(names_):
        out = []
        for n in names_:
            t = values[n]
            if type(t) is int:     # a symbolic size: (name, None, its value, None, "int")
                out.append((n, None, t, None, "int"))
                continue
            data = tensor_bytes(t)
            sha = hashlib.sha256(data).hexdigest()
            tensors.setdefault(sha, data)
            out.append((n, sha, tuple(t.shape), tuple(t.stride()), str(t.dtype).replace("torch.", "")))
        return out
    fx_nodes = [(n.name, sources.get(n.name, "")) for n in nodes]
    # the kernel's place: its earliest own node's line (as the compiler names a failing kernel's)
    own = set(names)
    first = next((s for n, s in fx_nodes if s and n in own), "") or next((s for _, s in fx_nodes if s), "")
    lines = list(dict.fromkeys(s for _, s in fx_nodes if s))
    ident = re.sub(r"\W", "_", f"{graph_name}__{kernel}")
    file_name = f"test_{ident}.py"
    node_list = ", ".join(n for n, _ in fx_nodes)
    summary = (f"Kernel {kernel} of graph {graph_name} ({kind}) computes FX nodes {node_list}; "
               f"source: {first or 'unknown (no stack trace saved)'}.")
    doc = [f"tdbg kernel test: {kernel} of {graph_name} ({kind} graph of {context.get('script', '?')}).", "",
           summary, "", "User source lines of its nodes:"] + [f"    {s}" for s in lines or ["(none saved)"]]
    if not_tested:
        doc += ["", "Not computed here (eager values are inputs): " + ", ".join(f"{n} ({why})" for n, why in not_tested)]
    fields = {
        "docstring": _doc_text("\n".join(doc)), "test_doc": _doc_text(summary), "file_name": file_name,
        "tdbg_version": _version("tdbg"), "torch_version": _version("torch"),
        "kernel_repr": repr(kernel), "graph_repr": repr(graph_name),
        "kind_repr": repr(kind), "graph_name_repr": repr(f"kernel_test_{ident}"),
        "imports": imports_for(sub.graph), "module": module_source(sub.graph).rstrip("\n"),
        "fx_nodes": _literal(fx_nodes), "not_tested": _literal(not_tested),
        "inputs": _literal(rows(input_names)), "expected": _literal(rows(output_names)),
        "dynamic": _literal({n: (symbols or {})[n] for n in input_names if (symbols or {}).get(n)}),
        "test_name": re.sub(r"\W", "_", kernel),
    }
    text = _template().substitute(fields)
    from tdbg.compiler.ops import op_name
    test = KernelTest(graph_name, kernel, os.path.join(out_dir, file_name), [n for n, _ in fx_nodes],
                      sorted({op_name(n.target) for n in nodes}), first,
                      len(input_names), len(output_names))
    return test, text


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0]   # whole: a cut line may lose the part that helps


def _template() -> string.Template:
    return string.Template(resources.files("tdbg.repro_templates").joinpath(TEMPLATE).read_text())


def _runner_text() -> str:
    return resources.files("tdbg.repro_templates").joinpath(f"{RUNNER}.tmpl").read_text()


def _doc_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', "'''")


def _literal(value) -> str:
    return pprint.pformat(value, width=110)


def _version(dist: str) -> str:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _sources_from_traces(gm) -> dict:
    """FX node name -> "file:line in fn: code" of its innermost user frame (checks.node_source)."""
    from tdbg.minifier.diagnose.checks import node_source
    from tdbg.minifier.runs.instrument import is_user_file
    return {n.name: line for n in gm.graph.nodes if (line := node_source(n, is_user_file))}


# ---------------------------------------------------------------- writing

def _write_all(out_dir: str, files: dict, tensors: dict, same_or_new: Optional[dict] = None) -> None:
    """Check every path, then write: nothing is overwritten, nothing half-written on refusal.
    `same_or_new` (path -> text): files kept when they already hold that text (the runner)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise KernelTestsError(f"{out_dir!r} exists and is not a folder; give a new or empty folder for the "
                               "kernel tests.")
    taken = [p for p in files if os.path.exists(p)]
    if taken:
        raise KernelTestsError(f"{taken[0]} already exists ({len(taken)} of the {len(files)} test files do); "
                               "kernel tests never overwrite files. Give a new or empty folder.")
    for path, text in (same_or_new or {}).items():
        if os.path.exists(path) and (not os.path.isfile(path) or open(path, "rb").read() != text.encode()):
            raise KernelTestsError(f"{path} already exists with other contents; kernel tests never overwrite "
                                   "files. Give a new or empty folder.")
    folder = os.path.join(out_dir, TENSORS)
    for sha in tensors:
        path = os.path.join(folder, f"{sha}.bin")
        if os.path.exists(path) and _file_sha(path) != sha:
            raise KernelTestsError(f"{path} already exists with other bytes than its SHA-256 name says; "
                                   "kernel tests never overwrite files. Give a new or empty folder.")
    os.makedirs(folder, exist_ok=True)
    for sha, data in tensors.items():
        _atomic_write(os.path.join(folder, f"{sha}.bin"), data, keep_existing=True)
    for path, text in files.items():
        _atomic_write(path, text.encode(), keep_existing=False)
    for path, text in (same_or_new or {}).items():
        _atomic_write(path, text.encode(), keep_existing=True)


def _file_sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _atomic_write(path: str, data: bytes, *, keep_existing: bool) -> None:
    if keep_existing and os.path.exists(path):
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
