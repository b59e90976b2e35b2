"""Failure signatures, in-process evaluation, and isolated warm workers (crash, hang)."""
import os
import signal

import pytest
import torch

from tdbg.minifier.artifacts.graph_io import case_source
from tdbg.minifier.reduce.oracle import Outcome, Signature, evaluate, normalize
from tdbg.minifier.reduce.workers import Pool
from mincases import make_case

RAISES = """
def picky(gm, example_inputs):
    if any(n.target is torch.neg for n in gm.graph.nodes):
        raise NotImplementedError(f"picky: no neg at /tmp/x{len(gm.graph.nodes)}.cpp:12")
    return gm
"""
WRONG = """
def wrong(gm, example_inputs):
    def run(*args):
        out = gm(*args)
        return tuple(o + 1 if i == 1 else o for i, o in enumerate(out))
    return run
"""
CRASH = """
def segv(gm, example_inputs):
    import os, signal
    if any(n.target is torch.neg for n in gm.graph.nodes):
        os.kill(os.getpid(), signal.SIGSEGV)
    return gm
"""
HANG = """
def slow(gm, example_inputs):
    import time
    time.sleep(60)
    return gm
"""


def spec(source, name, **extra):
    return {"after": "dynamo", "backend": {"kind": "source", "name": name, "source": source},
            "config": {}, **extra}


def two_outputs(x):
    return torch.neg(x), torch.sin(x)


@pytest.fixture(scope="module")
def pool():
    with Pool(timeout=5.0) as p:
        yield p


def test_compile_error_signature_blurs_paths_and_numbers():
    case, store = make_case(two_outputs, torch.ones(3))
    o = evaluate(case.gm, store.values(case.inputs), spec(RAISES, "picky"))
    assert (o.kind, o.exc_type, o.pattern) == ("compile_error", "NotImplementedError", "picky: no neg at <path>:N")
    assert Signature.of(o).matches(Outcome("compile_error", "NotImplementedError", pattern=o.pattern))
    assert not Signature.of(o).matches(Outcome("compile_error", "RuntimeError", pattern=o.pattern))
    assert not Signature.of(o).matches(Outcome("runtime_error", "NotImplementedError", pattern=o.pattern))


def test_check_str_narrows_the_signature():
    o = Outcome("compile_error", "E", "boom in kernel A", "boom in kernel A")
    assert Signature.of(o, "kernel A").matches(o)
    assert not Signature.of(o, "kernel A").matches(Outcome("compile_error", "E", "boom in kernel B", o.pattern))


def test_accuracy_names_the_output():
    case, store = make_case(two_outputs, torch.ones(3))
    o = evaluate(case.gm, store.values(case.inputs), spec(WRONG, "wrong", check_accuracy=True))
    assert o.kind == "accuracy" and o.outputs == ("out[1]",)
    assert "max abs error 1" in o.mismatches[0]["message"]
    assert evaluate(case.gm, store.values(case.inputs), spec(WRONG, "wrong", check_accuracy=True,
                                                             tolerance=2.0)).kind == "pass"


def test_a_graph_that_fails_eagerly_is_invalid_not_a_compiler_failure():
    case, store = make_case(lambda x, y: torch.mm(x, y), torch.ones(2, 3), torch.ones(2, 3))
    assert evaluate(case.gm, store.values(case.inputs), spec(WRONG, "wrong")).kind == "invalid"


def test_normalize():
    assert normalize("error at /a/b/c.cpp:10:3 in tmp12 (0xdeadbeef)") == "error at <path>:N:N in tmpN (<addr>)"


def test_worker_reports_a_crash_with_its_signal_and_carries_on(pool):
    case, store = make_case(two_outputs, torch.ones(3))
    crash = pool.query(case_source(case), list(case.inputs), store, spec(CRASH, "segv"))
    assert (crash.kind, crash.signal) == ("crash", signal.SIGSEGV)
    ok, _ = make_case(lambda x: torch.sin(x), torch.ones(3))
    assert pool.query(case_source(ok), list(ok.inputs), store, spec(CRASH, "segv")).kind == "pass"
    assert pool.replaced == 0  # only the forked child died


def test_worker_turns_a_hang_into_a_timeout(pool):
    case, store = make_case(two_outputs, torch.ones(3))
    hang = pool.query(case_source(case), list(case.inputs), store, spec(HANG, "slow"))
    assert hang.kind == "hang"
    assert pool.query(case_source(case), list(case.inputs), store, spec(RAISES, "picky")).kind == "compile_error"


FLAKY = """
def flaky(gm, example_inputs):
    import os
    path = COUNTER
    n = int(open(path).read()) if os.path.exists(path) else 0
    open(path, "w").write(str(n + 1))
    if n % 2 == 0:
        raise RuntimeError("fails every other time")
    return gm
"""


def test_a_failure_that_does_not_repeat_is_flaky_not_minified(pool, tmp_path):
    from tdbg.minifier.artifacts.repro import Dump
    from tdbg.minifier.reduce.session import minify_dump
    case, store = make_case(two_outputs, torch.ones(3))
    source = FLAKY.replace("COUNTER", repr(str(tmp_path / "count")))
    report = minify_dump(Dump(case, store, spec(source, "flaky")), str(tmp_path / "out"), pool=pool)
    assert report.status == "flaky"
    assert (report.first.kind, report.second.kind) == ("compile_error", "pass")
    assert not os.path.exists(tmp_path / "out" / "repro.py")


def test_a_graph_that_does_not_fail_is_reported_not_minified(pool, tmp_path):
    from tdbg.minifier.artifacts.repro import Dump
    from tdbg.minifier.reduce.session import minify_dump
    case, store = make_case(lambda x: torch.sin(x), torch.ones(3))
    report = minify_dump(Dump(case, store, spec(RAISES, "picky")), str(tmp_path / "out"), pool=pool)
    assert report.status == "no_failure" and report.first.kind == "pass"


def test_a_backend_that_does_not_import_is_cannot_run_never_minified(pool, tmp_path):
    """Before: the ModuleNotFoundError became the signature and was 'minimized' (exit 0)."""
    from tdbg.minifier.artifacts.repro import Dump
    from tdbg.minifier.reduce.session import minify_dump
    case, store = make_case(two_outputs, torch.ones(3))
    gone = {"after": "dynamo", "config": {}, "backend": {"kind": "import", "module": "no_such_backend_module",
                                                          "attr": "f", "files": [], "root": str(tmp_path)}}
    report = minify_dump(Dump(case, store, gone), str(tmp_path / "out"), pool=pool)
    assert (report.status, report.first.kind) == ("cannot_run", "cannot_run")
    assert "the backend module 'no_such_backend_module' does not import" in report.first.message


def test_after_aot_queries_compile_with_the_recorded_aot_autograd_compiler(tmp_path):
    """An aot_autograd backend's backward graph is compiled by its bw_compiler, not tdbg's."""
    (tmp_path / "aotbk.py").write_text(
        "from torch._dynamo.backends.common import aot_autograd\n"
        "def fw(gm, inputs):\n    return gm\n"
        "def bw(gm, inputs):\n    raise RuntimeError('bw_compiler was used')\n"
        "backend = aot_autograd(fw_compiler=fw, bw_compiler=bw)\n")
    case, store = make_case(two_outputs, torch.ones(3))
    spec_ = {"after": "aot", "config": {}, "aot": {"family": "aot_autograd", "graph": "backward"},
             "backend": {"kind": "import", "module": "aotbk", "attr": "backend", "files": ["aotbk.py"],
                         "root": str(tmp_path)}}
    out = evaluate(case.gm, store.values(case.inputs), spec_)
    assert (out.kind, out.exc_type, out.message) == ("compile_error", "RuntimeError", "bw_compiler was used")
    out = evaluate(case.gm, store.values(case.inputs), dict(spec_, aot={"family": "aot_autograd", "graph": "forward"}))
    assert out.kind == "pass"


def test_an_inductor_forward_graph_with_parameters_runs_without_autograd_as_aot_runs_it():
    """Before: the recorded parameters require grad, Inductor's addmm(out=...) refused them, and
    every after-aot query of a training graph was a false runtime error."""
    def forward(x, w, b):
        return (torch.ops.aten.addmm.default(b, x, torch.ops.aten.permute.default(w, [1, 0])),)
    torch.manual_seed(0)
    case, store = make_case(forward, torch.randn(3, 4), torch.randn(2, 4, requires_grad=True),
                            torch.randn(2, requires_grad=True))
    assert [s.requires_grad for s in case.inputs] == [False, True, True]
    spec_ = {"after": "aot", "config": {}, "check_accuracy": True, "backend": {"kind": "named", "name": "torch:inductor"},
             "aot": {"family": "torch:inductor", "graph": "forward"}}
    out = evaluate(case.gm, store.values(case.inputs), spec_)
    assert out.kind == "pass", out.report()
