"""`tdbg explain --code` and `--break-at` on a script with a known answer (code_graph_break.py: f
splits at a print into f and its resume frame, which recompiles when `n` changes from 3 to 4).
Three CLI runs at once; pdb is fed its commands on stdin."""
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from tdbg.cli import code_view as cli_code_view
from tdbg.cli.console import exit_code

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = "tests/scenarios/scripts/code_graph_break.py"
RUNS = {   # name -> (arguments, pdb's stdin); --code and --break-at share one run (tests are on a budget)
    "code": (["--backend", "eager", "--code", "f", "--html", "{tmp}/page", "--break-at", "7"],
             "p stop_at.shape\nc\np stop_at.sum()\nc\n"),
    "pdb_aot": (["--backend", "aot_eager", "--break-at", f"{SCRIPT}:9"], "p stop_at[0, 0]\nc\np arg1_1\nc\n"),
}


def _run(args, stdin):
    with tempfile.TemporaryDirectory(prefix="tdbg-code-") as tmp:
        path = os.path.join(tmp, "out.json")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TDBG_") or k == "TDBG_CACHE_DIR"}
        args = [a.replace("{tmp}", tmp) for a in args]
        proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", "explain", SCRIPT, *args, "--json", path],
                              cwd=ROOT, env=dict(env, COLUMNS="200"), input=stdin, capture_output=True, text=True,
                              timeout=600)
        page = os.path.join(tmp, "page", "index.html")
        doc = json.load(open(path))
        doc["html"] = open(page).read() if os.path.exists(page) else None
        return proc.returncode, proc.stdout, proc.stderr, doc


@pytest.fixture(scope="module")
def runs():
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run, *spec) for name, spec in RUNS.items()}
        yield {name: f.result() for name, f in futures.items()}


def test_code_shows_transformed_code_resume_frame_and_guards(runs):
    code, out, err, doc = runs["code"]
    assert code == 0, out + err
    frames = doc["code"]["frames"]
    assert [(f["frame"], f["function"], f["first_line"], f["resume_line"]) for f in frames] == [
        ("f", "f", 6, None), ("torch_dynamo_resume_in_f_at_8", "f", 8, 8)]
    assert frames[0]["source"] == {"first_line": 6, "text": 'def f(x, n):\n    y = x.sin() * 2\n'
                                   '    print("graph break here")\n    z = y + n\n    return z.cos()'}
    assert frames[1]["source"] == frames[0]["source"]           # a resume frame shows its function's source
    (first,) = frames[0]["compiles"]
    assert first["decompiler"].startswith("depyf ") and first["note"] is None
    (graph,) = first["graphs"]
    (resume,) = first["resumes"]
    assert graph["graph"] == 0 and resume["frame"] == "torch_dynamo_resume_in_f_at_8"
    lines = first["code"].splitlines()
    assert lines[0] == "def f(x, n):"
    assert f"    graph_out_0 = {graph['name']}(x)" in lines            # the call of the compiled graph
    assert lines[-1] == f"    return {resume['name']}(*__temp_16)"     # then the resume function
    words = [g["words"] for g in first["guards"]]
    assert "`x` is a Tensor of dtype float32, shape [4, 8], stride [8, 1], requires_grad=False, device cpu" in words
    assert "`print` is the very object it was when compiled" in words
    # the resume frame: compiled for n == 3, then again when n changed (n now only type-checked)
    assert [c["compile_id"] for c in frames[1]["compiles"]] == ["1/0", "1/1"]
    assert [[g["graph"] for g in c["graphs"]] for c in frames[1]["compiles"]] == [[1], [2]]
    assert "`n` == 3 (the graph is specialized to this Python value)" in \
        [g["words"] for g in frames[1]["compiles"][0]["guards"]]
    assert "`n` has the type it had when compiled (int)" in [g["words"] for g in frames[1]["compiles"][1]["guards"]]
    assert [g["index"] for g in frames[1]["graph_code"]] == [1, 2]
    assert "# File: " in frames[1]["graph_code"][0]["code"] and "code: z = y + n" in frames[1]["graph_code"][0]["code"]
    # the text: the four parts in order, for both frames
    assert out.count("Code of f (frame ") == 2
    assert f"Code of f (frame torch_dynamo_resume_in_f_at_8, {SCRIPT}:8, resumed after line 8; graph(s) 1, 2)" in out
    for part in ("original source", "the code Dynamo runs instead (decompiled by depyf", "guards (", "graph 0 code"):
        assert part in out
    assert "  >    8      print(\"graph break here\")" in out             # the resume point marked
    assert f"then continues in torch_dynamo_resume_in_f_at_8 (called as {resume['name']})" in out


def test_html_puts_the_four_panes_side_by_side(runs):
    html = runs["code"][3]["html"]
    section = html[html.index('<section id="dynamo_code">'):]
    section = section[:section.index("</section>")]
    assert section.count('<div class="frame-code"') == 2 and section.count('<div class="panes4">') == 2
    first = section[:section.index('<div class="frame-code" data-frame="torch_dynamo_resume_in_f_at_8">')]
    titles = [t.split("</h4>")[0] for t in first.split('<div class="pane-box"><h4>')[1:]]
    assert titles == ["original source", "the code Dynamo runs", "guards, in words", "graph code"]
    assert "<li title=\"check_tensor(L[&#x27;x&#x27;], Tensor" in first
    assert "`x` is a Tensor of dtype float32, shape [4, 8]" in first
    assert "then continues in torch_dynamo_resume_in_f_at_8" in first


def test_break_at_stops_in_the_dynamo_graph_under_eager(runs):
    code, out, err, doc = runs["code"]
    assert code == 0, out + err
    assert doc["break_at"] == [{"graph": 0, "node": "sin", "line": f"{SCRIPT}:7", "code": "y = x.sin() * 2"}]
    assert out.count("-> sin = stop_at.sin();  stop_at = None") == 2      # both calls, at the line's first op
    assert "(Pdb) torch.Size([4, 8])" in out and "(Pdb) tensor(32.)" in out     # x is ones(4, 8)
    assert "at the first op of code_graph_break.py:7 `y = x.sin() * 2`" in out


def test_break_at_stops_in_the_aten_graph_under_aot_eager(runs):
    code, out, err, doc = runs["pdb_aot"]
    assert code == 0, out + err
    # graph 1 (n == 3) and graph 2 (n a SymInt input after the recompile)
    assert [p["graph"] for p in doc["break_at"]] == [1, 2]
    assert "-> add = torch.ops.aten.add.Tensor(stop_at, 3);  stop_at = None" in out
    assert "(Pdb) tensor(1.6829)" in out and "(Pdb) 4" in out


@pytest.mark.parametrize("backend", ["own", "tests/scenarios/scripts/nondeterministic_backends.py:shuffled_sum"])
def test_break_at_refuses_backends_it_cannot_stop_in(backend):
    problem = cli_code_view.break_at_problem("7", SCRIPT, backend)
    assert problem.startswith(f"--break-at needs a backend it knows how to stop in (eager, aot_eager, torch:eager, "
                              f"torch:aot_eager, inductor, tdbg, torch:tdbg, torch:inductor), not {backend!r}")
    # compiled backends stop in their output code (tests/debugging/test_break_at_compiled.py)
    assert cli_code_view.break_at_problem("7", SCRIPT, "torch:inductor") is None


def test_code_that_matches_nothing_is_bad_input():
    doc = {"asked": "g", "frames": [], "available": "f (s.py:3)"}
    assert cli_code_view.problem(doc, {"status": "ok"}, None) == (
        "--code g matches no frame Dynamo compiled. Give a function name, FILE:LINE inside one, a graph index as "
        "explain lists graphs, or `all`. This run compiled: f (s.py:3).")
    assert cli_code_view.problem(None, {"status": "ok", "break_at": []}, "9").startswith(
        "--break-at 9: no graph has an op traced from that line")
    assert cli_code_view.problem(doc, {"status": "failed"}, None) is None   # the run's failure is the news
    assert exit_code("bad_input") == 3
