"""minify --after dynamo on graphs no symbolic re-tracing can rebuild: functorch transforms
(jacfwd of PyTorch #194706, vmap, grad), writes into slices of a permuted view (#162151) and a
higher-order op (torch.cond, its branches as subgraphs). Each run shrinks the graph, and the
written repro.py, run from another folder without tdbg importable, reproduces with the failure's
own exit code. A graph whose source cannot be read back is exit 70 with one paragraph."""
import atexit
import os
import shutil
import tempfile

import pytest

SCRIPTS = os.path.join("tests", "scenarios", "scripts")   # not `from conftest`: another folder's conftest may hold that name
from test_repro_exit_codes import run_repro

OUT = tempfile.mkdtemp(prefix="tdbg-after-dynamo-")
atexit.register(shutil.rmtree, OUT, True)
NO_SIN = os.path.join(SCRIPTS, "no_sin_backend.py") + ":no_sin"


def minify(script, name, *extra, backend=NO_SIN):
    return (("minify", os.path.join(SCRIPTS, script), "--backend", backend, "--after", "dynamo", *extra,
             "--out", os.path.join(OUT, name)), None)


VMAP = minify("hop_vmap.py", "vmap")
GRAD = minify("hop_grad.py", "grad")
COND = minify("hop_cond.py", "cond")
SLICE = minify("issue_162151_slice_write.py", "slice", "--level", "4", backend="torch:aot_eager")
SCRIPT_OP = minify("script_op_in_graph.py", "script_op")
SCRIPT_OP_AOT = (("minify", os.path.join(SCRIPTS, "script_op_in_graph.py"), "--backend", NO_SIN, "--after", "aot",
                  "--out", os.path.join(OUT, "script_op_aot")), None)
JACFWD = minify("issue_194706_jacfwd.py", "jacfwd", backend="torch:inductor")
NO_SIN_FAILURE = "Reproduced: compile error: NotImplementedError: no kernel for aten.sin.default (node sin)"


def forward_ops(code: str, body: str = "") -> list:
    """The graph's (or its `body` subgraph's) nodes as (op, target name), read back the way tdbg
    reads them."""
    from tdbg.minifier.artifacts.graph_io import trace_source
    gm = trace_source(code)
    gm = getattr(gm, body) if body else gm
    return [(n.op, n.target if isinstance(n.target, str) else getattr(n.target, "__name__", str(n.target)))
            for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


@pytest.fixture(scope="module", autouse=True)
def _start(tdbg_runs):
    tdbg_runs.start(VMAP, COND, GRAD, SLICE, SCRIPT_OP, SCRIPT_OP_AOT)


def _reproduces(name, tmp_path, code, first_line):
    run = run_repro(os.path.join(OUT, name), tmp_path)
    assert run.returncode == code, run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == first_line


def test_vmap_graph_shrinks_to_the_batched_sin_with_its_vmap_level(tdbg_runs, tmp_path):
    res = tdbg_runs(*VMAP)
    assert res.code == 0, res.stdout + res.stderr
    assert forward_ops(res.json["minimized"]["code"]) == [
        ("call_function", "lazy_load_decompositions"), ("call_function", "_vmap_increment_nesting"),
        ("call_function", "_add_batch_dim"), ("call_function", "sin"), ("call_method", "sum"),
        ("call_function", "_remove_batch_dim"), ("call_function", "_vmap_decrement_nesting")]
    _reproduces("vmap", tmp_path, 19, NO_SIN_FAILURE)


def test_grad_graph_keeps_its_grad_level_around_sin(tdbg_runs, tmp_path):
    res = tdbg_runs(*GRAD)
    assert res.code == 0, res.stdout + res.stderr
    ops = [t for _, t in forward_ops(res.json["minimized"]["code"])]
    assert ops == ["_saved_tensors_hooks_disable", "_grad_increment_nesting", "_wrap_for_grad",
                   "set_inplace_requires_grad_allowed", "_set_tensor_requires_grad",
                   "set_inplace_requires_grad_allowed", "sin", "sum", "_autograd_grad", "getitem",
                   "_unwrap_for_grad", "_unwrap_for_grad", "_grad_decrement_nesting", "_saved_tensors_hooks_enable"]
    _reproduces("grad", tmp_path, 19, NO_SIN_FAILURE)


def test_cond_graph_keeps_its_branches_as_subgraphs(tdbg_runs, tmp_path):
    res = tdbg_runs(*COND)
    assert res.code == 0, res.stdout + res.stderr
    code = res.json["minimized"]["code"]
    assert forward_ops(code) == [("get_attr", "cond_true_0"), ("get_attr", "cond_false_0"),
                                 ("call_function", "cond"), ("call_function", "getitem")]
    assert forward_ops(code, "cond_true_0") == [("call_function", "sin"), ("call_function", "mul")]
    assert forward_ops(code, "cond_false_0") == [("call_method", "cos"), ("call_function", "sub")]
    _reproduces("cond", tmp_path, 19, NO_SIN_FAILURE)


def test_issue_162151_slice_writes_shrink_to_the_permuted_transposed_write(tdbg_runs, tmp_path):
    """AOTAutograd's functionalization of `x = x.permute(2, 1, 0); x[0] = x[0].t()` is wrong
    (aot_eager fails too), an accuracy failure: level 4."""
    res = tdbg_runs(*SLICE)
    assert res.code == 0, res.stdout + res.stderr
    assert forward_ops(res.json["minimized"]["code"]) == [
        ("call_method", "permute"), ("call_function", "getitem"), ("call_method", "t"),
        ("call_function", "setitem")]
    run = run_repro(os.path.join(OUT, "slice"), tmp_path)
    assert run.returncode == 16, run.stdout + run.stderr
    # the input the graph writes through its permuted view is wrong too, and said so
    assert run.stdout.splitlines()[:2] == [
        "Reproduced: accuracy mismatch in out[0], l_x_ (changed in place)",
        "  out[0]: max abs error 2 at (0, 0, 1): expected 5, got 3 (rtol=1.3e-05, atol=1e-05)"]


def test_a_graph_that_cannot_be_read_back_is_exit_70_in_one_paragraph_and_after_aot_works(tdbg_runs):
    res = tdbg_runs(*SCRIPT_OP)
    assert res.code == 70, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert res.json["error"].startswith(
        "tdbg captured the failing graph after dynamo but cannot read its source back into the same graph "
        "(ImportError: cannot import name 'scaled' from '__main__' ")
    assert res.json["error"].endswith(
        "this is a limit of tdbg's graph files, not a problem of your program: try `--after aot`: the aten "
        "graph AOTAutograd makes from it has only aten ops, which always read back, and please report the "
        "graph to tdbg.")
    # the command it suggests runs: after aot the graph holds aten ops only
    aot = tdbg_runs(*SCRIPT_OP_AOT)
    assert aot.code == 0, aot.stdout + aot.stderr
    assert forward_ops(aot.json["minimized"]["code"]) == [("call_function", "sin.default")]


@pytest.mark.slow
def test_issue_194706_jacfwd_graph_minifies_with_torch_inductor(tdbg_runs, tmp_path):
    """Inductor's C++ for jacfwd(f) on float16 does not compile; each query compiles C++ (minutes)."""
    res = tdbg_runs(*JACFWD)
    assert res.code == 0, res.stdout + res.stderr
    ops = [t for _, t in forward_ops(res.json["minimized"]["code"])]
    assert "_add_batch_dim" in ops and "_remove_batch_dim" in ops and "_make_dual" in ops
    run = run_repro(os.path.join(OUT, "jacfwd"), tmp_path)
    assert run.returncode == 19, run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == "Reproduced: compile error: InductorError: CppCompileError: C++ compile error"
