"""compiler/'s imports run one way: no module imports a module that (directly or through others)
imports it back, and every module imports only modules listed before it in LAYERS, the
pipeline's order from the bottom up (docs/architecture.md states the same order).

The graph is read from the source with `ast`, nothing is imported. An import inside a function
(a lazy import, run at first call) counts like one at module level: a reader following it meets
the same circle. The lazy imports left all go down, and keep `import tdbg.compiler` (and its
provenance constants, which the report renderer reads) torch-free: __init__'s stages, trace's
provenance, provenance's IR, scheduler and codegen names, torch_compat where first used. Run this
file as a script to print the graph, its import circles and any import against LAYERS:

    python tests/compiler/test_layers.py
"""
import ast
import os
import sys
import textwrap

COMPILER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "compiler")
PACKAGE = "tdbg.compiler"
INIT = "__init__"

# (stage, its modules), bottom first: a module may import only modules listed before it (in an
# earlier stage or earlier in its own). A new module of compiler/ gets its place here.
LAYERS = (
    ("foundations: import nothing of compiler/", ("logs", "errors", "toolchain", "torch_compat", "ir")),
    ("values computed from weights, kept per set of weight tensors", ("weight_cache",)),
    ("configuration and op tables", ("config", "ops", "decompositions")),
    ("graph passes before lowering", ("layout", "concat_linears", "hoist", "linear_gelu", "bias_epilogue")),
    ("lowering: aten graph -> loop IR", ("lowering_common", "lowering_reductions", "lowering_data",
                                         "lowering_random", "lowering_index", "lowering_shape", "lowering_scan",
                                         "lowering_math", "lowering_pool", "lowering")),
    ("scheduling", ("merge_loops", "scheduler")),
    ("C++ code generation", ("codegen_loops", "codegen_segments", "codegen_reduction", "codegen_cpp")),
    ("output code and build", ("aten_calls", "prepack", "build", "wrapper")),
    ("debug output", ("debug_files", "provenance", "trace")),
    ("the pipeline: compile_fx, compile_aten", (INIT,)),
)
# What the bottom modules import, exactly: logging, errors, the toolchain probe, torch access and
# the IR import nothing of compiler/, config only the log channels and the toolchain probe.
BOTTOM = {"logs": set(), "errors": set(), "toolchain": set(), "torch_compat": set(), "ir": set(),
          "config": {"logs", "toolchain"}}


def modules(package_dir: str) -> list:
    """The package's modules by name (`__init__` for the package itself), sorted."""
    return sorted(f[:-3] for f in os.listdir(package_dir) if f.endswith(".py"))


def _targets(node, names: set) -> set:
    """The package modules one import statement names; an imported name that is not a module
    (`from . import compile_aten`) is the package's `__init__`."""
    if isinstance(node, ast.Import):
        full = [a.name for a in node.names if a.name.startswith(PACKAGE + ".")]
        return {f[len(PACKAGE) + 1:].split(".")[0] for f in full} & names
    if node.level == 0:
        if node.module is None or not (node.module + ".").startswith(PACKAGE + "."):
            return set()
        base = node.module[len(PACKAGE):].lstrip(".")
    elif node.level == 1:
        base = node.module or ""
    else:                        # `from .. import`: outside the package
        return set()
    if base:
        return {base.split(".")[0]} & names
    return {a.name if a.name in names else INIT for a in node.names}


def import_graph(package_dir: str) -> dict:
    """{module: {"module": set of package modules it imports at module level (also inside a class
    body, an `if` or a `try`: run at import), "lazy": set it imports inside a function}}."""
    names = set(modules(package_dir))
    graph = {}
    for name in sorted(names):
        with open(os.path.join(package_dir, name + ".py")) as f:
            tree = ast.parse(f.read(), filename=name + ".py")
        edges = {"module": set(), "lazy": set()}

        def visit(node, lazy):
            for child in ast.iter_child_nodes(node):
                inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    edges["lazy" if lazy else "module"].update(_targets(child, names) - {name})
                visit(child, inner)

        visit(tree, False)
        edges["lazy"] -= edges["module"]
        graph[name] = edges
    return graph


def edges_of(graph: dict, kinds=("module", "lazy")) -> dict:
    """{module: set of modules it imports} over the given kinds of import."""
    return {m: set().union(*(e[k] for k in kinds)) for m, e in graph.items()}


def circles(edges: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted, sorted:
    every module of one imports every other, directly or through the others."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))
    for v in sorted(edges):
        if v not in index:
            connect(v)
    return sorted(found)


def order_violations(graph: dict, order: list) -> list:
    """(module, imported, "module" or "lazy") for each import of a module not listed before it."""
    rank = {m: i for i, m in enumerate(order)}
    return sorted((m, t, kind) for m, e in graph.items() for kind in ("module", "lazy")
                  for t in e[kind] if rank[t] >= rank[m])


def layer_order() -> list:
    return [m for _, ms in LAYERS for m in ms]


def test_compiler_has_no_import_circle():
    graph = import_graph(COMPILER)
    found = circles(edges_of(graph))
    inside = {m for c in found for m in c}
    assert found == [], {m: {k: e[k] & inside for k in e} for m, e in graph.items() if m in inside}


def test_every_module_imports_only_modules_below_it():
    order = layer_order()
    assert sorted(order) == modules(COMPILER), "LAYERS must list every module of compiler/ once"
    assert order_violations(import_graph(COMPILER), order) == []


def test_bottom_modules_import_nothing_higher():
    graph = edges_of(import_graph(COMPILER))
    assert {m: graph[m] for m in BOTTOM} == BOTTOM


def _package(tmp_path, files: dict) -> str:
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    return str(tmp_path)


def test_the_graph_and_its_circles_on_a_synthetic_package(tmp_path):
    """The checks above can fail: a lazy import back up is a circle, every spelling counts."""
    pkg = _package(tmp_path, {
        INIT: "from .a import run\n",
        "a": """\
            from . import b
            from tdbg.compiler.c import thing
            from .. import outside

            def run():
                return b.f()
            """,
        "b": """\
            import os

            def f():
                from .a import run          # lazy, back up to a
                from . import helper        # a name of the package: its __init__
                return run
            """,
        "c": """\
            import tdbg.compiler.d
            if os.environ:
                from .d import x
            """,
        "d": "class K:\n    from . import c\n",
    })
    graph = import_graph(pkg)
    assert graph == {
        INIT: {"module": {"a"}, "lazy": set()},
        "a": {"module": {"b", "c"}, "lazy": set()},
        "b": {"module": set(), "lazy": {"a", INIT}},
        "c": {"module": {"d"}, "lazy": set()},
        "d": {"module": {"c"}, "lazy": set()},
    }
    assert circles(edges_of(graph, ("module",))) == [["c", "d"]]
    assert circles(edges_of(graph)) == [[INIT, "a", "b"], ["c", "d"]]
    assert order_violations(graph, ["d", "c", "b", "a", INIT]) == [
        ("b", INIT, "lazy"), ("b", "a", "lazy"), ("d", "c", "module")]


def main() -> None:
    graph = import_graph(COMPILER)
    for name, e in graph.items():
        print(f"{name:22} module: {' '.join(sorted(e['module'])) or '-'}")
        if e["lazy"]:
            print(f"{'':22} lazy:   {' '.join(sorted(e['lazy']))}")
    print("circles (module-level imports):", circles(edges_of(graph, ("module",))) or "none")
    print("circles (module-level and lazy imports):", circles(edges_of(graph)) or "none")
    print("imports of a module not listed before it in LAYERS:", order_violations(graph, layer_order()) or "none")


if __name__ == "__main__":
    main()
