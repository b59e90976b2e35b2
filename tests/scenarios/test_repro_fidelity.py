"""repro.py reproduces what the minifier reproduced, or minify says so (issue 22, items 3 and 4).

Scenarios: PyTorch issue #175966 (Inductor computes `arange(L) * torch.tensor(1_000_000_000)` in
32 bits) minified after aot and after dynamo, static and dynamic shapes, and a user backend that
edits Dynamo's GraphModule in place. Each asserts minify's exit code, the minimized graph, the
fresh-process check minify ran itself, and repro.py's exit code when a user runs it from another
folder with tdbg unimportable (16: the accuracy failure reproduced).

Unit level: the graph repro.py rebuilds is the graph every query ran (input-free factory calls
stay calls, tensor constants stay get_attr constants with their strides), eager references never
run a backend's in-place edit, and a repro that does not reproduce fails minify with exit 70.
"""
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

from test_repro_exit_codes import run_repro

from tdbg.cli.console import exit_code
from tdbg.minifier.artifacts.graph_io import TensorStore, case_source, from_graph_module, trace_source
from tdbg.minifier.artifacts.repro import Dump, load, write

S = "tests/scenarios/scripts"
ISSUE = f"{S}/issue_175966_int64_arange.py"
BACKENDS = f"{S}/user_backends.py"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# How many of the 16 differ depends on Inductor's vector width (13 with AVX-512, 10 with AVX2): the
# elements it computes in its vector loop and those of the scalar tail overflow differently; at
# most 13 can (i * 10**9 fits 32 bits for i < 3).
REPRODUCED_16 = ("Reproduced: accuracy mismatch in out[0]",
                 r"  out\[0\]: ([1-9]|1[0-3]) of 16 elements differ; first at \(3,\): expected 3000000000, got -1294967296")


def reproduced_16(lines: list) -> bool:
    return len(lines) >= 2 and lines[0] == REPRODUCED_16[0] and re.fullmatch(REPRODUCED_16[1], lines[1]) is not None
IOTA = ("torch.ops.prims.iota.default({n}, start = 0, step = 1, dtype = torch.int64, device = device(type='cpu'), "
        "requires_grad = False)")
FULL = ("full_default = torch.ops.aten.full.default([], 1000000000, dtype = torch.int64, layout = torch.strided, "
        "device = device(type='cpu'), pin_memory = False)")
# name -> (extra minify arguments, minimized forward's signature and body lines, nodes, inputs)
CASES = {
    "aot": (("--backend", "torch:inductor", "--after", "aot"), "def forward(self):",
            [f"iota = {IOTA.format(n=16)}", FULL], 4, 0),
    "dynamo": (("--backend", "torch:inductor", "--after", "dynamo"), "def forward(self):",
               ["arange = torch.arange(16, dtype = torch.int64)", "tensor = torch.tensor(1000000000)"], 4, 0),
    "aot_dynamic": (("--backend", "torch:inductor", "--after", "aot", "--", "dynamic"),
                    "def forward(self, primals_3):", [f"iota = {IOTA.format(n='primals_3')};  primals_3 = None",
                                                      FULL], 5, 1),
    "dynamo_dynamic": (("--backend", "torch:inductor", "--after", "dynamo", "--", "dynamic"), None,
                       ["tensor = torch.tensor(1000000000)"], 5, 1),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return tmp_path_factory.mktemp("fidelity")


def _minify_args(name, folders):
    extra = CASES[name][0]
    cut = extra.index("--") if "--" in extra else len(extra)
    return ("minify", ISSUE, *extra[:cut], "--level", "4", "--out", str(folders / name), *extra[cut:])


IN_PLACE = ("minify", f"{S}/third_call.py", "--backend", f"{BACKENDS}:edits_in_place", "--after", "dynamo",
            "--level", "4")


@pytest.fixture(scope="module")
def runs(tdbg_runs, folders):
    commands = {name: (_minify_args(name, folders), {}) for name in CASES}
    commands["in_place"] = ((*IN_PLACE, "--out", str(folders / "in_place")), {})
    tdbg_runs.start(*commands.values())
    return lambda name: tdbg_runs(*commands[name])


@pytest.mark.parametrize("name", list(CASES))
def test_issue_175966_minified_repro_reproduces_from_another_folder(name, runs, folders, tmp_path):
    r = runs(name)
    _, signature, lines, nodes, inputs = CASES[name]
    assert r.code == 0, r.output
    doc = r.json
    assert doc["status"] == "minified"
    assert (doc["minimized"]["nodes"], doc["minimized"]["inputs"]) == (nodes, inputs)
    code = doc["minimized"]["code"]
    if signature:
        assert signature in code
    for line in lines:
        assert line in code, code
    assert code.count(" * ") + code.count("aten.mul.Tensor(") == 1
    check = doc["repro_check"]
    assert (check["code"], check["expected_code"], check["reproduced"]) == (16, 16, True)
    assert reproduced_16(check["lines"]), check["lines"]
    run = run_repro(str(folders / name), tmp_path)      # another folder, tdbg unimportable
    assert run.returncode == 16, run.stdout + run.stderr
    assert run.stdout.splitlines()[:2] == check["lines"][:2]   # the same mismatch minify's own check saw


def test_in_place_editing_backend_is_minified_against_an_untouched_eager_graph(runs, folders, tmp_path):
    r = runs("in_place")
    assert r.code == 0, r.output
    assert "Not reproduced" not in r.output
    doc = r.json
    assert (doc["status"], doc["minimized"]["nodes"], doc["minimized"]["inputs"]) == ("minified", 3, 1)
    assert "relu = torch.relu(l_x_)" in doc["minimized"]["code"]
    assert doc["repro_check"]["code"] == 16
    assert "Checked: repro.py reproduces it in a fresh process from another folder (exit 16, " in r.stdout
    run = run_repro(str(folders / "in_place"), tmp_path)
    assert run.returncode == 16, run.stdout + run.stderr
    assert run.stdout.splitlines()[:2] == [
        "Reproduced: accuracy mismatch in out[0]",
        "  out[0]: max abs error 3 at (0, 0): expected 0, got 3 (rtol=1.3e-05, atol=1e-05)"]


# ---------------------------------------------------------------- unit level (no Inductor)

# Backends that are wrong only on a graph's form, the way Inductor's #175966 codegen is: each
# adds 1 to the outputs when the graph it is given has that form.
FORM_BACKENDS = '''
import sys

import torch


def _off_by_one(gm):
    def run(*args):
        return [o + 1 for o in gm(*args)]
    return run


def wrong_on_full(gm, example_inputs):
    if any(n.target is torch.ops.aten.full.default for n in gm.graph.nodes):
        return _off_by_one(gm)
    return gm.forward


def wrong_on_constants(gm, example_inputs):
    consts = [getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
    if consts and all(c.stride() == (1, 3) for c in consts):
        return _off_by_one(gm)
    return gm.forward


def wrong_under_tdbg(gm, example_inputs):
    # process state repro.py does not carry: wrong only where tdbg's minifier is loaded
    if "tdbg.minifier.reduce.workers" in sys.modules:
        return _off_by_one(gm)
    return gm.forward


def edits_in_place(gm, example_inputs):
    for n in gm.graph.nodes:
        if n.target is torch.ops.aten.neg.default:
            n.target = torch.ops.aten.abs.default
    gm.recompile()
    return gm.forward
'''


def _dump(tmp_path, gm, inputs, attr, name="dump") -> str:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "formbk.py").write_text(FORM_BACKENDS)
    store = TensorStore()
    case = from_graph_module(gm, inputs, store)
    spec = {"after": "dynamo", "config": {}, "check_accuracy": True, "tolerance": None, "ignore_non_fp": False,
            "backend": {"kind": "import", "module": "formbk", "attr": attr, "files": ["formbk.py"],
                        "root": str(src)}}
    expected = {"kind": "accuracy", "exc_type": "", "pattern": "", "signal": 0, "check_str": ""}
    out = tmp_path / name
    write(str(out), Dump(case, store, spec, expected))
    return str(out)


def _input_free_graph() -> fx.GraphModule:
    graph = fx.Graph()
    iota = graph.call_function(torch.ops.prims.iota.default, (16,), {
        "start": 0, "step": 1, "dtype": torch.int64, "device": torch.device("cpu"), "requires_grad": False})
    full = graph.call_function(torch.ops.aten.full.default, ([], 1000000000), {"dtype": torch.int64})
    graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (iota, full)),))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_repro_py_rebuilds_input_free_factory_calls_as_calls_not_one_folded_constant(tmp_path):
    """The #175966 root cause: repro.py traced with plain symbolic_trace, which ran iota/full/mul at
    trace time and gave the backend one precomputed constant, so the bug's ops were gone."""
    folder = _dump(tmp_path, _input_free_graph(), [], "wrong_on_full")
    assert [n.op for n in load(folder).case.gm.graph.nodes] == ["call_function"] * 3 + ["output"]
    run = run_repro(folder, tmp_path)
    assert run.returncode == 16, run.stdout + run.stderr
    assert run.stdout.splitlines()[0] == "Reproduced: accuracy mismatch in out[0]"


class _WithBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.arange(6.0).reshape(2, 3).t())   # strides (1, 3)

    def forward(self, x):
        return (x * self.scale,)


def test_tensor_constants_stay_inline_with_their_strides_in_queries_and_repro_py(tmp_path):
    store = TensorStore()
    case = from_graph_module(fx.symbolic_trace(_WithBuffer()), [torch.ones(3, 2)], store)
    assert [(n.op, n.target) for n in case.gm.graph.nodes if n.op != "call_function"] == [
        ("placeholder", "x"), ("get_attr", "scale"), ("output", "output")]
    assert [s.name for s in case.inputs] == ["x"]
    [constant] = case.constants
    assert (constant.name, constant.shape, constant.stride, constant.dtype) == (
        "scale", (3, 2), (1, 3), "torch.float32")
    queried = trace_source(case_source(case), constants=case.constants, store=store)   # what a worker runs
    assert queried.scale.stride() == (1, 3) and torch.equal(queried.scale, _WithBuffer().scale)
    folder = _dump(tmp_path, fx.symbolic_trace(_WithBuffer()), [torch.ones(3, 2)], "wrong_on_constants")
    back = load(folder).case
    assert [c.name for c in back.constants] == ["scale"] and back.gm.scale.stride() == (1, 3)
    run = run_repro(folder, tmp_path)
    assert run.returncode == 16, run.stdout + run.stderr


def _neg_graph() -> fx.GraphModule:
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output((graph.call_function(torch.ops.aten.neg.default, (x,)),))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_eager_reference_never_runs_an_in_place_edit_of_the_backend(tmp_path):
    """neg -> abs in the GraphModule the backend is given: eager (and its float64 reference) must
    still compute neg, in repro.py as in every minifier query (runtime.evaluate)."""
    from tdbg.minifier.diagnose import accuracy
    from tdbg.repro_templates import runtime
    folder = _dump(tmp_path, _neg_graph(), [torch.arange(-2.0, 2.0)], "edits_in_place")
    dump = load(folder)
    result = runtime.evaluate(dump.case.gm, dump.store.values(dump.case.inputs), dump.spec, folder, accuracy)
    assert (result["kind"], result["outputs"]) == ("accuracy", ["out[0]"])
    run = run_repro(folder, tmp_path)
    assert run.returncode == 16, run.stdout + run.stderr


def test_minify_fails_with_exit_70_when_the_written_repro_does_not_reproduce(tmp_path):
    """Every query fails (tdbg's worker has the minifier loaded), repro.py run as a user runs it
    passes: minify must not report success, and says what repro.py did."""
    folder = _dump(tmp_path, _neg_graph(), [torch.arange(-2.0, 2.0)], "wrong_under_tdbg")
    out, doc_path = tmp_path / "min", tmp_path / "doc.json"
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", "minify", folder, "--out", str(out),
                           "--json", str(doc_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == exit_code("internal") == 70, proc.stdout + proc.stderr
    doc = json.loads(doc_path.read_text())
    assert (doc["status"], doc["exit_code"]) == ("repro_failed", 70)
    check = doc["repro_check"]
    assert (check["code"], check["expected_code"], check["reproduced"]) == (21, 16, False)
    assert check["lines"] == ["Not reproduced: passed: compiled results match eager"]
    assert "but the written repro.py does not reproduce it" in proc.stderr
    assert "exited with code 21 (expected 16: the failure reproduced)" in " ".join(proc.stderr.split())
    assert "| Not reproduced: passed: compiled results match eager" in proc.stderr
    assert sorted(os.listdir(out)) == ["formbk.py", "inputs", "minifier_launcher.py", "minify.jsonl", "repro.py"]
