"""Stages and places on real bugs (issue 22 item 7).

- PyTorch #194706: Inductor's generated C++ for `torch.compile(jacfwd(f))` on float16 does not
  compile. The run is stage cpp_build (exit 14), names Inductor's kernel, the FX nodes fused into
  it and their user lines (never Inductor's generated module), and g++'s first error.
- A culprit op's own line: bisect names the line of the culprit FX node (foo2's `neg`, line 6;
  #175966's `mul`, line 18), not the line of the graph output where the wrong value shows (foo2's
  `cat`, line 8), the same in the terminal, the JSON document and the HTML page.
"""
import os
import re

import pytest

from tdbg.cli.console import exit_code

S = os.path.join("tests", "scenarios", "scripts")
JACFWD = os.path.join(S, "issue_194706_jacfwd.py")
ARANGE = os.path.join(S, "issue_175966_int64_arange.py")
RUN_JACFWD = (("run", JACFWD, "--backend", "torch:inductor"), {})


def _jacfwd_line(n: int, code: str) -> str:
    return f"{JACFWD}:{n} in f: {code}"


def test_inductor_cpp_compile_error_is_stage_build_with_kernel_and_user_lines(tdbg_runs):
    r = tdbg_runs(*RUN_JACFWD)
    err = r.json["verdict"]["error"]
    assert (r.code, r.json["exit_code"], err["stage"], err["type"]) == (14, 14, "cpp_build", "CppCompileError")
    # Inductor names a CPU kernel cpp_fused_<its ops>_<n>; the failing one holds the fp16 sum
    assert re.fullmatch(r"cpp_fused_\w*_sum_\w*_\d+", err["kernel"]), err["kernel"]
    assert err["source"] == _jacfwd_line(7, "return torch.sum(torch.mm(torch.mm(torch.prod(x) + x,")
    assert err["source_lines"] == [_jacfwd_line(7, "return torch.sum(torch.mm(torch.mm(torch.prod(x) + x,"),
                                   _jacfwd_line(8, "torch.sum(x) + x),"), _jacfwd_line(9, "torch.sum(x) + x))")]
    assert {"prod", "sum_1"} <= set(err["fx_node"].split(", "))
    first = err["message"].splitlines()[0]
    assert first.startswith(f"CppCompileError: g++ rejected Inductor's kernel {err['kernel']}: ")
    assert "error: conflicting declaration" in first and "at_Half_tmp_acc1_vec" in first
    assert "torchinductor" not in err["source"] and "torchinductor" not in " ".join(err["source_lines"])
    assert "(stage cpp_build, exit code 14)" in r.stdout
    assert f"  source: {err['source']}" in r.stdout and f"  kernel: {err['kernel']}" in r.stdout
    assert "  lines:" in r.stdout and _jacfwd_line(9, "torch.sum(x) + x))") in r.stdout
    # the verdict's own status of the script agrees with the document (it raised: 1, tdbg: 14)
    assert "exit_code" not in r.json["verdict"] and r.json["verdict"]["script_exit_code"] == 1


def _html_source(html_dir: str) -> str:
    """The verdict's "user source line" of the HTML page (element id v-source)."""
    import html
    with open(os.path.join(html_dir, "index.html")) as f:
        page = f.read()
    found = re.search(r'id="v-source"[^>]*>(.*?)</', page, re.S)
    return html.unescape(found.group(1)) if found else None


@pytest.fixture(scope="module")
def html_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("places-html")
    return {name: str(base / name) for name in ("foo2", "arange")}


def _bisect_foo2(html_dirs):
    return (("bisect", "examples/foo2.py", "--backend", "inductor", "--html", html_dirs["foo2"]),
            {"TDBG_INJECT_BUG": "neg:accuracy"})


def _assert_culprit_line(r, html_dir: str, line: str, seen_at=None):
    verdict = r.stdout.split("Verdict:", 1)[1]
    assert f"\n  source: {line}\n" in verdict, verdict
    if seen_at:   # the output's line is shown as where the wrong value showed, never as the source
        assert f"\n  seen at: {seen_at}\n" in verdict
    culprit = next(c for c in r.json["culprits"] if c.get("source"))
    assert (r.json["source"], culprit["source"]) == (line, line)
    assert r.json["version"] == 2
    assert _html_source(html_dir) == line


def test_bisect_names_the_culprit_ops_own_line(tdbg_runs, html_dirs):
    r = tdbg_runs(*_bisect_foo2(html_dirs))
    assert r.code == exit_code("accuracy"), r.output
    assert r.json["culprits"][0]["fx_node"] == "neg"
    _assert_culprit_line(r, html_dirs["foo2"], "examples/foo2.py:6 in foo2: a = torch.neg(x1)",
                         seen_at="examples/foo2.py:8 in foo2: y = torch.cat([b], dim=0)")
    assert "  source: examples/foo2.py:6 in foo2: a = torch.neg(x1)" in r.stdout.split("Verdict:")[0]


@pytest.mark.slow
def test_bisect_through_torchs_bisector_names_the_culprit_ops_own_line(tdbg_runs, html_dirs):
    r = tdbg_runs(("bisect", ARANGE, "--backend", "torch:inductor", "--html", html_dirs["arange"]), {})
    assert r.code == exit_code("accuracy"), r.output
    (culprit,) = [c for c in r.json["culprits"] if c.get("index") is not None]
    assert (culprit["subsystem"], culprit["applied"], culprit["target"]) == ("lowerings", "mul", "aten.mul.Tensor")
    line = (f"{ARANGE}:18 in forward: pos = torch.arange(x.shape[0], dtype=torch.int64) * "
            "torch.tensor(1_000_000_000)")
    _assert_culprit_line(r, html_dirs["arange"], line)
