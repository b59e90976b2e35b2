"""Graphs with symbolic sizes (torch.compile dynamic=True, or automatic dynamic after a second
size) through the minifier's files and the saved-io folder: which input dims were dynamic is
recorded, and every recompile (minifier query, repro.py, replay, compare) gives the backend the
graph with the same symbolic sizes, not one specialized to the saved sizes. The backend here is
right on static graphs and wrong on symbolic ones past 64 rows, as a size-generic kernel with a
broken vector tail would be: a repro that specialized would say "Not reproduced"."""
import json
import pprint
import subprocess
import sys

import torch

from tdbg.minifier.artifacts.graph_io import (InputSpec, TensorStore, case_source, duck_dims, dynamic_table,
                                              from_graph_module, trace_source)
from tdbg.minifier.artifacts.repro import Dump, load, write
from tdbg.minifier.artifacts.saved_io import Writer, load_graph
from tdbg.minifier.diagnose.replay import replay
from tdbg.minifier.reduce.oracle import evaluate
from tdbg.minifier.reduce.session import with_dynamic
from tdbg.minifier.reduce.surgery import replace_with_input

WRONG_IF_DYNAMIC = '''
def wrong_if_dynamic(gm, example_inputs):
    def symbolic(v):
        return isinstance(v, torch.SymInt) or (
            isinstance(v, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in v.shape))
    metas = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if not any(symbolic(v) for v in metas):
        return gm.forward
    def run(*args):
        return tuple(o + 1 if o.dim() and o.shape[0] > 64 else o for o in gm(*args))
    return run
'''
BACKEND = {"kind": "source", "name": "wrong_if_dynamic", "source": WRONG_IF_DYNAMIC}
SPEC = {"after": "dynamo", "backend": BACKEND, "config": {}, "check_accuracy": True}


def f(x, w):
    return (torch.relu(x @ w).view(x.shape[0], 4) * 2,)


def dynamic_case(rows=100):
    """The Dynamo graph of `f` made with dynamic=True, as a Case with its real inputs."""
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, w = torch.randn(rows, 8), torch.randn(8, 4)
    torch.compile(f, backend=capture, dynamic=True)(x, w)
    gm, example = graphs[-1]
    real = [v.node.hint if isinstance(v, torch.SymInt) else v for v in example]
    store = TensorStore()
    return from_graph_module(gm, real, store), store


def structure(case) -> list:
    """Each input's dynamic tuple with the symbols renamed a, b, ... in order of appearance
    (the ShapeEnv's symbol names are hashes of the sources)."""
    names: dict = {}
    out = []
    for s in case.inputs:
        out.append((s.name, tuple(None if d is None else names.setdefault(d, "abcdefgh"[len(names)]) for d in s.dynamic)))
    return out


def test_a_dynamic_graph_records_which_input_dims_were_symbolic():
    case, _ = dynamic_case()
    # dynamic=True: x's and w's sizes are symbols; x's 8 and w's 8 share one (duck sizing), and
    # Dynamo passes them as int inputs too; w's 4 is static (`view(rows, 4)` specialized it)
    assert [(s.is_tensor, s.shape if s.is_tensor else s.value) for s in case.inputs] == [
        (False, 100), (False, 8), (True, (100, 8)), (True, (8, 4))]
    assert [d for _, d in structure(case)] == [("a",), ("b",), ("a", "b"), ("b", None)]
    table = dynamic_table(case.inputs)
    assert set(table) == {s.name for s in case.inputs}
    assert all(d is None or (isinstance(d, str) and d.startswith("s")) for dims in table.values() for d in dims)


def test_queries_compile_with_the_recorded_symbols_so_a_dynamic_only_bug_reproduces():
    case, store = dynamic_case()
    gm = trace_source(case_source(case))
    inputs = store.values(case.inputs)
    spec = with_dynamic(SPEC, case)
    assert spec["dynamic"] == dynamic_table(case.inputs)
    assert evaluate(gm, inputs, spec).kind == "accuracy"
    # the same graph and inputs compiled static (what every query did before): the bug hides
    assert evaluate(trace_source(case_source(case)), store.values(case.inputs), SPEC).kind == "pass"


def test_symbolic_sizes_stay_where_the_bug_needs_them_and_static_inputs_stay_static():
    case, store = dynamic_case(rows=40)   # 40 rows: below the bug's 64
    spec = with_dynamic(SPEC, case)
    assert evaluate(trace_source(case_source(case)), store.values(case.inputs), spec).kind == "pass"


def test_a_value_turned_into_an_input_gets_the_symbols_of_its_sizes():
    case, store = dynamic_case()
    values = dict(zip([n.name for n in case.gm.graph.nodes],
                      [None] * len(case.gm.graph.nodes)))
    values["matmul"] = torch.randn(100, 4)
    smaller = replace_with_input(case, "matmul", values, store)
    spec = next(s for s in smaller.inputs if s.name == "matmul_in")
    symbols = dict(structure(case))
    named = {s.name: s for s in case.inputs}
    # 100 is x's row symbol; 4 is static
    assert spec.dynamic == (named["l_x_"].dynamic[0], None)
    assert symbols["l_x_"][0] == "a"
    # sizes no symbol has, and graphs without symbols, add none
    assert duck_dims(InputSpec("t", "x", (3, 5), (5, 1), "torch.float32"), case.inputs).dynamic == ()
    assert duck_dims(InputSpec("t", "x", (100,), (1,), "torch.float32"), ()).dynamic == ()


def test_repro_py_records_dynamic_and_reproduces_in_a_fresh_process(tmp_path):
    case, store = dynamic_case()
    write(str(tmp_path / "r"), Dump(case, store, SPEC, {"kind": "accuracy"}, title="dynamic graph"))
    text = (tmp_path / "r" / "repro.py").read_text()
    assert "DYNAMIC = " + pprint.pformat(dynamic_table(case.inputs), width=100, sort_dicts=True) in text
    assert [s.dynamic for s in load(str(tmp_path / "r")).case.inputs] == [s.dynamic for s in case.inputs]
    run = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path / "r", capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 16, run.stdout + run.stderr
    assert run.stdout.startswith("Reproduced: accuracy mismatch in out[0]")


def save_dynamic_graph(folder, replay_spec) -> tuple:
    """(case, saved graph): the dynamic Dynamo graph saved as --save-io saves its second call,
    its placeholders carrying the fake values Dynamo leaves on a graph with symbolic sizes."""
    from tdbg.repro_templates.runtime import symbolic_inputs
    case, store = dynamic_case()
    gm = trace_source(case_source(case))
    inputs = store.values(case.inputs)
    _, fakes, _ = symbolic_inputs(inputs, [s.dynamic or None for s in case.inputs])
    for node, fake in zip([n for n in gm.graph.nodes if n.op == "placeholder"], fakes):
        node.meta["example_value"] = fake
    writer = Writer(str(folder), {"backend": "the run's", "after": "dynamo"})
    expected = list(gm(*inputs))
    writer.add(kind="dynamo", graph=0, call=2, gm=gm, inputs=inputs, expected=expected, compiled=expected,
               compiled_error=None, node_sources={}, replay=replay_spec, signature="sig")
    writer.finish()
    return case, load_graph(str(folder / "g0_dynamo_c2"))


def test_saved_io_replays_a_symbolic_graph_with_its_symbols(tmp_path):
    case, saved = save_dynamic_graph(tmp_path / "io", dict(SPEC))
    meta = json.loads((tmp_path / "io" / "g0_dynamo_c2" / "meta.json").read_text())
    renamed = {s.name: s for s in saved_specs(saved, meta)}
    assert [d for _, d in structure_of(renamed.values())] == [d for _, d in structure(case)]
    result = replay(saved)
    assert (result.status, result.stage) == ("failed", "accuracy")
    assert abs(result.max_abs_error - 1) < 1e-5   # the backend's +1, on the 100-row call
    # another backend given the graph whole still sees it symbolic (the graph carries its symbols)
    placeholders = [n for n in saved.gm.graph.nodes if n.op == "placeholder"]
    assert [tuple(n.meta.get("tdbg_dynamic") or ()) for n in placeholders] == [s.dynamic for s in renamed.values()]
    assert replay(saved, "aot_eager").status == "ok"
    # what `tdbg replay` prints beside the verdict
    first, x = saved_specs(saved, meta)[0], saved_specs(saved, meta)[2]
    assert saved.symbolic_text.startswith(f"{first.name}: {x.dynamic[0]}=100, ")


def test_compare_of_a_saved_symbolic_graph_with_a_named_backend_compiles_it_symbolic(tmp_path):
    """`tdbg compare DIR --backend NAME` (cli/compare.py): a saved graph with symbolic sizes is
    compiled symbolic by that backend too; given to it at the saved sizes, a backend wrong only
    on symbolic graphs passed (a false OK)."""
    from tdbg.cli.compare import _compare_one as compare_one
    (tmp_path / "bk.py").write_text("import torch\n" + WRONG_IF_DYNAMIC)
    _, saved = save_dynamic_graph(tmp_path / "io", {"backend": {"kind": "named", "name": "eager"}, "config": {},
                                                   "after": "dynamo"})
    row = compare_one(saved, str(tmp_path / "io"), f"{tmp_path / 'bk.py'}:wrong_if_dynamic", None)
    assert (row["verdict"], row["diverged"]) == ("outputs_differ", True)
    # compare compiles by replay's spec for that backend, which keeps the saved symbols itself
    from tdbg.minifier.diagnose.replay import spec_for
    spec = spec_for(f"{tmp_path / 'bk.py'}:wrong_if_dynamic", saved)
    assert spec["dynamic"] == saved.replay_spec["dynamic"] and saved.replay_spec["dynamic"]


def saved_specs(saved, meta) -> list:
    dynamic = meta["replay"]["dynamic"]
    return [InputSpec(r["name"], dynamic=tuple(dynamic.get(r["name"]) or ())) for r in meta["inputs"]]


def structure_of(specs) -> list:
    class _Case:
        inputs = tuple(specs)
    return structure(_Case)


def test_shrink_shapes_keeps_symbolic_dims_symbolic_and_their_int_inputs_consistent():
    from tdbg.minifier.reduce.engine import State
    from tdbg.minifier.reduce.passes import BY_NAME
    case, store = dynamic_case()
    x_dims = dict(zip(case.inputs[2].dynamic, range(2)))   # symbol -> its dim in x

    def consistent(c):
        """What eager would ask: each int symbol input is still the size of its dim of x."""
        x = c.inputs[2]
        return all(s.value == x.shape[x_dims[s.dynamic[0]]] for s in c.inputs if not s.is_tensor)
    state = State(case, consistent, store)
    BY_NAME["shrink_shapes"](state)
    # x's dims and w's first are symbolic: they stop at 2 (1 would be specialized); w's static
    # 4 goes to 1; the int inputs shrank along with the tensors
    assert [s.shape if s.is_tensor else s.value for s in state.current.inputs] == [2, 2, (2, 2), (2, 1)]
    assert [s.dynamic for s in state.current.inputs] == [s.dynamic for s in case.inputs]


def test_dumping_before_compiling_leaves_a_symbolic_graph_symbolic(tmp_path):
    """Level 3 dumps every aten graph before compiling it, with random inputs of its sizes: it
    reads the sizes' hints, never int() or == on a SymInt (those add guards: the graph would be
    specialized to its first size and recompiled for each other one)."""
    from tdbg.compiler.config import from_env
    from tdbg.minifier.artifacts.dump import wrap_backend
    from tdbg.minifier.runs.backends import resolve
    compiled = []
    config = from_env()
    backend = wrap_backend(resolve("aot_eager", config), after="aot", level=3, out_dir=str(tmp_path), config=config)

    def counting(gm, example_inputs):
        compiled.append(gm)
        return backend(gm, example_inputs)
    torch._dynamo.reset()
    fn = torch.compile(lambda x: (torch.relu(x) * 2,), backend=counting, dynamic=True)
    for rows in (100, 30, 50):
        fn(torch.randn(rows, 8))
    assert len(compiled) == 1
    # its launcher (rewritten with the first call's real inputs) keeps every dim symbolic
    dump = load(str(tmp_path / "graph_0" / "minifier_launcher.py"))
    assert [(s.shape if s.is_tensor else s.value) for s in dump.case.inputs] == [100, 8, (100, 8)]
    assert [d for _, d in structure(dump.case)] == [("a",), ("b",), ("a", "b")]


def test_symbolic_sizes_are_written_with_their_values():
    from tdbg.minifier.artifacts.graph_io import symbolic_text
    specs = [InputSpec("s77", value=100, dynamic=("s77",)), InputSpec("arg1_1", value=8, dynamic=("s27",)),
             InputSpec("x", "ab", (100, 8), (8, 1), "torch.bfloat16", dynamic=("s77", None)),
             InputSpec("w", "cd", (8, 4), (4, 1), "torch.float32")]
    assert symbolic_text(specs) == "s77=100, arg1_1: s27=8, x: bfloat16[s77=100, 8]"
    assert symbolic_text(specs[3:]) == ""


AOT_SEEN = '''
from torch._dynamo.backends.common import aot_autograd

SEEN = []


def _fw(gm, example_inputs):
    SEEN.append([tuple(type(s).__name__ for s in x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                 for x in example_inputs])
    return gm


aot_seen = aot_autograd(fw_compiler=_fw)
'''


def test_after_aot_the_per_graph_compiler_gets_fakes_with_symbolic_sizes(tmp_path):
    """After aot, a per-graph compiler gets what AOTAutograd gives it: fake inputs whose recorded
    dims are SymInts (static dims stay ints), and a SymInt for an int input with a symbol."""
    from tdbg.repro_templates.runtime import compile_graph
    (tmp_path / "seen_backend.py").write_text("import torch\n" + AOT_SEEN)
    case, store = dynamic_case()
    backend = {"kind": "import", "module": "seen_backend", "attr": "aot_seen", "files": ["seen_backend.py"],
               "root": str(tmp_path)}
    spec = {"after": "aot", "aot": {"family": "aot_autograd", "graph": "inference"}, "backend": backend,
            "config": {}, "dynamic": {case.inputs[0].name: case.inputs[0].dynamic,
                                      "l_x_": (case.inputs[2].dynamic[0], None)}}
    inputs = store.values(case.inputs)
    compiled = compile_graph(trace_source(case_source(case)), inputs, spec, str(tmp_path))
    seen = sys.modules["seen_backend"].SEEN
    # x's rows symbolic (and their int input); the 8 recorded nowhere in this spec: an int, x's 8 static
    assert seen == [["SymInt", "int", ("SymInt", "int"), ("int", "int")]]
    assert torch.equal(compiled(*inputs)[0], f(inputs[2], inputs[3])[0])


def test_shrink_shapes_recomputes_an_int_input_that_is_an_expression_of_symbols():
    from dataclasses import replace as with_fields

    from tdbg.minifier.artifacts.graph_io import size_of
    from tdbg.minifier.reduce.engine import State
    from tdbg.minifier.reduce.passes import BY_NAME
    from mincases import make_case
    case, store = make_case(lambda x, n: torch.neg(x.reshape(n)), torch.randn(10, 4), 40)
    x, n = case.inputs
    case = case.derive(case.gm.graph, (with_fields(x, dynamic=("s0", None)), with_fields(n, dynamic=("4*s0",))))

    def consistent(c):   # eager's reshape needs n == x.numel()
        x, n = c.inputs
        return n.value == x.shape[0] * x.shape[1]
    state = State(case, consistent, store)
    BY_NAME["shrink_shapes"](state)
    # rows (symbolic) stop at 2 and n follows as 4*s0; the static 4 cannot shrink alone
    assert [s.shape if s.is_tensor else s.value for s in state.current.inputs] == [(2, 4), 8]
    assert size_of("s21*s77 + 1", {"s21": 3, "s77": 5}) == 16 and size_of("s9*2", {"s1": 2}) is None


def test_an_int_input_recorded_as_an_expression_is_that_expression_of_the_new_symbols():
    from tdbg.repro_templates.runtime import symbolic_inputs
    x = torch.randn(100, 4)
    _, fakes, examples = symbolic_inputs(
        [400, 100, x, 399, 7], [("s21*s77",), ("s77",), ("s77", "s21"), ("s21*s77",), ("s5 + s77",)])
    rows, cols = (size.node.expr for size in fakes[2].shape)
    assert fakes[1].node.expr == rows and fakes[0].node.expr == rows * cols
    # a value the expression does not give, or a symbol nothing else has: a symbol of its own
    assert fakes[3].node.expr.is_Symbol and fakes[4].node.expr.is_Symbol
    assert examples[2] is x and [type(e).__name__ for e in examples] == ["SymInt", "SymInt", "Tensor", "SymInt", "SymInt"]


def test_recorded_symbols_stay_distinct_at_equal_sizes_and_shared_where_recorded_so():
    """Shrinking made a graph's two symbols both 2: they must stay two symbols (duck sizing
    would merge them into one, a different graph from the one that failed); a dim recorded as
    an expression of them is that expression."""
    from tdbg.repro_templates.runtime import symbolic_inputs
    a, b, c = torch.randn(2, 2), torch.randn(2, 3), torch.randn(4)
    _, fakes, _ = symbolic_inputs([a, b, c], [("s77", "s21"), ("s21", None), ("s21*s77",)])
    rows, cols = (size.node.expr for size in fakes[0].shape)
    assert rows != cols and fakes[1].shape[0].node.expr == cols and fakes[1].shape[1] == 3
    assert fakes[2].shape[0].node.expr == rows * cols


@torch.library.custom_op("tdbg_test::plus_one_no_fake", mutates_args=())
def plus_one_no_fake(x: torch.Tensor) -> torch.Tensor:
    """A custom op with no fake (meta) implementation: eager runs it, fake tensors cannot."""
    return x + 1


def test_symbolic_sizes_that_cannot_be_rebuilt_are_cannot_run_not_the_backends_failure():
    """tdbg rebuilds a symbolic graph by propagating fake values; an op that has no fake
    implementation stops that: `cannot_run` (exit 3), never a compile error that a minifier
    would take for the backend's own failure."""
    from dataclasses import replace as with_fields

    from mincases import make_case
    op = torch.ops.tdbg_test.plus_one_no_fake.default
    case, store = make_case(lambda x: (torch.neg(op(x)),), torch.randn(4, 6))
    x, = case.inputs
    case = case.derive(case.gm.graph, (with_fields(x, dynamic=("s0", None)),))
    eager = {"kind": "named", "name": "eager"}
    outcome = evaluate(trace_source(case_source(case)), store.values(case.inputs),
                       dict(SPEC, backend=eager, dynamic=dynamic_table(case.inputs)))
    assert outcome.kind == "cannot_run"
    assert outcome.message.startswith("the graph's symbolic sizes (DYNAMIC) cannot be rebuilt in this torch ")
    # static, the same graph compiles and passes
    assert evaluate(trace_source(case_source(case)), store.values(case.inputs), dict(SPEC, backend=eager)).kind == "pass"


def test_a_failing_call_of_a_symbolic_graph_names_the_sizes_it_ran_at():
    from tdbg.cli.run import _graph_text
    from tdbg.minifier.runs.instrument import call_symbols
    dynamic = [("s77",), ("s77", None), (), ("s21*s77",)]
    sizes = call_symbols(dynamic, [100, torch.zeros(100, 8), torch.zeros(8, 4), 400])
    assert sizes == "s77=100" and call_symbols([], [1]) is None
    err = {"graph": 1, "frame": "f", "during": "run", "call": 2, "symbolic_sizes": sizes}
    assert _graph_text(err, 2) == "1 (frame f) forward, while running (call 2; symbolic sizes s77=100)"
