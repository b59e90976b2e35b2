"""Graph edits the minifier's passes are made of. Each returns a new Case (or None when the edit
cannot produce a valid graph); the Case it was given is never modified.

Nodes are referred to by name: names survive every edit here, so a pass can keep a list of
names across candidates.
"""
from __future__ import annotations

import numbers
import operator
from typing import Callable, Iterable, Optional

import torch
import torch.fx as fx

from tdbg.minifier.artifacts.graph_io import Case, InputSpec, TensorStore, duck_dims


def record_values(case: Case, store: TensorStore) -> dict:
    """name -> value of every node when the graph runs eagerly on its inputs (detached)."""
    values = {}

    class Recorder(fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n.name] = _detach(out)
            return out

    with torch.no_grad():
        Recorder(case.gm).run(*store.values(case.inputs))
    return values


def _detach(v):
    if isinstance(v, torch.Tensor):
        return v.detach()
    if isinstance(v, (list, tuple)):
        return type(v)(_detach(x) for x in v)
    return v


def is_input_value(v) -> bool:
    """Can this recorded value become a graph input? (tensors and plain numbers; not a tensor
    inside a functorch transform, which only means something at the transform's level)"""
    if isinstance(v, torch.Tensor):
        from tdbg.compiler.torch_compat import is_functorch_wrapped_tensor
        return not is_functorch_wrapped_tensor(v)
    return isinstance(v, numbers.Number)


# Calls Dynamo records for what they do to torch's state, not for a value (functorch's transform
# levels, forward-AD levels, grad mode, saved-tensor hooks): their results have no users, and
# dropping one breaks the calls after it (an `_add_batch_dim` at a level never entered).
_STATE_CALLS = ("torch._C._functorch.", "torch._functorch.", "torch._C._autograd.", "torch.autograd.",
                "torch._C._set_", "torch.amp.")
_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                      operator.imod, operator.ipow, operator.ilshift, operator.irshift, operator.iand,
                      operator.ior, operator.ixor, operator.imatmul, operator.setitem}


def has_effect(node: fx.Node) -> bool:
    """Whether dead-code elimination must keep `node` though nothing reads its result: FX's own
    rule, plus writes (in-place methods such as `fill_` on a view, `x[0] = y`, `y += 1`, mutating
    aten overloads) and functorch/autograd state calls (_STATE_CALLS)."""
    if node.is_impure():
        return True
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.endswith("__")
    if node.op != "call_function":
        return False
    target = node.target
    if target in _INPLACE_OPERATORS or getattr(getattr(target, "_schema", None), "is_mutable", False):
        return True
    return _qualified(target).startswith(_STATE_CALLS)


def is_state_call(node: fx.Node) -> bool:
    """A functorch/autograd state call (_STATE_CALLS) whose result nothing reads: it is there for
    what it does (enter or leave a vmap/grad/dual level), so edits keep it with the graph (an
    entered level that is never left would change every later op in the process)."""
    return node.op == "call_function" and not node.users and _qualified(node.target).startswith(_STATE_CALLS)


def _qualified(target) -> str:
    return f"{getattr(target, '__module__', None) or ''}.{getattr(target, '__name__', '')}"


def output_nodes(case: Case) -> list:
    out = next(n for n in reversed(case.gm.graph.nodes) if n.op == "output")
    return list(out.args[0])


def finish(case: Case, graph: fx.Graph, extra: Iterable = ()) -> Optional[Case]:
    """Drop placeholders nobody uses and pair the rest with their specs (old ones or `extra`)."""
    specs = {s.name: s for s in case.inputs}
    # a value turned into an input keeps the graph's symbolic sizes (matched by size)
    specs.update({s.name: duck_dims(s, case.inputs) for s in extra})
    for node in [n for n in graph.nodes if n.op == "placeholder"]:
        if not node.users:
            graph.erase_node(node)
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    if not any(isinstance(o, fx.Node) for o in out.args[0]):
        return None
    inputs = tuple(specs[n.name] for n in graph.nodes if n.op == "placeholder")
    return case.derive(graph, inputs)


def copy_graph(case: Case) -> tuple:
    """(graph copy, old-name -> new node)."""
    graph = fx.Graph()
    env = {}
    for node in case.gm.graph.nodes:
        if node.op == "output":
            graph.output(fx.node.map_arg(node.args[0], lambda n: env[n]))
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    return graph, {old.name: new for old, new in env.items()}


def keep_only(case: Case, keep: Iterable[str], values: dict, store: TensorStore) -> Optional[Case]:
    """Only the compute nodes named in `keep` stay. A value they read from a dropped node becomes
    an input holding its recorded value; kept nodes whose result nobody kept reads become
    outputs (so nothing kept is dead). None when a dropped value cannot be an input."""
    nodes = list(case.gm.graph.nodes)
    keep = set(keep) - {n.name for n in nodes if is_state_call(n)}
    if not any(n.name in keep and n.op not in ("placeholder", "output") for n in nodes):
        return None
    keep |= {n.name for n in nodes if is_state_call(n)}
    # a kept higher-order op keeps the get_attr of its bodies (a GraphModule is no input value)
    keep |= {a.name for n in nodes if n.name in keep for a in n.all_input_nodes if a.op == "get_attr"}
    kept = [n for n in nodes if n.name in keep and n.op not in ("placeholder", "output")]
    graph, env, extra = fx.Graph(), {}, []
    needed = {a for n in kept for a in n.all_input_nodes}
    for node in nodes:
        if node.op == "placeholder" and node in needed:
            env[node] = graph.placeholder(node.name)
    for node in nodes:
        if node in needed and node.op != "placeholder" and node.name not in keep:
            value = values.get(node.name)
            if not is_input_value(value):
                return None
            env[node] = graph.placeholder(node.name)
            extra.append(store.spec(node.name, value))
    for node in kept:
        env[node] = graph.node_copy(node, lambda n: env[n])
    kept_set = set(kept)
    outs = [o for o in output_nodes(case) if isinstance(o, fx.Node) and o in kept_set]
    sinks = [n for n in kept if not (set(n.users) & kept_set) and n not in outs and not is_state_call(n)
             and is_input_value(values.get(n.name, torch.empty(0)))]
    graph.output(tuple(env[n] for n in outs + sinks))
    return finish(case, graph, extra)


def replace_with_input(case: Case, name: str, values: dict, store: TensorStore) -> Optional[Case]:
    """Node `name` becomes an input holding its recorded value; what only fed it disappears."""
    value = values.get(name)
    if not is_input_value(value):
        return None
    graph, env = copy_graph(case)
    node = env[name]
    first = next(iter(graph.nodes))
    with graph.inserting_before(first):
        ph = graph.placeholder(f"{name}_in")
    node.replace_all_uses_with(ph)
    graph.erase_node(node)
    graph.eliminate_dead_code(is_impure_node=has_effect)
    _placeholders_first(graph)
    return finish(case, graph, [store.spec(f"{name}_in", value)])


def bypass(case: Case, name: str, operand: str) -> Optional[Case]:
    """Node `name` is removed and its users read `operand` instead (same shape and dtype)."""
    graph, env = copy_graph(case)
    env[name].replace_all_uses_with(env[operand])
    graph.erase_node(env[name])
    graph.eliminate_dead_code(is_impure_node=has_effect)
    return finish(case, graph)


def drop_outputs(case: Case, drop: set) -> Optional[Case]:
    """Remove the outputs at the given positions; what only fed them disappears."""
    graph, env = copy_graph(case)
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    kept = tuple(o for i, o in enumerate(out.args[0]) if i not in drop)
    out.args = (kept,)
    graph.eliminate_dead_code(is_impure_node=has_effect)
    return finish(case, graph)


def eliminate_dead_code(case: Case) -> Case:
    graph, _ = copy_graph(case)
    graph.eliminate_dead_code(is_impure_node=has_effect)
    return case.derive(graph, case.inputs)


def drop_unused_inputs(case: Case) -> Optional[Case]:
    graph, _ = copy_graph(case)
    return finish(case, graph)


def merge_inputs(case: Case, groups: list) -> Optional[Case]:
    """Each group of input names is read through its first member only."""
    graph, env = copy_graph(case)
    for group in groups:
        for other in group[1:]:
            env[other].replace_all_uses_with(env[group[0]])
    return finish(case, graph)


def replace_inputs(case: Case, new_specs: dict) -> Case:
    """Same graph, some inputs (by name) given new specs (e.g. smaller tensors)."""
    return Case(case.gm, tuple(new_specs.get(s.name, s) for s in case.inputs), case.constants)


def _placeholders_first(graph: fx.Graph) -> None:
    nodes = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = next(n for n in graph.nodes if n.op != "placeholder") if len(nodes) < len(graph.nodes) else None
    if anchor is None:
        return
    for node in nodes:
        anchor.prepend(node)


def tensor_meta(values: dict, name: str) -> Optional[tuple]:
    v = values.get(name)
    return (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else None


def names(nodes: Iterable[fx.Node]) -> list:
    return [n.name for n in nodes]


def shrunk(store: TensorStore, spec: InputSpec, sizes: tuple) -> Optional[InputSpec]:
    """`spec`'s tensor cut down to `sizes` (a leading slice in each dim), real values kept."""
    t = store.tensors[spec.key]
    for dim, size in enumerate(sizes):
        t = t.narrow(dim, 0, size)
    t = t.clone(memory_format=torch.contiguous_format)  # fresh strides, also for size-1 dims
    new = store.spec(spec.name, t)
    return InputSpec(new.name, new.sha, new.shape, new.stride, new.dtype, spec.requires_grad, dynamic=spec.dynamic)


Predicate = Callable[[Case], bool]
