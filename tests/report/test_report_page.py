"""The report library without a browser: provenance read back (provenance.json and the derived
map of older folders), the culprit marked in every pane, the sections each document gets, the
shrink history, and `--html` / `tdbg report` refusing bad folders before any work."""
import json
import re
import os
import shutil
from html.parser import HTMLParser

import pytest
from conftest import DATA, ROOT, run_tdbg

from tdbg.minifier.artifacts import report
from tdbg.minifier.artifacts.report import artifacts, sections

DEBUG = os.path.join(DATA, "debug")
GRAPH = os.path.join(DEBUG, "run_2026_01_01_00_00_00-pid_1", "compiler", "model__0_forward_0")


class Lines(HTMLParser):
    """graph name -> pane -> [(line number, nodes, css classes)] and the user-source rows."""

    def __init__(self):
        super().__init__()
        self.graphs, self.sources, self.graph, self.pane = {}, {}, None, None
        self.ids = {}
        self._open = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        css = (a.get("class") or "").split()
        if "graph-code" in css:
            self.graph = a["data-graph"]
            self.graphs[self.graph], self.sources[self.graph] = {}, []
        elif "pane" in css:
            self.pane = a["data-pane"]
            self.graphs[self.graph][self.pane] = []
        elif "ln" in css:
            self.graphs[self.graph][self.pane].append((int(a["data-n"]), a.get("data-nodes", ""), set(css)))
        elif "src" in css:
            self.sources[self.graph].append((a["data-nodes"], set(css)))
        if a.get("id"):
            self._open = a["id"]
            self.ids[self._open] = ""

    def handle_data(self, data):
        if self._open:
            self.ids[self._open] += data

    def handle_endtag(self, tag):
        self._open = None


def parse(html: str) -> Lines:
    p = Lines()
    p.feed(html)
    return p


def marked(lines, css="culprit"):
    return [n for n, _nodes, classes in lines if css in classes]


def test_provenance_json_is_read_as_written():
    g = artifacts.load_graphs(GRAPH)[0]
    assert (g["name"], g["kind"], g["derived"]) == ("model__0_forward_0", "forward", False)
    assert [p["file"] for p in g["panes"].values()] == ["fx_graph_readable.py", "ir.txt", "kernels.cpp"]
    assert g["nodes"]["neg"] == {"fx_lines": [4], "ir_lines": [5, 6], "cpp_lines": [6, 7, 8],
                                 "kernel": "cpp_fused_exp_neg_0", "source": "prog.py:3  a = torch.neg(x)"}
    assert g["stages"] == [("lower", 0.001, None), ("schedule", 0.002, None), ("codegen", 0.003, "CppCompileError")]


def test_provenance_is_derived_for_folders_without_it():
    g = artifacts.load_graphs(DEBUG)[1]
    assert (g["name"], g["derived"]) == ("model__1_forward_0", True)
    assert [p["file"] for p in g["panes"].values()] == ["fx_graph_readable.py", "ir_post_fusion.txt", "output_code.py"]
    neg = g["nodes"]["neg"]
    # FX: the `# File:` comment and the assignment; IR: origins and `neg(...)`; C++: after `// FX: neg`
    assert neg["fx_lines"] == [3, 4] and neg["ir_lines"] == [3, 13] and neg["cpp_lines"] == [25, 26, 27]
    assert neg["kernel"] == "cpp_fused_cat_maximum_neg_0"
    assert neg["source"].endswith("foo2.py:6 a = torch.neg(x1)")
    assert g["nodes"]["maximum"]["cpp_lines"] == [23, 24, 28, 29, 30, 31]


def test_culprit_is_marked_in_all_three_panes_and_the_source():
    doc = {"schema": "tdbg.run", "exit_code": 14, "next_commands": ["tdbg bisect prog.py"],
           "verdict": {"status": "failed", "stage": "cpp_build", "graphs": [],
                       "error": {"fx_node": "neg", "kernel": "cpp_fused_exp_neg_0", "graph": 0,
                                 "source": "prog.py:3 in f: a = torch.neg(x)", "message": "g++ failed"}}}
    page = parse(report.build(doc, command="run", headline="FAILED prog.py", debug_dirs=(DEBUG,)))
    panes = page.graphs["model__0_forward_0"]
    assert {pane: marked(lines) for pane, lines in panes.items()} == {"fx": [4], "ir": [5, 6], "cpp": [6, 7, 8]}
    assert [nodes for nodes, css in page.sources["model__0_forward_0"] if "culprit" in css] == ["neg"]
    # the same node name in the other graph is not this verdict's culprit: only the first graph holding it
    assert all(not marked(lines) for lines in page.graphs["model__1_forward_0"].values())
    assert page.ids["verdict-headline"] == "FAILED prog.py"
    assert (page.ids["v-stage"], page.ids["v-kernel"], page.ids["v-exit-code"]) == \
        ("cpp_build", "cpp_fused_exp_neg_0", "14")
    # lines of nodes carry their node names: what the click handler links by
    assert [(n, nodes) for n, nodes, _ in panes["cpp"] if nodes] == [(6, "neg"), (7, "neg"), (8, "neg"),
                                                                     (9, "exp"), (10, "exp"), (11, "exp")]


def test_page_is_self_contained():
    html = report.build(json.load(open(os.path.join(DATA, "bisect_foo2.json"))), command="bisect",
                        debug_dirs=(DEBUG,))
    assert "<script src" not in html and "<link" not in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in html
    assert "default-src 'none'" in html    # the page itself forbids any fetch


def test_bisect_page_sections():
    doc = json.load(open(os.path.join(DATA, "bisect_foo2.json")))
    html = report.build(doc, command="bisect", debug_dirs=())
    page = parse(html)
    assert page.ids["verdict-headline"] == doc["verdict"]["summary"]
    assert (page.ids["v-fx-node"], page.ids["v-kernel"], page.ids["v-graph"]) == \
        ("neg", "cpp_fused_neg_0", "foo2__0_inference_0")
    assert '<section id="bisect">' in html and "FAIL (accuracy)" in html
    assert '<section id="code">' not in html     # no debug folder given: no code panes, no empty section


def test_shrink_history_and_chart(tmp_path):
    doc = json.load(open(os.path.join(DATA, "minify_foo2.json")))
    shutil.copytree(os.path.join(DATA, "minify"), tmp_path / "mini")
    doc["out_dir"] = str(tmp_path / "mini")
    # query 0 is the captured graph; then each candidate that kept the failure (5, 6, 8, 9 passed)
    assert sections.shrink_history(doc) == [(0, 6, 2), (3, 5, 2), (4, 3, 1), (7, 3, 1)]
    html = report.build(doc, command="minify")
    assert html.count('class="series"') == 2 and html.count("<circle") == 8
    folder_doc, dirs = report.folder_document(str(tmp_path / "mini"))
    assert (folder_doc["original"], folder_doc["minimized"], dirs) == ({"nodes": 6, "inputs": 2},
                                                                       {"nodes": 3, "inputs": 1}, ())


def test_folder_without_anything_to_report(tmp_path):
    with pytest.raises(ValueError, match="holds no tdbg --json document"):
        report.folder_document(str(tmp_path))


def test_report_command(tmp_path):
    out = tmp_path / "page"
    proc = run_tdbg(["report", DEBUG, "--html", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"HTML report: {out}/index.html",
        "2 compiled graph(s); model__0_forward_0: stage codegen failed (CppCompileError)"]
    html = (out / "index.html").read_text()
    assert sorted(parse(html).graphs) == ["model__0_forward_0", "model__1_forward_0"]
    stage_table = html.split('id="stage-times"')[1].split("</table>")[0]
    cells = [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)]
             for row in re.findall(r"<tr>(.*?)</tr>", stage_table)]
    assert cells[0] == ["graph", "lower", "check_lowered", "schedule", "check_scheduled", "codegen", "wrap", "build",
                        "total"]
    assert cells[1] == ["model__0_forward_0", "1.00", "", "2.00", "", "3.00 failed: CppCompileError", "", "", "6.00"]
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_tdbg(["report", str(empty), "--html", str(tmp_path / "p2")])
    assert proc.returncode == 3 and "nothing to report" in proc.stderr and not (tmp_path / "p2").exists()


def test_html_dir_is_checked_before_any_work(tmp_path):
    (tmp_path / "mine.txt").write_text("a user's file")
    proc = run_tdbg(["run", os.path.join(ROOT, "examples", "foo2.py"), "--backend", "inductor", "--html", str(tmp_path)])
    assert proc.returncode == 2
    assert "--html" in proc.stderr and "not empty" in proc.stderr
    assert os.listdir(tmp_path) == ["mine.txt"]


def test_compare_per_node_table():
    """`tdbg compare`'s document (stored from `tdbg compare` on a `run --save-io` folder of foo2
    with neg:accuracy): the culprit in the verdict and its row marked in the per-node table."""
    doc = json.load(open(os.path.join(DATA, "compare_foo2.json")))
    html = report.build(doc, command="compare", headline=doc["message"])
    page = parse(html)
    assert (page.ids["verdict-headline"], page.ids["v-fx-node"], page.ids["v-source"]) == \
        ("1 graph(s): 1 diverges", "neg", "examples/foo2.py:6 in foo2: a = torch.neg(x1)")
    body = html.split('id="nodes-g0_inference_c1"')[1].split("<tbody>")[1].split("</tbody>")[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body)
    cells = [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)] for r in rows]
    assert [c[:3] + c[7:9] for c in cells] == [["neg", "aten.neg", "float32", "True", "True"],
                                                ["maximum", "aten.maximum", "float32", "True", "False"],
                                                ["cat", "aten.cat", "float32", "True", "False"]]
    assert rows[0].startswith('<td><span class="culprit">neg</span>')


def test_failure_path_still_gets_a_page(tmp_path):
    """A command stopped by bad input before any run still writes its page: the error as printed."""
    out = tmp_path / "page"
    proc = run_tdbg(["bisect", str(tmp_path / "missing.py"), "--html", str(out)])
    assert proc.returncode == 3
    error = next(line for line in proc.stderr.splitlines() if line.startswith("error:"))
    page = parse((out / "index.html").read_text())
    assert page.ids["verdict-headline"] == error
    assert page.ids["v-stage"] == "bad_input" and page.ids["v-exit-code"] == "3"


def test_report_of_a_folder_holding_a_saved_document(tmp_path):
    folder = tmp_path / "saved"
    folder.mkdir()
    shutil.copy(os.path.join(DATA, "bisect_foo2.json"), folder / "bisect.json")
    proc = run_tdbg(["report", str(folder), "--html", str(tmp_path / "page")])
    assert proc.returncode == 0, proc.stderr
    page = parse((tmp_path / "page" / "index.html").read_text())
    summary = json.load(open(os.path.join(DATA, "bisect_foo2.json")))["verdict"]["summary"]
    assert (page.ids["verdict-headline"], page.ids["v-fx-node"]) == (summary, "neg")


def test_report_of_a_save_io_folder(tmp_path):
    doc, dirs = report.folder_document(os.path.join(DATA, "saved_io"))
    assert (doc["summary"], dirs) == ("1 saved graph(s) of prog.py (backend tdbg's compiler (inductor), torch 2.13.0+cpu, "
                                   "after aot)", ())
    html = report.build(doc, command="saved_io", headline=doc["summary"])
    body = html.split('id="saved-graphs"')[1].split("<tbody>")[1].split("</tbody>")[0]
    assert [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body)] == \
        ["g0_forward_c1", "forward", "0", "1", "3", "arg0_1: float32[4]; arg1_1 = 2", ""]
    assert "neg = torch.ops.aten.neg.default(arg0_1)" in html
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "manifest.json").write_text('{"format": "something-else/9"}')
    with pytest.raises(ValueError, match="this tdbg cannot read it"):
        report.folder_document(str(damaged))


def test_html_adds_the_page_and_no_compiler_log_lines(foo2_run):
    """Issue 25: --html switched the compiler's debug traces on for its page, and with them the
    `compiler` log channel (config.debug turns it on): lines the same run without --html never prints."""
    assert foo2_run.code == 16, foo2_run.stderr
    assert "[tdbg." not in foo2_run.stderr and "[tdbg." not in foo2_run.stdout
    assert [d for d in os.listdir(os.path.join(foo2_run.html_dir, "debug")) if d.startswith("run_")]
    assert f"HTML report: {foo2_run.html_dir}/index.html" in foo2_run.stderr
