"""The page shows the fields the commands' JSON gained (docs/json.md's 2026-11-26 additions): the
recompile limit Dynamo hit, a compile cache turned off, the calls --check-determinism checked, the
symbolic sizes of a minified graph, of a failing run call and of replayed graphs. Each page is
rendered from a document (explain's and the caches' parts built by their own producers from a
recorded verdict / settings), no tdbg run."""
import re

from test_report_page import parse

from tdbg.cli.report import headline
from tdbg.minifier.artifacts import report
from tdbg.minifier.diagnose.caches import turned_off
from tdbg.minifier.diagnose.explain import build_report


def text(html: str) -> str:
    """The page's text: tags dropped, entities of quotes and arrows undone, spaces squeezed."""
    plain = re.sub(r"<[^>]+>", " ", html)
    for entity, char in (("&#x27;", "'"), ("&quot;", '"'), ("&gt;", ">"), ("&lt;", "<"), ("&amp;", "&")):
        plain = plain.replace(entity, char)
    return re.sub(r"\s+", " ", plain)


def section(html: str, ident: str) -> str:
    return text(html.split(f'<section id="{ident}">')[1].split("</section>")[0])


def rows(html: str, ident: str) -> list:
    body = html.split(f'id="{ident}"')[1].split("<tbody>")[1].split("</tbody>")[0]
    return [[text(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", r)] for r in re.findall(r"<tr>(.*?)</tr>", body)]


GROW = "tensor 'x' size mismatch at index 0. expected {}, actual {}"


def test_explain_page_says_the_recompile_limit_stopped_the_frame():
    verdict = {"graphs": [{"index": 0, "frame": "f", "ops": ["aten.add"], "lines": [], "graph_break": False}],
               "guards": [], "recompiles": [{"frame": "f", "reason": GROW.format(4, 5), "graphs_before": 1},
                                            {"frame": "f", "reason": GROW.format(5, 6), "graphs_before": 2}],
               "recompile_limits": [{"frame": "f", "file": "/tmp/t.py", "line": 3, "limit": "recompile_limit",
                                     "value": 2, "reason": GROW.format(5, 6)}]}
    doc = {"schema": "tdbg.explain", "version": 2, "status": "ok", "exit_code": 0, **build_report(verdict)}
    graphs = section(report.build(doc, command="explain"), "graphs")
    assert "recompile of f: argument `x` changed size in dim 0: 4 -> 5" in graphs
    assert ("guard failure (NOT recompiled: Dynamo's recompile limit) of f: argument `x` changed size in dim 0: "
            "5 -> 6") in graphs
    assert ("recompile limit: Dynamo stopped compiling f at recompile_limit = 2: the call that would have "
            "recompiled it, and every later call matching none of its graphs, ran uncompiled (eager) "
            f"at /tmp/t.py:3; last guard failure: {GROW.format(5, 6)}; fix: remove the recompiles' cause (see "
            "them); raising recompile_limit only delays the stop") in graphs
    # without the limit, both guard failures are recompiles and no limit line is drawn
    verdict["recompile_limits"] = []
    doc.update(build_report(verdict))
    graphs = section(report.build(doc, command="explain"), "graphs")
    assert graphs.count("recompile of f") == 2 and "recompile limit" not in graphs


def test_explain_page_says_a_storm_was_cut_short_by_the_limit():
    storm = {"frame": "f", "source": "L['x'].size()[0]", "recompiles": 3, "sizes": [4, 5, 6, 7],
             "fix": "mark it dynamic", "cut_by": "recompile_limit"}
    doc = {"schema": "tdbg.explain", "version": 2, "status": "ok", "exit_code": 0, "totals": {},
           "functions": [{"function": "f", "recompiles": [], "shapes": {"storms": [storm], "frames": [
               {"frame": "f", "compile_id": "0/3", "inputs": [], "guards": [], "specializations": []}]}}]}
    assert section(report.build(doc, command="explain"), "shapes").endswith(
        " recompile storm: L['x'].size()[0] never stabilized: 3 recompiles over sizes 4, 5, 6, 7, cut short by "
        "recompile_limit fix: mark it dynamic ")
    del storm["cut_by"]    # a storm that ended on its own
    assert "cut short" not in section(report.build(doc, command="explain"), "shapes")


def test_caches_page_names_a_cache_turned_off():
    settings = {"torch._inductor.config.force_disable_caches": False, "torch._inductor.config.fx_graph_cache": False,
                "torch._functorch.config.enable_autograd_cache": True, "inductor_loaded": True}
    caches = {"against": "the first run of this command", "first_run": None, "cache_dirs": {}, "graphs": [],
              "settings": settings, "turned_off": turned_off(settings)}
    doc = {"schema": "tdbg.explain", "version": 2, "status": "ok", "exit_code": 0, "caches": caches}
    html = report.build(doc, command="explain")
    assert section(html, "caches").endswith(
        " Inductor FX graph cache: OFF (torch._inductor.config.fx_graph_cache = False; TORCHINDUCTOR_FX_GRAPH_CACHE=0 "
        "sets it): no lookup was made, every graph was compiled afresh no other compile-cache lookup ")
    caches["turned_off"] = turned_off(dict(settings, **{"torch._inductor.config.fx_graph_cache": True}))
    assert caches["turned_off"] == []
    assert "OFF" not in section(report.build(doc, command="explain"), "caches")


def test_determinism_page_lists_the_calls_checked():
    record = {"graph": 0, "call": 3, "verdict": "backend", "nondeterministic": True, "message": "",
              "compiled": [{"path": "out[0]", "message": "4 of 64 elements differ"}], "eager": [],
              "first_node": {"node": "sum_1", "kernel": "cpp_fused_sum_0", "source": "t.py:5 in f: x.sum()"},
              "reason": "a parallel reduction"}
    doc = {"schema": "tdbg.run", "version": 2, "exit_code": 24, "verdict": {
        "status": "failed", "stage": "nondeterministic", "graphs": [
            {"index": 0, "frame": "f", "determinism": record, "determinism_calls": [1, 3]},
            {"index": 1, "frame": "g", "determinism": dict(record, call=1, verdict="deterministic",
                                                           nondeterministic=False, compiled=[], first_node=None,
                                                           reason=None)}]}}
    assert rows(report.build(doc, command="run"), "determinism-graphs") == [
        ["0", "f", "1, 3", "backend", "out[0]: 4 of 64 elements differ", "same bits", "sum_1", "cpp_fused_sum_0",
         "t.py:5 in f: x.sum()", "a parallel reduction"],
        # a record without determinism_calls (an older document): its own call
        ["1", "g", "1", "deterministic", "same bits", "same bits", "", "", "", ""]]


def test_run_page_names_the_failing_calls_symbolic_sizes():
    doc = {"schema": "tdbg.run", "version": 2, "exit_code": 16, "verdict": {
        "status": "failed", "stage": "accuracy", "graphs": [], "error": {
            "graph": 0, "call": 2, "symbolic_sizes": "s77=100", "message": "out[0] differs"}}}
    assert parse(report.build(doc, command="run")).ids["v-symbolic-sizes"] == "s77=100"
    doc["verdict"]["error"]["symbolic_sizes"] = None     # a static graph: no row
    assert "v-symbolic-sizes" not in parse(report.build(doc, command="run")).ids


def test_minify_page_shows_the_minimized_graphs_symbolic_sizes():
    doc = {"schema": "tdbg.minify", "version": 1, "status": "minified", "exit_code": 0, "out_dir": "",
           "original": {"nodes": 6, "inputs": 3},
           "minimized": {"nodes": 2, "inputs": 2, "dynamic": {"l_x_": ["s77", None], "s77": ["s77"]}}}
    page = parse(report.build(doc, command="minify"))
    assert page.ids["minified-symbolic"] == "compiled with symbolic sizes: l_x_: [s77, static]; s77: [s77]"
    doc["minimized"]["dynamic"] = {}
    assert "minified-symbolic" not in parse(report.build(doc, command="minify")).ids


def test_replay_page_shows_each_graphs_symbolic_sizes_and_the_failing_line():
    failed = {"graph": "g0_dynamo_c2", "kind": "dynamo", "backend": "inductor", "status": "failed",
              "stage": "accuracy", "max_abs_error": 1.0, "symbolic_sizes": "l_x_: float32[s77=100, 8], s77=100",
              "error": {"message": "graph g0_dynamo_c2: outputs differ", "fx_node": "add", "source": "t.py:4 in f"}}
    ok = {"graph": "g1_dynamo_c1", "kind": "dynamo", "backend": "inductor", "status": "ok", "stage": None,
          "max_abs_error": 0.0, "symbolic_sizes": None, "error": None}
    doc = {"schema": "tdbg.replay", "version": 1, "path": "io", "backend": None, "exit_code": 16,
           "graphs": [ok, failed]}
    printed = {"stdout": "OK g1_dynamo_c1 (dynamo): backend ...\nFAILED g0_dynamo_c2 (dynamo): wrong values\n"}
    line = headline("replay", printed, doc)
    assert line == "FAILED g0_dynamo_c2 (dynamo): wrong values"
    html = report.build(doc, command="replay", headline=line)
    page = parse(html)
    assert (page.ids["verdict-headline"], page.ids["v-stage"], page.ids["v-symbolic-sizes"], page.ids["v-fx-node"]) \
        == (line, "accuracy", "l_x_: float32[s77=100, 8], s77=100", "add")
    assert rows(html, "replay-graphs") == [
        ["g1_dynamo_c1", "dynamo", "tdbg's compiler (inductor)", "OK", "0", "static", ""],
        ["g0_dynamo_c2", "dynamo", "tdbg's compiler (inductor)", "FAILED (accuracy)", "1",
         "l_x_: float32[s77=100, 8], s77=100", "graph g0_dynamo_c2: outputs differ"]]
    assert headline("replay", printed, dict(doc, graphs=[ok])) == "OK g1_dynamo_c1 (dynamo): backend ..."


def test_save_io_page_writes_symbolic_dims_as_symbol_and_size(tmp_path):
    """`tdbg report` on a --save-io folder: a graph saved with symbolic sizes shows each symbolic
    dim as symbol=size (meta.json's replay.dynamic), its int input with its symbol."""
    import json
    import os
    import shutil

    # tests/report/data, spelled here: `from conftest import` gets whichever folder's conftest
    # pytest imported first as "conftest" when several folders run together
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    folder = tmp_path / "sio"
    shutil.copytree(os.path.join(data, "saved_io"), folder)
    meta_path = folder / "g0_forward_c1" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.setdefault("replay", {})["dynamic"] = {"arg0_1": ["s77"], "arg1_1": ["s27"]}
    meta_path.write_text(json.dumps(meta))
    doc, _ = report.folder_document(str(folder))
    assert rows(report.build(doc, command="saved_io"), "saved-graphs")[0][5] == "arg0_1: float32[s77=4]; arg1_1 = 2 (s27)"
