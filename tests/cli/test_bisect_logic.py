"""The bisection logic against a simulated compiler (no child processes): subsystem rows,
counted-application bisection for lowered ops and fusions, verdict and reproduction command."""
import pytest

from tdbg.minifier.diagnose import bisect as B

DEFAULT = {"fusion": True, "decompose": True, "parallel": True, "vectorize": True, "fallback_random": False,
           "fallback_ops": [], "max_lowered_ops": None, "max_fusions": None, "inject_bug": None,
           "cache_dir": "/c", "report_path": None}
LOWERED = ["add", "neg", "mul", "sum", "relu"]      # lowered in this order, kernels k0..k4
FUSIONS = [["add", "neg"], ["mul", "sum"], ["sum", "relu"]]


class FakeProber(B._Prober):
    """Fails (stage accuracy) when lowered op `bad_op` is lowered and, if `needs_fusion`, when
    fusion `bad_fusion` is accepted; writes report lines like the compiler's."""

    def __init__(self, bad_op="mul", needs_fusion=None):
        super().__init__("s.py", [], {}, 10.0, None, "/tmp")
        self.bad_op, self.needs_fusion = bad_op, needs_fusion
        self.base = {"config": dict(DEFAULT, inject_bug=["mul", "accuracy"]), "default_config": DEFAULT}

    def run(self, label, backend, changes=None):
        cfg = {**DEFAULT, **(changes or {})}
        n_low = len(LOWERED) if cfg["max_lowered_ops"] is None else cfg["max_lowered_ops"]
        lowered = [op for op in LOWERED[:n_low] if op not in cfg["fallback_ops"]
                   and f"aten.{op}.default" not in cfg["fallback_ops"]]
        n_fus = 0 if not cfg["fusion"] else (len(FUSIONS) if cfg["max_fusions"] is None else cfg["max_fusions"])
        fails = self.bad_op in lowered
        if self.needs_fusion is not None:
            fails = fails and n_fus > self.needs_fusion
        report = [{"graph": "g0", "kind": "inference",
                   "lowered": [{"index": i, "fx_node": op, "target": f"aten.{op}.default", "kernel": f"k{i}"}
                               for i, op in enumerate(LOWERED[:n_low])],
                   "fusions": [{"index": j, "nodes": nodes, "kernel": f"f{j}"} for j, nodes in enumerate(FUSIONS[:n_fus])]}]
        verdict = {"status": "failed" if fails else "ok", "stage": "accuracy" if fails else None,
                   "error": {"graph": 0, "frame": "fn"} if fails else None,
                   "graphs": [{"index": 0, "frame": "fn", "ops": LOWERED}], "report": report}
        self.runs.append({"label": label, "changes": changes or {}})
        return verdict


def _result(prober):
    failing = prober.run("backend inductor", "inductor")
    result = {"graph": None, "subsystems": [], "culprits": [], "workaround": None, "reproduce": None}
    B._into_compiler(prober, failing, result, jobs=1)
    return result


def test_lowered_op_bisection_names_node_kernel_and_workaround():
    result = _result(FakeProber(bad_op="mul"))
    assert [r["result"] for r in result["subsystems"]] == ["still fails"] * len(B.SUBSYSTEMS)
    (culprit,) = result["culprits"]
    assert {k: culprit[k] for k in ("kind", "count", "passes_with", "index", "fx_node", "kernel", "target")} == {
        "kind": "lowered op", "count": 3, "passes_with": 2, "index": 2, "fx_node": "mul", "kernel": "k2",
        "target": "aten.mul.default"}
    assert result["workaround"]["passes"] is True
    assert result["reproduce"]["env"] == {"TDBG_CONFIG": '{"inject_bug": ["mul", "accuracy"], "max_lowered_ops": 3}'}
    assert result["verdict"]["summary"] == ("tdbg's compiler fails (accuracy) in graph 0 of 1 (frame fn); culprit "
                                            "lowered op #2: FX node mul (aten.mul.default), kernel k2")


def test_fusion_dependent_failure_bisects_fusions_too():
    result = _result(FakeProber(bad_op="mul", needs_fusion=1))    # needs fusion #1 (mul+sum) accepted
    rows = {r["name"]: r["result"] for r in result["subsystems"]}
    assert rows["fusion"] == "passes" and rows["decompositions"] == "still fails"
    kinds = {c["kind"]: c for c in result["culprits"]}
    assert (kinds["fusion"]["index"], kinds["fusion"]["fx_node"], kinds["fusion"]["kernel"]) == (1, "mul, sum", "f1")
    assert kinds["lowered op"]["fx_node"] == "mul"
    assert "goes away without fusion" in result["verdict"]["summary"]


def test_failure_independent_of_lowering_has_no_culprit():
    prober = FakeProber(bad_op="never_lowered")
    prober.run = lambda label, backend, changes=None: {   # fails however much is lowered
        "status": "failed", "stage": "accuracy", "error": {"graph": None}, "graphs": [], "report": []}
    result = _result(prober)
    assert result["culprits"] == [] and "no single lowered op or fusion" in result["verdict"]["summary"]


@pytest.mark.parametrize("first_failing", range(1, 40, 7))
def test_grow_finds_a_failing_count_without_a_report(first_failing):
    seen = []

    def fails(n):
        seen.append(n)
        return n >= first_failing
    n = B._grow(fails)
    assert n >= first_failing and n < 2 * first_failing and seen == [2 ** i for i in range(len(seen))]
