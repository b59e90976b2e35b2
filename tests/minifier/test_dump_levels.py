"""wrap_backend, level by level: what is written, when, and that the failure still surfaces."""
import os

import pytest
import torch

from tdbg.compiler.config import Config
from tdbg.minifier.artifacts.dump import AccuracyError, wrap_backend
from tdbg.minifier.artifacts.repro import load
from tdbg.minifier.runs.aot_capture import NoAotStage
from tdbg.minifier.runs.backends import resolve

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scenarios", "scripts")


def picky(gm, example_inputs):
    if any(n.target is torch.relu for n in gm.graph.nodes):
        raise NotImplementedError("picky does not support relu")
    return gm


def off_by_one(gm, example_inputs):
    def run(*args):
        return tuple(o + 1 for o in gm(*args))
    return run


def fn(x):
    return torch.relu(x + 1) * 2


def compile_and_run(backend, *, after, level, out_dir, config=None):
    wrapped = wrap_backend(backend, after=after, level=level, out_dir=str(out_dir), config=config or Config())
    torch._dynamo.reset()
    return torch.compile(fn, backend=wrapped)(torch.ones(4))


def inner(e):
    return getattr(e, "inner_exception", None) or e


def test_level_1_writes_repro_py_and_reraises(tmp_path):
    with pytest.raises(Exception) as info:
        compile_and_run(picky, after="dynamo", level=1, out_dir=tmp_path)
    error = inner(info.value)
    assert isinstance(error, NotImplementedError)
    assert error.tdbg_repro_dir == str(tmp_path)
    # picky is importable from this test module: the module is copied beside repro.py
    assert sorted(os.listdir(tmp_path)) == ["inputs", "repro.py", "test_dump_levels.py"]
    dump = load(str(tmp_path / "repro.py"))
    assert dump.expected["kind"] == "compile_error" and dump.expected["exc_type"] == "NotImplementedError"
    assert dump.spec["backend"] == {"kind": "import", "module": "test_dump_levels", "attr": "picky",
                                    "files": ["test_dump_levels.py"], "root": str(tmp_path)}


def test_level_2_adds_the_launcher(tmp_path):
    with pytest.raises(Exception):
        compile_and_run(picky, after="dynamo", level=2, out_dir=tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["inputs", "minifier_launcher.py", "repro.py", "test_dump_levels.py"]


def test_level_3_dumps_every_graph_before_compiling(tmp_path):
    out = compile_and_run(lambda gm, ex: gm, after="dynamo", level=3, out_dir=tmp_path)
    assert torch.equal(out, fn(torch.ones(4)))
    assert os.listdir(tmp_path) == ["graph_0"]
    dump = load(str(tmp_path / "graph_0"))
    assert dump.expected is None
    assert [s.shape for s in dump.case.inputs] == [(4,)]
    assert torch.equal(dump.store.value(dump.case.inputs[0]), torch.ones(4))  # real inputs, from the call


def test_levels_1_to_3_pass_working_graphs_through_silently(tmp_path):
    for level in (1, 2):
        out = compile_and_run(off_by_one, after="dynamo", level=level, out_dir=tmp_path / str(level))
        assert torch.equal(out, fn(torch.ones(4)) + 1)
        assert not os.path.exists(tmp_path / str(level))


def test_level_4_catches_accuracy_after_dynamo(tmp_path):
    with pytest.raises(AccuracyError) as info:
        compile_and_run(off_by_one, after="dynamo", level=4, out_dir=tmp_path)
    assert info.value.stage == "accuracy"
    assert info.value.tdbg_repro_dir == str(tmp_path)
    assert load(str(tmp_path)).expected["kind"] == "accuracy"


def test_level_4_after_aot_on_foo2_with_an_injected_neg_bug(tmp_path):
    def foo2(x1, x2):
        return torch.cat([torch.maximum(x2, torch.neg(x1))], dim=0)
    cfg = Config().replace(inject_bug=("neg", "accuracy"))
    wrapped = wrap_backend(resolve("inductor", cfg), after="aot", level=4, out_dir=str(tmp_path), config=cfg)
    torch._dynamo.reset()
    x1, x2 = torch.randn(1, 8), torch.randn(64, 8)
    with pytest.raises(AccuracyError):
        torch.compile(foo2, backend=wrapped)(x1, x2)
    dump = load(str(tmp_path))
    assert dump.spec["config"] == {"inject_bug": ["neg", "accuracy"]}
    assert [n.target for n in dump.case.compute_nodes()][:2] == [torch.ops.aten.neg.default,
                                                                 torch.ops.aten.maximum.default]
    assert torch.equal(dump.store.value(dump.case.inputs[0]), x1)  # the real inputs


def test_compile_error_after_aot_keeps_the_real_integer_inputs(tmp_path):
    def foo1(x1, x2):
        return torch.cat([torch.maximum(x2, torch.neg(x1))], dim=0)
    cfg = Config().replace(inject_bug=("neg", "compile_error"))
    wrapped = wrap_backend(resolve("inductor", cfg), after="aot", level=2, out_dir=str(tmp_path), config=cfg)
    torch._dynamo.reset()
    x1 = torch.tensor([[7, 250, 3]], dtype=torch.uint8)
    x2 = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.uint8)
    with pytest.raises(Exception) as info:
        torch.compile(foo1, backend=wrapped)(x1, x2)
    assert type(inner(info.value)).__name__ == "CppCompileError"
    assert inner(info.value).tdbg_repro_dir == str(tmp_path)
    dump = load(str(tmp_path))
    assert dump.expected["exc_type"] == "CppCompileError"
    assert [dump.store.value(s).tolist() for s in dump.case.inputs] == [x1.tolist(), x2.tolist()]


def test_after_aot_refuses_a_backend_without_an_aot_stage_instead_of_swapping_it():
    with pytest.raises(NoAotStage, match="--after dynamo"):
        wrap_backend(off_by_one, after="aot", level=4, out_dir="unused", config=Config())


def test_after_aot_on_a_backend_defined_in_the_script_says_why_not_that_it_has_no_aot_stage():
    """It may well be an aot_autograd(...) backend: that is known only once the script runs (it
    said 'is none of these')."""
    script = os.path.join(SCRIPTS, "user_backends.py")
    backend = resolve(f"{script}:wrong_backward", script=script)
    with pytest.raises(NoAotStage) as info:
        wrap_backend(backend, after="aot", level=4, out_dir="unused", config=Config())
    assert "user_backends.py:wrong_backward is defined in the script being run" in str(info.value)
    assert "none of these" not in str(info.value) and "--after dynamo" in str(info.value)


def test_after_aot_checks_the_backward_graph_an_aot_autograd_backend_compiles(tmp_path):
    """user_backends.wrong_backward's forward is right; its backward compiler doubles an output."""
    backend = resolve(os.path.join(SCRIPTS, "user_backends.py") + ":wrong_backward")
    wrapped = wrap_backend(backend, after="aot", level=4, out_dir=str(tmp_path), config=Config())
    torch._dynamo.reset()
    x = torch.randn(4, requires_grad=True)
    out = torch.compile(lambda t: (t.sin() * 3).sum(), backend=wrapped)(x)
    with pytest.raises(AccuracyError):
        out.backward()
    dump = load(str(tmp_path))
    assert dump.spec["aot"] == {"family": "aot_autograd", "graph": "backward"}
    assert dump.spec["backend"] == {"kind": "import", "module": "user_backends", "attr": "wrong_backward",
                                    "files": ["user_backends.py"], "root": str(tmp_path)}
    assert sorted(os.listdir(tmp_path)) == ["inputs", "minifier_launcher.py", "repro.py", "user_backends.py"]


def test_a_backward_only_bug_after_dynamo_is_dumped_with_grad_flags_and_reproduces(tmp_path):
    """wrong_backward after dynamo: the forward is right, so the dump must keep which inputs
    require grad and the repro/minifier must compare gradients (before: 'passed')."""
    from tdbg.minifier.reduce.oracle import evaluate
    backend = resolve(os.path.join(SCRIPTS, "user_backends.py") + ":wrong_backward")
    wrapped = wrap_backend(backend, after="dynamo", level=4, out_dir=str(tmp_path), config=Config())
    torch._dynamo.reset()
    torch.manual_seed(0)
    with pytest.raises(AccuracyError):
        torch.compile(torch.nn.Linear(4, 2), backend=wrapped)(torch.randn(3, 4))
    dump = load(str(tmp_path))
    assert sorted((s.name, s.requires_grad) for s in dump.case.inputs) == [
        ("l_args_0_", False), ("l_fn_parameters_bias_", True), ("l_fn_parameters_weight_", True)]
    assert dump.spec["check_grads"] is True
    out = evaluate(dump.case.gm, dump.store.values(dump.case.inputs), dump.spec)
    assert out.kind == "accuracy" and out.outputs[0].startswith("grad of ")
