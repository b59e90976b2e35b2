"""Names that do not mislead (issue 25 §2): `--backend tdbg` is `--backend inductor` (tdbg's
compiler) in every command, output names it "tdbg's compiler (inductor)" and never "backend
inductor" (which reads as PyTorch's Inductor, always `torch:inductor`), and Dynamo's resume
functions are shown by the user's function.

The command table runs each command in this process (click's CliRunner) with its library entry
replaced by a canned result, so it checks what reaches the library and what the command prints;
one real `tdbg explain` on the graph-break example checks the same on a real tdbg-compiler run.
"""
import json
import os
import re
import types

import pytest
from click.testing import CliRunner

from tdbg.cli.console import exit_code
from tdbg.cli.main import cli
from tdbg.minifier.diagnose import bisect as B
from tdbg.minifier.runs import names

SCRIPT = "examples/toy_example.py"          # parses; never run by the in-process rows
RESUME = "torch_dynamo_resume_in_train_step_at_12"
RESUMED = "train_step, resumed after the break at line 12"
# "backend inductor" anywhere but in a command line's `--backend inductor`
BARE = re.compile(r"(?<!--)backend inductor\b")


@pytest.mark.parametrize("name, label", [
    ("inductor", "tdbg's compiler (inductor)"),
    ("tdbg", "tdbg's compiler (inductor)"),
    ("torch:tdbg", "tdbg's compiler (torch:tdbg)"),
    ("torch:inductor", "torch:inductor"),
    ("aot_eager", "aot_eager"),
    ("pkg.mod:fn", "pkg.mod:fn"),
    (None, "?"),
])
def test_backend_label(name, label):
    assert names.backend_label(name) == label


def test_tdbg_is_the_canonical_inductor():
    assert [names.canonical_backend(n) for n in ("tdbg", "inductor", "torch:inductor", "own", None)] == [
        "inductor", "inductor", "torch:inductor", "own", None]


@pytest.mark.parametrize("frame, label, function", [
    ("train_step", "train_step", "train_step"),
    (RESUME, RESUMED, "train_step"),
    # a resume of a resume: the innermost break's line (where this frame starts)
    ("torch_dynamo_resume_in_torch_dynamo_resume_in_f_at_7_at_9", "f, resumed after the break at line 9", "f"),
    # a function whose own name looks like Dynamo's suffix
    ("torch_dynamo_resume_in_look_at_3_at_5", "look_at_3, resumed after the break at line 5", "look_at_3"),
    (None, "<unknown>", "<unknown>"),
])
def test_frame_label(frame, label, function):
    assert (names.frame_label(frame), names.function_of(frame)) == (label, function)
    assert names.is_frame_of(frame, function)
    # a user line (errors' and culprits' `source`) is in the user's function too
    assert names.source_line("t.py", 13, frame, "return x") == f"t.py:13 in {function}: return x"


# -- every command, in this process -------------------------------------------------------------
ASKED = {"asked": "torch:inductor (torch.compile's default)", "asked_name": "torch:inductor", "mode": None,
         "options": None, "ran": "inductor", "replaced": True, "calls": [1]}
GRAPHS = [{"index": 0, "frame": "train_step", "ops": ["mul"], "lines": [], "checked": True, "checked_calls": 1,
           "grads_checked": 0},
          {"index": 1, "frame": RESUME, "ops": ["add"], "lines": [], "checked": False}]


def _verdict(failed: bool) -> dict:
    error = {"stage": "lowering", "type": "LoweringError", "message": "boom", "graph": 1, "frame": RESUME,
             "during": "compile"}
    return {"status": "failed" if failed else "ok", "stage": "lowering" if failed else None, "compile_calls": 1,
            "duration_s": 0.1, "check_policy": {"calls": 3}, "graphs": GRAPHS, "guards": [], "recompiles": [],
            "compile_backends": {"rows": [ASKED], "names": ["torch:inductor"], "unnamed": []},
            "error": error if failed else None, "script_exit_code": 0}


class _ChainProber(B._Prober):
    """bisect's prober with canned runs: eager and aot_eager pass, tdbg's compiler fails in the
    resume function's graph whatever is switched off (so no culprit: the verdict names the graph)."""

    def __init__(self, on_step):
        super().__init__(SCRIPT, [], {}, 10.0, on_step, "/tmp")
        self.base = {"config": {}, "default_config": {}}

    def run(self, label, backend, changes=None, env=None):
        failed = backend == "inductor"
        verdict = dict(_verdict(failed), stage="accuracy" if failed else None,
                       error={"stage": "accuracy", "graph": 1, "frame": RESUME} if failed else None)
        record = {"label": label, "backend": backend, "changes": changes or {}, "env": env or {},
                  "status": verdict["status"], "stage": verdict["stage"], "duration_s": 0.1, "error": None}
        self.runs.append(record)
        self.on_step(record)
        return verdict


def _patch_run(monkeypatch, seen, failed):
    from tdbg.minifier.runs import runner

    def run_script(request, **_):
        seen.append(request.backend)
        return _verdict(failed)
    monkeypatch.setattr(runner, "run_script", run_script)


def _patch_bisect(monkeypatch, seen):
    def bisect(script, argv, changes, *, backend, timeout, jobs, on_step):
        seen.append(backend)
        prober = _ChainProber(on_step)
        result = B._bisect(prober, 1, backend)
        result.update(runs=prober.runs, duration_s=0.3)
        return result
    monkeypatch.setattr(B, "bisect", bisect)


def _patch_minify(monkeypatch, seen):
    from tdbg.cli import minify

    def run(target, args, after, level, backend, *rest):
        seen.append(backend)
        return 0
    monkeypatch.setattr(minify, "_run", run)


def _patch_profile(monkeypatch, seen):
    from tdbg.minifier.diagnose import profiling

    def profile_script(script, argv, *, backend, **_):
        seen.append(backend)
        raise ValueError("stopped by the test after the backend was chosen")
    monkeypatch.setattr(profiling, "profile_script", profile_script)


def _patch_replay(monkeypatch, seen):
    from tdbg.minifier.artifacts import saved_io
    from tdbg.minifier.diagnose import replay
    graph = types.SimpleNamespace(name="g0_forward_c1", kind="forward", symbolic_text="")
    monkeypatch.setattr(saved_io, "load_saved", lambda directory: types.SimpleNamespace(graphs=[graph]))

    def replay_graph(graph, backend):
        seen.append(backend)
        doc = {"status": "ok", "stage": None, "graph": graph.name, "kind": graph.kind, "backend": backend,
               "max_abs_error": 0.0, "outputs": 1, "seconds": 0.1, "config": {}}
        return types.SimpleNamespace(to_dict=lambda: doc)
    monkeypatch.setattr(replay, "replay", replay_graph)


SAVED = os.path.join("tests", "report", "data", "saved_io")   # its graphs are never loaded here
# command -> (arguments after the command, patch, exit code name, phrases its output must hold)
COMMANDS = {
    "run ok": (["run", SCRIPT], lambda m, s: _patch_run(m, s, False), "ok", [
        "compiled by tdbg's compiler (inductor); results match eager on 1 of 2 graph(s)",
        "replaced: your script asked for torch:inductor (torch.compile's default) (torch.compile call 1); ran "
        "tdbg's compiler (inductor) instead (--backend inductor)",
        f"not checked: graph 1 (frame {RESUMED}) was compiled but never called"]),
    "run failed": (["run", SCRIPT], lambda m, s: _patch_run(m, s, True), "lowering", [
        "backend: tdbg's compiler (inductor)", f"graph: 1 (frame {RESUMED}) while compiling",
        f"tdbg bisect {SCRIPT} --backend inductor"]),
    "explain": (["explain", SCRIPT], lambda m, s: _patch_run(m, s, False), "ok", [
        f"{SCRIPT} under tdbg's compiler (inductor):", f"graph 1 ({RESUMED}): 1 op(s): add"]),
    "compare": (["compare", SCRIPT], lambda m, s: _patch_run(m, s, True), "lowering", [
        "ran tdbg's compiler (inductor) instead", f"`tdbg run {SCRIPT} --backend inductor` reports it in full"]),
    "bisect": (["bisect", SCRIPT], _patch_bisect, "accuracy", [
        "run backend tdbg's compiler (inductor)", "+ tdbg's compiler (generated C++)",
        f"Verdict: tdbg's compiler fails (accuracy) in graph 1 of 2 (frame {RESUMED})"]),
    "minify": (["minify", SCRIPT, "--out", "{tmp}/m"], _patch_minify, "ok", []),
    "profile": (["profile", SCRIPT, "--trace", "{tmp}/t.json"], _patch_profile, "bad_input",
                ["stopped by the test"]),
    "replay": (["replay", SAVED], _patch_replay, "ok", ["backend tdbg's compiler (inductor)"]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_backend_tdbg_is_tdbgs_compiler_in_every_command(command, monkeypatch, tmp_path):
    args, patch, code, phrases = COMMANDS[command]
    seen: list = []
    patch(monkeypatch, seen)
    doc = tmp_path / "doc.json"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args] + ["--backend", "tdbg", "--json", str(doc)]
    result = CliRunner().invoke(cli, argv, env={"COLUMNS": "200"})
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == exit_code(code), result.output
    assert seen and set(seen) == {"inductor"}, seen     # the library only ever sees the canonical name
    for phrase in phrases:
        assert phrase in result.output, result.output
    assert not BARE.search(result.output), result.output
    assert "torch_dynamo_resume" not in result.output, result.output
    if doc.exists() and json.loads(doc.read_text()).get("backend") is not None:
        assert json.loads(doc.read_text())["backend"] == "inductor"    # JSON keeps the canonical name


def test_a_misspelled_tdbg_is_offered_tdbg():
    result = CliRunner().invoke(cli, ["run", SCRIPT, "--backend", "tbdg"])
    assert result.exit_code == exit_code("bad_input")
    assert "unknown backend 'tbdg' (did you mean tdbg?)" in " ".join(result.output.split())


# -- one real run of tdbg's compiler on a script with graph breaks ------------------------------
@pytest.mark.scenario("explain_toy_tdbg")
def test_a_real_tdbg_run_names_its_compiler_and_the_users_functions(scenarios):
    r = scenarios["explain_toy_tdbg"]
    assert r.code == 0, r.output
    assert r.json["backend"] == "inductor"
    assert f"{SCRIPT} under tdbg's compiler (inductor): 1 compiled function(s), 4 graph(s) for 3 piece(s), 2 graph break(s)" \
        in r.stdout
    assert ("replaced: your script asked for torch:inductor (torch.compile's default) (torch.compile call 1); "
            "ran tdbg's compiler (inductor) instead (--backend inductor)") in r.stdout
    assert "graph 1 (toy_example, resumed after the break at line 7): 2 op(s): Tensor.sum, lt" in r.stdout
    # the two graphs after the branch (which is compiled first depends on the script's random inputs)
    after = [ln.strip().split(" ", 2)[2] for ln in r.stdout.splitlines() if "resumed after the break at line 8" in ln]
    again = "; graph 2's piece again, reached another way, e.g. the other side of a branch"
    assert sorted(a.replace(again, "") for a in after) == [
        "(toy_example, resumed after the break at line 8): 1 op(s): mul",
        "(toy_example, resumed after the break at line 8): 2 op(s): mul x2"]
    assert sum(again in a for a in after) == 1
    assert not BARE.search(r.output) and "torch_dynamo_resume" not in r.stdout, r.output
    # JSON keeps Dynamo's own frame names (what its logs print)
    frames = [g["frame"] for fn in r.json["functions"] for g in fn["graphs"]]
    assert frames == ["toy_example", "torch_dynamo_resume_in_toy_example_at_7",
                      "torch_dynamo_resume_in_toy_example_at_8", "torch_dynamo_resume_in_toy_example_at_8"]


@pytest.mark.scenario("run_toy_tdbg_accuracy")
def test_a_failure_in_a_resume_function_is_placed_in_the_users_function(scenarios):
    """The wrong `mul` runs in a graph after the graph break: the FAILED report names tdbg's
    compiler, the graph by its function and the source line in that function (was `in
    torch_dynamo_resume_in_toy_example_at_8`)."""
    r = scenarios["run_toy_tdbg_accuracy"]
    assert r.code == exit_code("accuracy"), r.output
    assert r.json["backend"] == "inductor" and r.json["verdict"]["error"]["frame"] == \
        "torch_dynamo_resume_in_toy_example_at_8"
    assert "  backend: tdbg's compiler (inductor)\n" in r.stdout
    assert re.search(r"^  graph: [23] \(frame toy_example, resumed after the break at line 8\) forward, while "
                     r"running \(call 1\)$", r.stdout, re.M), r.stdout
    assert "  source: examples/toy_example.py:10 in toy_example: return x * b\n" in r.stdout
    assert r.json["verdict"]["error"]["source"] == "examples/toy_example.py:10 in toy_example: return x * b"
    assert r.json["next_commands"][0] == "tdbg bisect examples/toy_example.py --backend inductor"
    assert not BARE.search(r.output) and "torch_dynamo_resume" not in r.output, r.output
