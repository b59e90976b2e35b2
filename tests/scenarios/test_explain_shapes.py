"""`tdbg explain`'s shapes on scripts with a known answer (tests/scenarios/scripts/shapes_*.py):
the guard of a branch on a size is put at the `if` line (not where the size was read) and named a
Python condition (no Inductor ran); a view to literal sizes specializes a maybe_mark_dynamic dim at
its line; mark_dynamic then `== 3` stops the run at the comparison's line; ten sizes with automatic
dynamic shapes off are a recompile storm. All with --backend eager (Dynamo only, fast)."""
import pytest

from tdbg.cli.console import exit_code

S = "tests/scenarios/scripts"
RUNS = {name: (("explain", f"{S}/shapes_{name}.py", "--backend", "eager"), None)
        for name in ("branch", "view", "marked", "storm")}


@pytest.fixture(scope="module")
def runs(tdbg_runs):
    # each run ~6 s: only the branch (the regression) is in the default suite, the rest are
    # slow; their logic is covered in-process by tests/cli/test_shape_explanations.py
    return lambda name: tdbg_runs(*RUNS[name])


def test_branch_on_a_size_is_put_at_the_if_line(runs):
    """Issue #24's case: Dynamo prints the failed range guard with line 10 (the size's first read,
    path cut at the front) and tdbg 1 called it Inductor's; the guard was made by the if on line 11."""
    r = runs("branch")
    assert r.code == exit_code("ok"), r.stdout + r.stderr
    assert r.json["version"] == 2
    (fn,) = r.json["functions"]
    first, second = fn["recompiles"]
    # 64 -> 8 rows: compile 0/0 had dim 0 static, and no user line made it so
    assert (first["size"]["compile_id"], first["size"]["created_at"], first["size"]["old"], first["size"]["new"],
            first["size"]["kind"]) == ("0/0", None, 64, 8, "static")
    assert first["suggestion"].startswith("call torch._dynamo.mark_dynamic(x, 0)")
    # 100 rows: the range guard of compile 0/1 (x dynamic, the branch took x.size(0) <= 32) fails
    size = second["size"]
    assert (size["compile_id"], size["failed_guard"], size["guard_expr"], size["created_at"], size["code"],
            size["kind"]) == ("0/1", "2 <= x.size()[0] <= 32", "x.size()[0] <= 32", f"{S}/shapes_branch.py:11",
                              "if x.size(0) > 32:", "condition")
    assert second["line"] == f"{S}/shapes_branch.py:11  if x.size(0) > 32:"
    assert second["suggestion"].startswith("avoid branching on the size")
    assert "torch._check(x.size(0) <= 32)" in second["suggestion"]
    frames = fn["shapes"]["frames"]
    assert [(f["compile_id"], [(d["size"], d["state"]) for d in f["inputs"][0]["dims"]]) for f in frames] == [
        ("0/0", [(64, "static"), (3, "static")]), ("0/1", [(8, "dynamic"), (3, "static")]),
        ("0/2", [(100, "dynamic"), (3, "static")])]
    assert [(g["expr"], g["at"], g["kind"]) for f in frames for g in f["guards"]] == [
        ("x.size()[0] <= 32", f"{S}/shapes_branch.py:11", "condition"),
        ("x.size()[0] > 32", f"{S}/shapes_branch.py:11", "condition")]
    assert fn["shapes"]["storms"] == [] and r.json["totals"]["recompile_storms"] == 0
    lines = r.stdout.splitlines()
    assert (f"      failed guard: 2 <= x.size()[0] <= 32 (compile 0/1), made at {S}/shapes_branch.py:11  "
            "if x.size(0) > 32:") in lines
    assert f"      guard x.size()[0] <= 32 at {S}/shapes_branch.py:11  if x.size(0) > 32:" in lines
    assert "    compile 0/1 (f): x: dim 0 = 8 dynamic, dim 1 = 3 static" in lines
    assert "Inductor" not in r.stdout and "shapes_branch.py:10" not in r.stdout


@pytest.mark.slow
def test_view_to_literal_sizes_specializes_the_dim_at_its_line(runs):
    r = runs("view")
    assert r.code == exit_code("ok"), r.stdout + r.stderr
    ((frame,),) = [fn["shapes"]["frames"] for fn in r.json["functions"]]
    assert frame["inputs"][0]["dims"][0] | {"symbol": None} == {
        "dim": 0, "size": 8, "state": "specialized", "symbol": None, "specialized_at": f"{S}/shapes_view.py:8"}
    (spec,) = frame["specializations"]
    assert (spec["source"], spec["value"], spec["at"], spec["code"], spec["kind"]) == (
        "x.size()[0]", "8", f"{S}/shapes_view.py:8", "return y.view(4, 6)", "op")
    assert spec["cause"].startswith("the shape rule of Tensor.view")
    assert (f"      specialized x.size()[0] = 8 at {S}/shapes_view.py:8  return y.view(4, 6)"
            in r.stdout.splitlines())


@pytest.mark.slow
def test_mark_dynamic_then_a_constant_compare_names_the_line(runs):
    r = runs("marked")
    # Dynamo refused the frame's guards: stage dynamo (it was "the script failed on its own", exit 1)
    assert r.code == exit_code("dynamo") and (r.json["status"], r.json["stage"]) == ("failed", "dynamo")
    assert "The script failed" not in r.stdout
    assert "      guard: x.size()[0] == 3 (the graph would hold only for that size)" in r.stdout.splitlines()
    v = r.json["shape_violation"]
    assert (v["source"], v["value"], v["at"], v["code"]) == (
        "x.size()[0]", "3", f"{S}/shapes_marked.py:7", "if x.shape[0] == 3:")
    assert (f"Shape specialized: x.size()[0] was marked dynamic, but {S}/shapes_marked.py:7  "
            "if x.shape[0] == 3:  made it the constant 3") in r.stdout.splitlines()


@pytest.mark.slow
def test_ten_sizes_without_automatic_dynamic_are_a_storm(runs):
    r = runs("storm")
    assert r.code == exit_code("ok"), r.stdout + r.stderr
    (fn,) = r.json["functions"]
    # Dynamo's recompile limit (8) stops it: 8 graphs (7 recompiles) for sizes 1..8; size 9's guard
    # failure hit the limit and compiled nothing; calls with sizes 9 and 10 ran uncompiled
    assert [(s["source"], s["recompiles"], s["sizes"], s["cut_by"]) for s in fn["shapes"]["storms"]] == [
        ("x.size()[0]", 7, list(range(1, 10)), "torch._dynamo.config.recompile_limit")]
    assert (r.json["totals"]["recompile_storms"], fn["recompile_count"], fn["compiled_graphs"]) == (1, 7, 8)
    assert (fn["recompile_limit"]["value"], fn["recompile_limit"]["reason"]) == (
        8, "0/7: tensor 'x' size mismatch at index 0. expected 8, actual 9")
    lines = r.stdout.splitlines()
    assert ("  recompile storm: x.size()[0] never stabilized: 7 recompiles over sizes 1, 2, 3, 4, 5, 6, 7, 8, 9, "
            "cut short by torch._dynamo.config.recompile_limit") in lines
    assert ("  recompile limit: Dynamo stopped compiling f at torch._dynamo.config.recompile_limit = 8: the call "
            "that would have recompiled it, and every later call matching none of its graphs, ran uncompiled "
            "(eager)") in lines
    assert r.stdout.count("      why: ") == 1   # the same cause is said once
