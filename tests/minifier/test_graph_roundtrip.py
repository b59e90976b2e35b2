"""Graph -> source -> graph on the graphs Dynamo makes that no symbolic re-tracing can rebuild:
functorch transforms (jacfwd, vmap, grad), writes into views and slices, higher-order ops with
subgraphs (torch.cond, activation checkpointing). The graph read back has the same nodes (op,
name, target, arguments) and computes the same values; the minifier's edits keep them runnable."""
import operator

import pytest
import torch
import torch.fx as fx

from tdbg.minifier.artifacts.graph_io import TensorStore, case_source, from_graph_module, trace_source
from tdbg.minifier.reduce import surgery
from tdbg.repro_templates.runtime import GraphSourceError


def dynamo_graph(fn, *args):
    """The one graph Dynamo makes of fn(*args), as a Case (and its store)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend, fullgraph=True)(*args)
    assert len(graphs) == 1
    store = TensorStore()
    return from_graph_module(*graphs[0], store), store


def nodes(gm):
    """Every node of gm and of its subgraphs: (op, name, target, args, kwargs)."""
    rows = [(n.op, n.name, n.target, repr(n.args), repr(n.kwargs)) for n in gm.graph.nodes]
    for name, sub in gm.named_children():
        rows += [(name,) + row for row in nodes(sub)]
    return rows


def _jacfwd(x):
    return torch.func.jacfwd(lambda y: torch.sum(torch.mm(torch.prod(y) + y, torch.sum(y) + y)))(x)


def _vmap(x, w):
    return torch.vmap(lambda r: torch.sin(r @ w).sum())(x)


def _grad(x):
    return torch.func.grad(lambda y: (torch.sin(y) * y).sum())(x)


def _slice_writes(x):
    x = x.permute(2, 1, 0)
    x[0] += 1
    x[0] = x[0].t()
    x[1, :, 0] = 7.0
    return x


def _cond(x):
    return torch.cond(x.sum() > 0, lambda y: torch.sin(y) + 1, lambda y: y.cos() - 1, (x,))


def _checkpoint(x):
    return torch.utils.checkpoint.checkpoint(lambda y: torch.sin(y) * 2, x, use_reentrant=False)


X = torch.arange(1.0, 13.0).reshape(4, 3) / 10
GRAPHS = {
    "jacfwd": (_jacfwd, (torch.arange(1.0, 10.0).reshape(3, 3) / 10,),
               {torch._functorch.predispatch._add_batch_dim, torch._functorch.predispatch._make_dual}),
    "vmap": (_vmap, (X, torch.ones(3, 3)), {torch._functorch.predispatch._remove_batch_dim}),
    "grad": (_grad, (X,), {torch._C._functorch._wrap_for_grad, torch._functorch.eager_transforms._autograd_grad}),
    "slice_writes": (_slice_writes, (torch.arange(8.0).reshape(2, 2, 2),), {operator.setitem, operator.iadd}),
    "cond": (_cond, (X,), {torch.ops.higher_order.cond}),
    "checkpoint": (_checkpoint, (X,), {torch.ops.higher_order.tag_activation_checkpoint}),
}


@pytest.mark.parametrize("kind", list(GRAPHS))
def test_round_trip_gives_the_same_nodes_and_values(kind):
    fn, args, targets = GRAPHS[kind]
    case, store = dynamo_graph(fn, *args)
    back = trace_source(case_source(case))
    assert nodes(back) == nodes(case.gm)
    assert targets <= {n.target for n in back.graph.nodes}
    expected, actual = case.gm(*store.values(case.inputs)), back(*store.values(case.inputs))
    assert len(expected) == len(actual) and all(torch.equal(a, b) for a, b in zip(expected, actual))
    assert torch.equal(actual[0], fn(*[a.clone() for a in args]))


def test_higher_order_bodies_are_classes_set_in_init():
    case, _ = dynamo_graph(_cond, X)
    source = case_source(case)
    assert "class Repro_cond_true_0(torch.nn.Module):" in source
    assert "        self.cond_true_0 = Repro_cond_true_0()\n        self.cond_false_0 = Repro_cond_false_0()" in source
    assert [n.op for n in case.gm.graph.nodes].count("get_attr") == 2 and case.num_inputs == 1


def test_a_statement_fx_does_not_write_is_named_with_its_line():
    source = ("import torch\n\n\nclass Repro(torch.nn.Module):\n    def forward(self, x):\n"
              "        y = torch.sin(x)\n        if y.sum() > 0:\n            y = y + 1\n        return (y,)\n")
    with pytest.raises(GraphSourceError) as e:
        trace_source(source, "graph.py")
    assert str(e.value) == "graph.py:7: `if y.sum() > 0:`: a If statement, which FX graphs do not contain"


def test_dead_code_elimination_keeps_writes_and_functorch_levels():
    case, store = dynamo_graph(_jacfwd, torch.arange(1.0, 10.0).reshape(3, 3) / 10)
    kept = surgery.eliminate_dead_code(case)
    # `diagonal.fill_(1)` writes the identity into the tangents' buffer; _vmap_increment_nesting
    # enters the level _add_batch_dim uses: neither has users, and FX's own rule drops both
    plain = fx.Graph()
    plain.output(plain.graph_copy(case.gm.graph, {}))
    plain.eliminate_dead_code()
    assert {"fill_", "_vmap_increment_nesting"} <= {n.name for n in case.gm.graph.nodes} - {n.name for n in plain.nodes}
    assert [n.name for n in kept.gm.graph.nodes] == [n.name for n in case.gm.graph.nodes]
    assert torch.equal(kept.gm(*store.values(kept.inputs))[0], case.gm(*store.values(case.inputs))[0])


def test_keeping_a_subset_keeps_the_state_calls_and_the_bodies_it_needs():
    case, store = dynamo_graph(_vmap, X, torch.ones(3, 3))
    values = surgery.record_values(case, store)
    compute = ["_add_batch_dim", "matmul", "sin", "batched_outputs", "_remove_batch_dim"]
    sub = surgery.keep_only(case, compute, values, store)
    assert [n.name for n in sub.gm.graph.nodes if n.op not in ("placeholder", "output")] == (
        ["lazy_load_decompositions", "_vmap_increment_nesting"] + compute + ["_vmap_decrement_nesting"])
    assert torch.equal(sub.gm(*store.values(sub.inputs))[0], _vmap(X, torch.ones(3, 3)))
    # matmul's value is batched inside the vmap level: never an input of a smaller graph
    assert surgery.keep_only(case, compute[2:], values, store) is None
    cond, cstore = dynamo_graph(_cond, X)
    only_cond = surgery.keep_only(cond, ["cond", "getitem"], surgery.record_values(cond, cstore), cstore)
    assert [(n.op, n.name) for n in only_cond.gm.graph.nodes] == [
        ("placeholder", "l_x_"), ("placeholder", "gt"), ("get_attr", "cond_true_0"), ("get_attr", "cond_false_0"),
        ("call_function", "cond"), ("call_function", "getitem"), ("output", "output")]
    assert nodes(trace_source(case_source(only_cond))) == nodes(only_cond.gm)


def test_bypass_on_a_cond_graph_keeps_its_bodies():
    case, store = dynamo_graph(lambda x: _cond(x.abs()).neg(), X)
    bypassed = surgery.bypass(case, "abs_1", "l_x_")
    assert bypassed is not None and hasattr(bypassed.gm, "cond_true_0")
    assert torch.equal(bypassed.gm(*store.values(bypassed.inputs))[0], _cond(X).neg())
