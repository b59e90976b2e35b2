"""Kernel tests of a graph with symbolic sizes (minifier/diagnose/kernel_tests.py): each test's
inputs keep the symbols their values had in the saved symbolic graph (DYNAMIC in the file, in the
saved graph's own symbol names) and the test compiles its graph with them, as repro.py does; before,
every saved size was compiled static, so a kernel test of a symbolic graph tested another
compilation than the one the run made.

The in-process case saves the inference graph of `f` compiled with x's rows symbolic as `run --save-io`
does (saved_io.Writer), writes its kernel tests and runs the written test function here: it passes
on the healthy compiler and fails under an injected tanh bug. The slow case runs `tdbg run
--kernel-tests` on a script that calls one function at two sizes, then pytest on the folder.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from tdbg.compiler import config as tconfig
from tdbg.minifier.diagnose.kernel_tests import node_symbols, write_kernel_tests

HERE = os.path.dirname(os.path.abspath(__file__))


def f(x, w):
    h = torch.tanh(x @ w)
    return (h * 2 + 1).sum(dim=1)


def _save_symbolic_graph(folder, fn=f, x_shape=(100, 8), dim=0) -> str:
    """The aten inference graph of `fn` compiled with x's dim `dim` symbolic (default: f, x's rows,
    saved at 100 rows); the saved graph's name."""
    from tdbg.compiler import compile_aten, make_backend
    from tdbg.minifier.artifacts.saved_io import Writer
    captured = []

    def compile_one(gm, inputs, cfg, *, graph_name, kind):
        compiled = compile_aten(gm, inputs, cfg, graph_name=graph_name, kind=kind)

        def run(*args):
            captured.append((gm, kind, [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]))
            return compiled(*args)
        return run
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(*x_shape)
    torch._dynamo.mark_dynamic(x, dim)      # that dim symbolic, the rest static
    with torch.no_grad():
        torch.compile(fn, backend=make_backend(tconfig.current(), inner_compile=compile_one))(x, torch.randn(8, 4))
    gm, kind, inputs = captured[0]
    expected = list(gm(*inputs))
    writer = Writer(str(folder), {"backend": "inductor", "after": "aot"})
    name = writer.add(kind=kind, graph=0, call=1, gm=gm, inputs=inputs, expected=expected, compiled=expected,
                      compiled_error=None, node_sources={}, signature="sig",
                      replay={"backend": {"kind": "named", "name": "inductor"}, "config": {}, "after": "aot",
                              "aot": {"family": "tdbg", "graph": kind}})
    writer.finish()
    return name


def _run_written(path) -> None:
    spec = importlib.util.spec_from_file_location(f"ktd_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    next(getattr(module, n) for n in dir(module) if n.startswith("test_"))()


def test_a_symbolic_graphs_kernel_test_compiles_with_its_symbols(tmp_path, monkeypatch):
    name = _save_symbolic_graph(tmp_path / "io")
    recorded = json.loads((tmp_path / "io" / name / "meta.json").read_text())["replay"]["dynamic"]
    # x's rows are the graph's one symbol (an int input carries it too); w is static
    rows = next(dims[0] for dims in recorded.values() if len(dims) == 2)
    assert rows and sorted(map(tuple, recorded.values())) == sorted([(rows,), (rows, None)])
    result = write_kernel_tests(str(tmp_path / "io"), str(tmp_path / "kt"))
    assert (result.skipped, [t.ops for t in result.tests]) == ([], [["add", "mul", "sum", "tanh"]])
    text = open(result.files[0]).read()
    # the kernel reads the matmul's value, [rows, 4] in the symbolic graph: rows stays symbolic
    assert f"DYNAMIC = {{'mm': ({rows!r}, None)}}" in text
    _run_written(result.files[0])
    monkeypatch.setenv("TDBG_INJECT_BUG", "tanh:accuracy")   # the symbolic compile reads the environment
    with pytest.raises(AssertionError, match=f"kernel {result.tests[0].kernel} of {name} .* differs from eager"):
        _run_written(result.files[0])


def flat_tanh(x, w):
    h = torch.tanh(x.reshape(x.shape[0] * x.shape[1], 8))   # read through a view to [2*s, 8]
    return torch.tanh(h @ w).sum(dim=0)     # mm's value is [2*s, 4]


def test_sizes_computed_from_the_symbols_stay_symbolic_in_kernel_tests(tmp_path):
    """A view to [2*s, 8] reads a size node of the symbolic graph: written in as a constant (64) it
    pinned s when the test compiled symbolic; a tensor input of [2*s, 4] with no input holding s
    alone compiled static. Such kernel tests failed ("reached tdbg's compiler without its symbolic
    sizes": 76 of 184 for a BERT training step); now the size is an int input and 2*s a symbol."""
    _save_symbolic_graph(tmp_path / "io", flat_tanh, (2, 32, 8), 1)
    result = write_kernel_tests(str(tmp_path / "io"), str(tmp_path / "kt"))
    assert result.skipped == [] and len(result.tests) == 2
    texts = [open(path).read() for path in result.files]
    assert [bool(re.search(r"None, 64, None, 'int'\)", t)) for t in texts].count(True) == 1
    assert [bool(re.search(r"DYNAMIC = \{'mm': \('2\*s\d+', None\)\}", t)) for t in texts].count(True) == 1
    for path in result.files:
        _run_written(path)


def test_node_symbols_use_the_saved_names_and_expressions():
    """Every node's sizes in the saved graph's symbols: a view of x's rows times 8 is that
    expression of the recorded symbol, not of the fresh ShapeEnv's own symbol names."""
    from tdbg.repro_templates.runtime import DYNAMIC_META
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta[DYNAMIC_META] = ("s9", None)
    flat = graph.call_function(torch.ops.aten.view.default, (x, [-1]))
    graph.output((graph.call_function(torch.ops.aten.neg.default, (flat,)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert node_symbols(gm, [torch.randn(5, 8)]) == {"x": ("s9", None), "view_default": ("8*s9",), "neg_default": ("8*s9",)}
    x.meta.pop(DYNAMIC_META)
    assert node_symbols(gm, [torch.randn(5, 8)]) == {}


@pytest.mark.slow   # a tdbg run (two compiles, C++ builds) and two pytest processes: ~30 s on 2 cores
def test_cli_kernel_tests_of_a_two_size_script_carry_the_symbols_and_pass(tmp_path):
    script = tmp_path / "two_sizes.py"
    script.write_text("import torch\n\n\ndef f(x, w):\n    return (torch.tanh(x @ w) * 2 + 1).sum(dim=1)\n\n\n"
                      "fc = torch.compile(f)\nw = torch.randn(8, 4)\nfor rows in (16, 100):\n"
                      "    fc(torch.randn(rows, 8), w)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TDBG_", "TORCHDYNAMO_")) or k == "TDBG_CACHE_DIR"}
    out = tmp_path / "kt"
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", "run", str(script), "--backend", "tdbg",
                           "--kernel-tests", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(p for p in os.listdir(out) if p.startswith("test_"))
    # the first size compiled static, the second (Dynamo's automatic dynamic) with symbolic rows
    dynamic = [next(ln for ln in (out / p).read_text().splitlines() if ln.startswith("DYNAMIC = ")) for p in files]
    assert dynamic[0] == "DYNAMIC = {}" and dynamic[1].startswith("DYNAMIC = {'mm': ('s") and \
        dynamic[1].endswith("', None)}"), dynamic
    for extra, code in (({}, 0), ({"TDBG_INJECT_BUG": "tanh:accuracy"}, 1)):
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out)],
                             capture_output=True, text=True, timeout=600, env=dict(env, **extra), cwd=str(out))
        assert run.returncode == code, run.stdout
        assert f"{len(files)} {'passed' if code == 0 else 'failed'}" in run.stdout, run.stdout
