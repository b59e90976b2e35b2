"""A pytest file per compiled kernel (minifier/diagnose/kernel_tests.py, `tdbg run --kernel-tests`).

Library cases write the tests of `block` below (forward 20+ aten ops, and its backward), captured
once per module with tdbg's own backend, and run the written test functions in this process: all
pass on the healthy compiler, and with an injected accuracy bug in `tanh` exactly one fails, the
one whose kernel computes tanh. One end-to-end case runs `tdbg run scripts/deep_mlp.py
--kernel-tests DIR`, then `python -m pytest DIR` twice in subprocesses: healthy, then under
TDBG_INJECT_BUG=tanh:accuracy.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tdbg.compiler import config as tconfig
from tdbg.minifier.diagnose.kernel_tests import KernelTestsError, write_kernel_tests, write_tests

HERE = os.path.dirname(os.path.abspath(__file__))
DEEP_MLP = os.path.join(HERE, "scripts", "deep_mlp.py")
THIS = os.path.abspath(__file__)


def block(x, w1, w2, b):
    h = torch.tanh(x @ w1 + b)                       # the only tanh: one forward kernel
    g = torch.sigmoid(h * 1.5) * h
    r = torch.relu(g @ w2) - 0.25
    n = r / (r.abs().sum(dim=1, keepdim=True) + 1.0)
    s = torch.exp(-n * n) + torch.log1p(n.abs())
    return (s * s).mean() + torch.sqrt(s.pow(2).sum() + 1e-3)


_CODE = "h = torch.tanh(x @ w1 + b)                       # the only tanh: one forward kernel"
TANH_LINE = f"{THIS}:{open(THIS).read().splitlines().index('    ' + _CODE) + 1} in block: {_CODE}"


def _capture(fn, *args):
    """[(name, kind, aten gm, real inputs of its first call, {})] of `fn`'s forward and backward."""
    from tdbg.compiler import compile_aten, make_backend
    graphs = []

    def compile_one(gm, inputs, cfg, *, graph_name, kind):
        compiled = compile_aten(gm, inputs, cfg, graph_name=graph_name, kind=kind)

        def run(*call_args):
            if not any(g[0] == graph_name for g in graphs):
                graphs.append((graph_name, kind, gm, [a.detach().clone() if isinstance(a, torch.Tensor) else a
                                                      for a in call_args], {}))
            return compiled(*call_args)
        return run
    torch._dynamo.reset()
    torch.compile(fn, backend=make_backend(tconfig.current(), inner_compile=compile_one))(*args).backward()
    return graphs


@pytest.fixture(scope="module")
def block_graphs():
    torch.manual_seed(0)
    args = (torch.randn(8, 16), torch.randn(16, 24, requires_grad=True), torch.randn(24, 12, requires_grad=True),
            torch.randn(24, requires_grad=True))
    return _capture(block, *args)


@pytest.fixture(scope="module")
def written(block_graphs, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("kt") / "tests")
    return write_tests(block_graphs, out, {"script": "test_kernel_tests.py"})


def _run_in_process(result, **changes) -> dict:
    """{file name: None (passed) or the AssertionError's first line}, each written test imported
    and called here, with `changes` (e.g. inject_bug) made to the compiler's process default."""
    outcomes = {}
    with tconfig.use(tconfig.current().replace(**changes)):
        for path in result.files:
            spec = importlib.util.spec_from_file_location(f"kt_{abs(hash(path))}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            test = next(getattr(module, n) for n in dir(module) if n.startswith("test_"))
            try:
                test()
                outcomes[os.path.basename(path)] = None
            except AssertionError as e:
                outcomes[os.path.basename(path)] = str(e).splitlines()[0]
    return outcomes


def test_one_file_per_kernel_named_after_graph_and_kernel(written, block_graphs):
    assert [g[1] for g in block_graphs] == ["forward", "backward"]
    assert written.graphs == 2 and written.skipped == []
    assert written.kernels == len(written.files) >= 6
    for t in written.tests:
        assert os.path.basename(t.path) == f"test_{t.graph}__{t.kernel}.py"
    assert len({t.kernel for t in written.tests if t.graph.endswith("forward_0")}) == \
        sum(1 for t in written.tests if t.graph.endswith("forward_0"))
    tanh_tests = [t for t in written.tests if "tanh" in t.ops]
    assert len(tanh_tests) == 1 and tanh_tests[0].graph.endswith("_forward_0")
    assert tanh_tests[0].source == TANH_LINE


def test_file_names_kernel_nodes_and_source_line(written):
    t = next(t for t in written.tests if "tanh" in t.ops)
    text = open(t.path).read()
    doc = text.split('"""')[1]
    assert doc.startswith(f"tdbg kernel test: {t.kernel} of {t.graph} (forward graph of test_kernel_tests.py).")
    assert f"computes FX nodes {', '.join(t.fx_nodes)}; source: {TANH_LINE}." in doc
    assert f"\ndef test_{t.kernel}():\n" in text
    assert f"KERNEL = {t.kernel!r}" in text and "torch.ops.aten.tanh.default(" in text


def test_healthy_compiler_passes_every_kernel_test(written):
    assert _run_in_process(written) == {os.path.basename(p): None for p in written.files}


def test_injected_bug_fails_exactly_the_kernel_that_computes_the_op(written):
    outcomes = _run_in_process(written, inject_bug=("tanh", "accuracy"))
    failed = {name: why for name, why in outcomes.items() if why is not None}
    tanh_test = next(t for t in written.tests if "tanh" in t.ops)
    assert list(failed) == [os.path.basename(tanh_test.path)]
    assert failed[os.path.basename(tanh_test.path)].startswith(f"kernel {tanh_test.kernel} of {tanh_test.graph} (")


def test_tests_run_without_pytest(written, monkeypatch, capsys):
    """The main install has no pytest (issue 25): the folder's run_kernel_tests.py runs every test,
    and each file runs alone; the printed command names the runner where pytest is missing."""
    import importlib.util as util
    import runpy
    runner = os.path.join(written.out_dir, "run_kernel_tests.py")
    with pytest.raises(SystemExit) as done:
        runpy.run_path(runner, run_name="__main__")
    assert done.value.code == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"{len(written.files)} passed, 0 failed"
    runpy.run_path(written.files[0], run_name="__main__")
    assert capsys.readouterr().out.strip() == f"passed: {os.path.basename(written.files[0])}"
    find = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "pytest" else find(name, *a))
    assert written.command == f"python {runner}"
    monkeypatch.undo()
    assert written.command == f"python -m pytest {written.out_dir}"


def test_a_test_whose_nodes_all_fall_back_to_aten_fails_as_checking_nothing(written):
    t = next(t for t in written.tests if "tanh" in t.ops)
    outcomes = _run_in_process(type(written)(written.out_dir, [t]), fallback_ops=frozenset(t.ops))
    assert outcomes == {os.path.basename(t.path): f"tdbg's compiler made no kernel for {t.kernel}'s nodes: "
                                                  "this test checks nothing"}



def embedding_sum(idx, w):
    return (torch.nn.functional.embedding(idx, w, padding_idx=0) * 2).sum()


def test_a_kernel_reading_a_zero_fill_makes_the_fill_again_and_checks_its_kernel(tmp_path):
    """The embedding backward's index_put accumulates into a zero fill made in the graph; read as
    an input instead, the test's graph sent the op to aten and failed as checking nothing (BERT's
    training step, 1 of 184 tests)."""
    torch.manual_seed(0)
    graphs = _capture(embedding_sum, torch.randint(0, 10, (4, 6)), torch.randn(10, 8, requires_grad=True))
    written = write_tests(graphs, str(tmp_path / "kt"), {"script": "test_kernel_tests.py"})
    scatter = [t for t in written.tests if t.ops == ["_unsafe_masked_index_put_accumulate", "full", "unsqueeze"]]
    assert len(scatter) == 1
    spec = importlib.util.spec_from_file_location("kt_scatter", scatter[0].path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert [row[0] for row in module.INPUTS] == ["bitwise_and_1", "primals_1", "mul_1"]   # the fill is made, not read
    assert "full = torch.ops.aten.full.default([10, 8], 0" in open(scatter[0].path).read()
    assert set(_run_in_process(written).values()) == {None}
    assert len(written.tests) == 4


def dropout_sum(x, w):
    return (torch.nn.functional.dropout(torch.tanh(x @ w), 0.5, training=True) * 3).sum()


def test_a_kernel_reading_a_random_draw_gets_eagers_draw_as_an_input(tmp_path):
    """The dropout's getitem is read, never made again (only plain sizes make a fill)."""
    torch.manual_seed(0)
    graphs = _capture(dropout_sum, torch.randn(8, 16), torch.randn(16, 12, requires_grad=True))
    written = write_tests(graphs, str(tmp_path / "kt"), {"script": "test_kernel_tests.py"})
    assert written.skipped == []
    assert [t.ops for t in written.tests] == [["tanh"], ["mul", "sum"], ["expand", "mul", "native_dropout_backward", "sub"]]
    assert set(_run_in_process(written).values()) == {None}
def test_folder_is_relocatable_and_a_changed_tensor_file_fails(written, tmp_path):
    moved = str(tmp_path / "moved")
    shutil.copytree(written.out_dir, moved)
    path = os.path.join(moved, os.path.basename(written.files[0]))
    spec = importlib.util.spec_from_file_location("kt_moved", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    test = next(getattr(module, n) for n in dir(module) if n.startswith("test_"))
    test()   # passes from its new folder
    sha = module.INPUTS[0][1]
    tensor = os.path.join(moved, "tensors", f"{sha}.bin")
    with open(tensor, "r+b") as f:
        f.write(b"\x01\x02\x03\x04")
    with pytest.raises(AssertionError, match=f"{module.INPUTS[0][0]}: .*{sha}.bin does not match its SHA-256 name"):
        test()


def test_existing_test_file_is_never_overwritten(written, block_graphs):
    before = {p: open(p).read() for p in written.files}
    with pytest.raises(KernelTestsError, match="already exists .* kernel tests never overwrite files") as info:
        write_tests(block_graphs, written.out_dir)
    assert info.value.stage == "bad_input"
    assert {p: open(p).read() for p in written.files} == before


def test_views_a_kernel_reads_through_are_computed_but_not_outputs(tmp_path):
    from torch.fx.experimental.proxy_tensor import make_fx
    x, w = torch.randn(6, 8), torch.randn(6, 3)
    gm = make_fx(lambda x, w: ((x.t() * 2).sum(), x.t() @ w))(x, w)   # t: read by a kernel and by mm
    result = write_tests([("g0_forward_c1", "forward", gm, [x, w], {})], str(tmp_path / "v"))
    mul = next(t for t in result.tests if "mul" in t.ops)
    assert mul.fx_nodes == ["t", "mul", "sum_1"] and (mul.inputs, mul.outputs) == (1, 1)
    assert "return (sum_1,)" in open(mul.path).read()
    assert _run_in_process(result) == {os.path.basename(p): None for p in result.files}


def test_dynamo_graph_is_listed_as_not_split(block_graphs, tmp_path):
    name, _, gm, inputs, sources = block_graphs[0]
    result = write_tests([("g0_dynamo_c1", "dynamo", gm, inputs, sources)], str(tmp_path / "d"))
    assert result.files == [] and result.kernels == 0
    assert result.skipped == [("g0_dynamo_c1", "a dynamo graph is not split per kernel: tdbg's kernels are made "
                                                "from aten graphs after AOTAutograd, and this backend saved the "
                                                "Dynamo graph")]
    assert not os.path.exists(str(tmp_path / "d" / "tensors")) or not os.listdir(str(tmp_path / "d" / "tensors"))


def test_saved_folder_with_a_tampered_tensor_is_bad_input(tmp_path):
    from tdbg.minifier.artifacts.saved_io import SavedIOError, Writer
    from torch.fx.experimental.proxy_tensor import make_fx
    gm = make_fx(lambda x: torch.tanh(x) * 2)(torch.randn(4))
    w = Writer(str(tmp_path / "saved"), {"backend": "inductor", "script": "s.py", "after": "aot"})
    x = torch.randn(4)
    name = w.add(kind="forward", graph=0, call=1, gm=gm, inputs=[x], expected=[torch.tanh(x) * 2], compiled=None,
                 compiled_error=None, node_sources={}, replay={}, signature="s")
    result = write_kernel_tests(str(tmp_path / "saved"), str(tmp_path / "ok"))
    assert result.kernels == 1 and result.tests[0].ops == ["mul", "tanh"]
    tensors = tmp_path / "saved" / name / "tensors"
    victim = next(tensors.iterdir())
    victim.write_bytes(b"\x00" * 16)
    with pytest.raises(SavedIOError, match="does not match its SHA-256 name") as info:
        write_kernel_tests(str(tmp_path / "saved"), str(tmp_path / "bad"))
    assert info.value.stage == "bad_input" and not (tmp_path / "bad").exists()


def _pytest(directory, env_extra):
    env = {k: v for k, v in os.environ.items() if k != "TDBG_INJECT_BUG"}
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", directory],
                          env=env, capture_output=True, text=True, timeout=600, cwd=directory)
    return proc.returncode, proc.stdout


@pytest.mark.slow   # three processes and ~25 fresh g++ builds: ~40 s on a quiet 2-core machine, 2 min at load 10
def test_cli_kernel_tests_pass_healthy_and_fail_once_under_injected_bug(tmp_path):
    out = str(tmp_path / "kt")
    json_path = str(tmp_path / "run.json")
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", "run", DEEP_MLP, "--kernel-tests", out,
                           "--json", json_path], capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "TDBG_INJECT_BUG"})
    assert proc.returncode == 0, proc.stderr
    info = json.load(open(json_path))["verdict"]["kernel_tests"]
    files = sorted(os.path.basename(f) for f in info["files"])
    assert info["kernels"] == len(files) >= 8
    # beside the tests: run_kernel_tests.py, the folder's runner (not a test)
    assert sorted(f for f in os.listdir(out) if f.endswith(".py") and f.startswith("test_")) == files
    assert "run_kernel_tests.py" in os.listdir(out)
    tanh_files = [f for f in files if "torch.ops.aten.tanh." in open(os.path.join(out, f)).read()]
    # the forward's tanh kernel, and the backward's when the partitioner recomputes tanh there
    # (torch 2.13's does: the sigmoid/tanh backward kernel)
    assert [f for f in tanh_files if "_forward_" in f] and len(tanh_files) <= 2

    code, text = _pytest(out, {})
    assert code == 0 and f"{len(files)} passed" in text, text
    code, text = _pytest(out, {"TDBG_INJECT_BUG": "tanh:accuracy"})
    failed = sorted(os.path.basename(line.split("::")[0].split()[-1]) for line in text.splitlines() if line.startswith("FAILED "))
    n = len(tanh_files)
    assert code == 1 and failed == tanh_files and f"{n} failed, {len(files) - n} passed" in text, text
