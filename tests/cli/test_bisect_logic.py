"""The bisection logic against a simulated compiler (no child processes): subsystem rows,
counted-application bisection for lowered ops and fusions, verdict and reproduction command."""
import pytest

from tdbg.cli.bisect import _exit as bisect_exit
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


# -- torch's own layers: the probes simulated from the spec the probe backend would read ---------------
APPLIED = {"lowerings": ["amin", "neg", "amin_1"], "pre_grad_passes": ["p0"], "post_grad_passes": ["q0", "q1"],
           "joint_graph_passes": []}


class FakeTorchProber(B._Prober):
    """torch:inductor fails (accuracy) when lowering #`bad` is on; `broken` subsystems' probes die
    as a tdbg bug would (stage internal)."""

    def __init__(self, tmp, bad=1, broken=()):
        super().__init__("s.py", [], {}, 10.0, None, str(tmp))
        self.bad, self.broken = bad, broken
        self.base = {"config": DEFAULT, "default_config": DEFAULT}

    def run(self, label, backend, changes=None, env=None):
        env = env or {}
        self.runs.append({"label": label, "backend": backend, "env": env})
        if backend == B.PROBE_BACKEND:
            return self._probe(__import__("json").loads(env[B.PROBE_ENV]))
        if "TORCH_BISECT_MAX" in env:
            return self._verdict(env["TORCH_BISECT_SUBSYSTEM"] != "lowerings" or int(env["TORCH_BISECT_MAX"]) >= self.bad)
        return self._verdict(True)

    def _probe(self, spec):
        import json
        if spec["subsystem"] in self.broken:
            return {"status": "failed", "stage": "internal", "error": {"message": "KeyError: 'x'\nmore"}}
        applied = APPLIED.get(spec["subsystem"], [])
        mode, at, lowering = spec["mode"], spec["at"], spec["subsystem"] == "lowerings"
        on = {"disable": 0, "count": len(applied), "upto": (at or 0) + 1}[mode]
        with open(spec["out"], "w") as f:
            json.dump({"count": len(applied) if mode != "disable" else 0,
                       "debug": applied[at] if mode == "upto" and at < len(applied) else None,
                       "nodes": {"amin": "aten.amin.default", "neg": "aten.neg.default"}}, f)
        return self._verdict(not lowering or on > self.bad)

    @staticmethod
    def _verdict(fails):
        return {"status": "failed" if fails else "ok", "stage": "accuracy" if fails else None,
                "error": {"graph": 0, "frame": "f"} if fails else None,
                "graphs": [{"index": 0, "frame": "f", "ops": ["amin", "neg"]}], "report": []}


def _torch_result(prober):
    failing = prober.run("backend torch:inductor", "torch:inductor")
    result = {"chain": list(B.chain_for("torch:inductor")), "first_failing_backend": "torch:inductor",
              "graph": None, "subsystems": [], "culprits": [], "workaround": None, "reproduce": None}
    B._into_torch(prober, failing, result, jobs=1)
    return result


def test_torch_inductor_lowering_bisected_to_the_application(tmp_path):
    result = _torch_result(FakeTorchProber(tmp_path, bad=1))
    rows = {r["name"]: r["result"] for r in result["subsystems"]}
    assert rows["lowerings"] == "passes" and rows["post_grad_passes"] == "still fails"
    assert rows["cudagraphs"].startswith("not probed: it exists only for CUDA graphs")
    (culprit,) = result["culprits"]
    assert {k: culprit[k] for k in ("subsystem", "index", "count", "passes_with", "of", "applied", "target")} == {
        "subsystem": "lowerings", "index": 1, "count": 2, "passes_with": 1, "of": 3, "applied": "neg",
        "target": "aten.neg.default"}
    assert result["reproduce"]["env"] == {"TORCH_BISECT_BACKEND": "inductor", "TORCH_BISECT_SUBSYSTEM": "lowerings",
                                          "TORCH_BISECT_MAX": "1"}
    assert result["reproduce"]["checked"] == "fails the same way"
    assert result["reproduce"]["argv"][-3:] == ["--backend", "torch:inductor", "--check-accuracy"]
    assert result["verdict"]["summary"].startswith(
        "torch:inductor fails (accuracy) where torch:aot_eager_decomp_partition passes in graph 0 of 1 (frame f); "
        "switching off lowerings makes it pass; culprit: lowerings #1 of 3, the lowering of FX node neg "
        "(aten.neg.default)")


def test_torch_probe_that_cannot_run_is_said_plainly(tmp_path):
    result = _torch_result(FakeTorchProber(tmp_path, bad=0, broken=("lowerings",)))
    rows = {r["name"]: r["result"] for r in result["subsystems"]}
    assert rows["lowerings"] == "could not be probed: KeyError: 'x'"
    assert result["culprits"] == [] and result["reproduce"] is None
    summary = result["verdict"]["summary"]
    assert "no subsystem torch's bisector can switch off makes it pass" in summary
    assert "lowerings (could not be probed: KeyError: 'x')" in summary


CHAINS = {
    "inductor": ("eager", "aot_eager", "inductor"),
    "aot_eager": ("eager", "aot_eager"),
    "torch:inductor": ("eager", "torch:aot_eager", "torch:aot_eager_decomp_partition", "torch:inductor"),
    "torch:aot_eager": ("eager", "torch:aot_eager"),
    "torch:eager": ("torch:eager",),
    "torch:cudagraphs": ("eager", "torch:cudagraphs"),
    "pkg.mod:fn": ("eager", "pkg.mod:fn"),
}


@pytest.mark.parametrize("backend", sorted(CHAINS))
def test_chain_ends_at_the_chosen_backend(backend):
    assert B.chain_for(backend) == CHAINS[backend]


def test_subsystem_tables_follow_torchs_bisector():
    from torch._inductor.compiler_bisector import BACKENDS, ConfigChange
    for layer, rows in B.TORCH_SUBSYSTEMS.items():
        theirs = BACKENDS[layer]
        assert [r[0] for r in rows] == [s.name for s in theirs]
        for (name, kind, change, _), sub in zip(rows, theirs):
            assert (kind == "config") == isinstance(sub, ConfigChange)
            if kind == "config":
                assert change == {sub.config_field: sub.config_value}
    keys = list(BACKENDS)
    assert [keys.index(layer) for layer in B.TORCH_LAYERS] == sorted(keys.index(layer) for layer in B.TORCH_LAYERS)


def test_chain_that_cannot_reach_the_backend_says_so(tmp_path):
    prober = FakeTorchProber(tmp_path)
    prober.run = lambda label, backend, changes=None, env=None: (
        {"status": "ok", "compile_calls": 1} if backend in (None, "eager") else
        {"status": "failed", "stage": "bad_input", "error": {"message": "unknown backend 'torch:nope': ..."}})
    result = B._bisect(prober, 1, "torch:nope")
    assert result["verdict"] == {"level": "unreachable", "stage": "bad_input", "summary":
                                 "could not run backend torch:nope of the chain (unknown backend 'torch:nope': ...)"}


def test_tdbg_failing_itself_stops_the_bisection_instead_of_hunting_a_culprit(tmp_path):
    """A probe whose failure is tdbg's own (stage internal: e.g. this torch lacks an internal tdbg
    needs) says so; bisecting compiler subsystems from it would name a culprit in a healthy graph."""
    prober = FakeTorchProber(tmp_path)
    message = "tdbg needs torch._dynamo.x (why); this torch 2.99 lacks it."
    prober.run = lambda label, backend, changes=None, env=None: (
        {"status": "ok", "compile_calls": 1} if backend in (None, "eager", "aot_eager") else
        {"status": "failed", "stage": "internal", "error": {"message": message}})
    result = B._bisect(prober, 1, "inductor")
    assert result["verdict"] == {"level": "unreachable", "stage": "internal",
                                 "summary": f"could not run backend tdbg's compiler (inductor) of the chain ({message})"}
    assert "subsystems" not in result or not result["subsystems"]
    assert bisect_exit(result) == 70


def test_a_layer_failing_before_the_chosen_backend_says_the_backend_did_not_run():
    verdict = B._chain_verdict("torch:aot_eager", {"stage": "aot_autograd"}, B.chain_for("torch:inductor"))
    assert verdict["level"] == "aot_autograd"
    assert verdict["summary"].endswith(
        "; the chain stopped there, so torch:aot_eager_decomp_partition, torch:inductor did not run")
    assert B._chain_verdict("aot_eager", {"stage": "aot_autograd"}, B.chain_for("aot_eager"))["summary"].endswith(
        "(tracing to aten, a decomposition, or partitioning)")


PROBE_CHILD = """
import json, os, sys, torch
from tdbg.minifier.diagnose import bisect as B
def f(x):
    return x.neg(), torch.amin(x, 1)
torch._dynamo.optimize(B.torch_probe)(f)(torch.ones(2, 3))
"""


def test_probe_backend_drives_torchs_bisector_in_a_real_child(tmp_path):
    """The probe backend against the installed torch: lowerings #0..0 on (neg lowered, amin run by
    aten), every application counted, the bisector's debug info and the node's target recorded."""
    import json
    import subprocess
    import sys
    out = tmp_path / "probe.json"
    spec = {"backend": "inductor", "subsystem": "lowerings", "mode": "upto", "at": 0, "out": str(out)}
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TORCH_BISECT_")}
    child = tmp_path / "probe_child.py"     # a file: its nodes get stack traces (a `-c` string gets none)
    child.write_text(PROBE_CHILD)
    proc = subprocess.run([sys.executable, str(child)], env=dict(env, **{B.PROBE_ENV: json.dumps(spec)}),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert (doc["count"], doc["debug"]) == (2, "neg")
    assert doc["kernels"] == ["cpp_fused_neg_0"]     # amin ran by aten: no kernel of its own
    assert {doc["nodes"]["neg"], doc["nodes"]["amin"]} == {"aten.neg.default", "aten.amin.default"}
    # the stack trace bisect reads the culprit's own user line from
    assert f'File "{child}", line 5, in f' in doc["traces"]["neg"]


def test_decomposition_debug_info_reads_as_the_op():
    # what torch 2.13's bisector records for the decomposition subsystem (repr of the OpOverload)
    assert B._readable("<OpOverload(op='aten.add', overload='Tensor')>") == "aten.add.Tensor"
    assert B._readable("amin") == "amin" and B._readable(None) is None


def test_each_subsystem_row_switches_a_real_config_field_away_from_its_default():
    from tdbg.compiler.config import Config
    default = Config()
    for name, change, _ in B.SUBSYSTEMS:
        switched = default.replace(**change)   # raises on an unknown field or value
        assert all(getattr(switched, k) != getattr(default, k) for k in change), name
