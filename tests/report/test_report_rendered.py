"""The HTML report in a real browser (headless Chromium via selenium): the page of a real
`tdbg run --html` loads without console errors, renders (a screenshot of many colours), links
provenance on click, and shows the CLI's own verdict; the culprit of `tdbg bisect` is marked in
all three panes (the issue's done-when check, in full under -m slow)."""
import json
import os

import pytest
from conftest import DATA, page_url, run_tdbg
from report_browser import png_colours

from tdbg.minifier.artifacts import report
from tdbg.minifier.artifacts.report import artifacts

GRAPH = "foo2__0_inference_0"


def by_css(browser, css):
    from selenium.webdriver.common.by import By
    return browser.find_elements(By.CSS_SELECTOR, css)


def pane_lines(browser, graph, pane, css):
    return [int(e.get_attribute("data-n"))
            for e in by_css(browser, f'.graph-code[data-graph="{graph}"] .pane[data-pane="{pane}"] .ln.{css}')]


def severe(browser) -> list:
    return [entry for entry in browser.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]


def run_graph(foo2_run) -> dict:
    graphs = artifacts.load_graphs(os.path.join(foo2_run.html_dir, "debug"))
    assert [g["name"] for g in graphs] == [GRAPH]
    return graphs[0]


def test_run_page_loads_renders_and_matches_the_cli(browser, foo2_run):
    assert foo2_run.code == 16, foo2_run.stderr
    assert f"HTML report: {foo2_run.html_dir}/index.html" in foo2_run.stderr
    browser.get_log("browser")     # drop what an earlier page logged
    browser.get(page_url(foo2_run.html_dir))
    assert severe(browser) == []
    colours = png_colours(browser.get_screenshot_as_png())
    assert len(colours) >= 5, f"the screenshot is (nearly) one colour: {colours}"
    cli = foo2_run.stdout.splitlines()
    failed = next(line for line in cli if line.startswith("FAILED "))
    source = next(line for line in cli if line.strip().startswith("source: ")).strip()[len("source: "):]
    text = {i: by_css(browser, f"#{i}")[0].text for i in ("verdict-headline", "v-stage", "v-source", "v-exit-code")}
    assert text == {"verdict-headline": failed, "v-stage": "accuracy", "v-source": source, "v-exit-code": "16"}


def test_clicking_an_fx_line_highlights_its_cpp_lines(browser, foo2_run):
    node = run_graph(foo2_run)["nodes"]["neg"]
    assert node["cpp_lines"], "the compiler's provenance gives neg no C++ lines"
    browser.get(page_url(foo2_run.html_dir))
    assert pane_lines(browser, GRAPH, "cpp", "hl") == []
    fx_line = by_css(browser, f'.graph-code[data-graph="{GRAPH}"] .pane[data-pane="fx"] .ln[data-nodes~="neg"]')[-1]
    fx_line.click()
    assert pane_lines(browser, GRAPH, "cpp", "hl") == node["cpp_lines"]
    assert pane_lines(browser, GRAPH, "ir", "hl") == node["ir_lines"]
    assert pane_lines(browser, GRAPH, "fx", "hl") == node["fx_lines"]
    user = by_css(browser, f'.graph-code[data-graph="{GRAPH}"] .src.hl')
    assert [e.text for e in user] == [node["source"]]
    assert "foo2.py:6" in node["source"]           # neg's own line, `a = torch.neg(x1)`
    assert severe(browser) == []


def test_bisect_culprit_is_marked_in_all_three_panes(browser, foo2_run, tmp_path):
    """bisect's document (stored from a real `TDBG_INJECT_BUG=neg:accuracy tdbg bisect
    examples/foo2.py`) with the debug folder of the same failing program."""
    doc = json.load(open(os.path.join(DATA, "bisect_foo2.json")))
    node = run_graph(foo2_run)["nodes"]["neg"]
    html = report.build(doc, command="bisect", debug_dirs=(os.path.join(foo2_run.html_dir, "debug"),))
    report.write(str(tmp_path), html)
    browser.get(page_url(str(tmp_path)))
    assert {pane: pane_lines(browser, GRAPH, pane, "culprit") for pane in ("fx", "ir", "cpp")} == \
        {"fx": node["fx_lines"], "ir": node["ir_lines"], "cpp": node["cpp_lines"]}
    assert by_css(browser, "#verdict-headline")[0].text == doc["verdict"]["summary"]
    assert severe(browser) == []


@pytest.mark.slow
def test_done_when_bisect_html(browser, tmp_path):
    """The issue's check, as a user types it: the culprit neg is marked in FX, IR and C++."""
    out = tmp_path / "out"
    proc = run_tdbg(["bisect", "examples/foo2.py", "--backend", "inductor", "--html", str(out)], {"TDBG_INJECT_BUG": "neg:accuracy"},
                    timeout=600)
    assert proc.returncode == 16, proc.stderr
    verdict = next(line for line in proc.stdout.splitlines() if line.startswith("Verdict: "))
    graphs = artifacts.load_graphs(str(out / "debug"))
    assert [g["name"] for g in graphs] == [GRAPH]
    node = graphs[0]["nodes"]["neg"]
    browser.get(page_url(str(out)))
    assert by_css(browser, "#verdict-headline")[0].text == verdict
    assert by_css(browser, "#v-fx-node")[0].text == "neg"
    marked = {pane: pane_lines(browser, GRAPH, pane, "culprit") for pane in ("fx", "ir", "cpp")}
    assert marked == {"fx": node["fx_lines"], "ir": node["ir_lines"], "cpp": node["cpp_lines"]}
    assert all(marked.values())
    assert severe(browser) == []
