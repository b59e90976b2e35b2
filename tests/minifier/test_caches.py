"""explain --caches' comparison (minifier/diagnose/caches.py) on lookups written as Inductor,
AOTAutograd and tdbg's builds report them: pure data, no run (the end-to-end runs are in
tests/scenarios/test_caches_real.py)."""
import json
import logging
import os

import pytest

from tdbg.minifier.diagnose import caches


def lookup(layer="inductor_fx_graph", state="miss", key="k1", cid="0/0", part="forward", **components):
    lines = [f"[h{abs(hash(v)) % 10**8}] {n}: {v}" for n, v in components.items()]
    return {"layer": layer, "state": state, "key": key, "compile_id": cid, "frame": "f (s.py:3)", "part": part,
            "bypass_reason": None, "components": caches.parse_components(lines)}


BASE = {"inductor_config[size_asserts]": "True", "inductor_config[max_autotune]": "False",
        "example_inputs[0]": "TensorMetadata(dtype=torch.float32, shape=torch.Size([8, 16]), stride=(16, 1), "
                             "requires_grad=True)",
        "gm": "GraphModule()\n\ndef forward(self, x):\n    sin = torch.ops.aten.sin.default(x)\n    return (sin,)",
        "torch_version": "\x8f\x01binary"}


def with_components(changes=None, **kw):
    comps = dict(BASE, **(changes or {}))
    e = lookup(**kw)
    e["components"] = caches.parse_components([f"[{abs(hash(v)) % 10**12:x}] {n}: {v}" for n, v in comps.items()])
    return e


def test_parse_components_keeps_name_hash_and_multiline_value():
    got = caches.parse_components(["[abc123] gm: GraphModule()\n\ndef forward(self):\n    pass",
                                   "[x9] fx_kwargs[is_backward]: False", "no brackets here"])
    assert got == [["gm", "abc123", "GraphModule()\n\ndef forward(self):\n    pass"],
                   ["fx_kwargs[is_backward]", "x9", "False"], ["no brackets here", "", ""]]


def test_a_config_change_is_named_by_its_key_alone():
    first = with_components(key="k1", state="miss")
    second = with_components({"inductor_config[size_asserts]": "False"}, key="k2", state="miss")
    row = caches.compare([second], [first], "a.json")["graphs"][0]["lookups"][0]
    assert [(d["component"], d["kind"], d["what"], d["before"], d["after"]) for d in row["differences"]] == [
        ("inductor_config[size_asserts]", "config", "torch._inductor.config.size_asserts", "True", "False")]
    assert row["why"] == "torch._inductor.config.size_asserts changed True -> False"
    assert row["compared_with"] == "0/0"


def test_input_metadata_graph_code_and_binary_components_in_plain_words():
    first = with_components(key="k1")
    second = with_components({"example_inputs[0]": BASE["example_inputs[0]"].replace("[8, 16]", "[9, 16]"),
                              "gm": BASE["gm"].replace("sin", "cos"), "torch_version": "\x8f\x02other"}, key="k2")
    details = [d["detail"] for d in caches.compare([second], [first], "x")["graphs"][0]["lookups"][0]["differences"]]
    assert details == ["input 0: shape [8, 16] -> [9, 16]",
                       "graph code changed at line 4: `sin = torch.ops.aten.sin.default(x)` -> "
                       "`cos = torch.ops.aten.cos.default(x)`",
                       "torch's version and source hash changed"]


def test_hit_bypass_and_same_key_miss():
    first = with_components(key="k1", state="miss")
    hit = with_components(key="k1", state="hit")
    bypass = lookup(layer="aot_autograd", state="bypass", key=None, part=None)
    bypass["bypass_reason"] = "Unsupported call_function target flex_attention"
    same = with_components(key="k1", state="miss", cid="1/0")
    rows = caches.compare([hit, bypass, same], [first], "x")["graphs"]
    assert [(g["compile_id"], [r["state"] for r in g["lookups"]]) for g in rows] == [("0/0", ["hit", "bypass"]),
                                                                                   ("1/0", ["miss"])]
    assert rows[0]["lookups"][0]["why"] is None
    assert rows[0]["lookups"][1]["why"] == "bypassed: Unsupported call_function target flex_attention"
    assert rows[1]["lookups"][0]["why"].startswith("the key equals the earlier lookup's (0/0, miss), but no usable")


def test_nearest_earlier_lookup_is_the_one_with_fewest_differences_and_the_same_part():
    far = with_components({"inductor_config[size_asserts]": "False", "inductor_config[max_autotune]": "True"},
                          key="a", cid="0/0")
    near = with_components({"inductor_config[max_autotune]": "True"}, key="b", cid="1/0")
    backward = with_components(key="c", cid="0/0", part="backward")     # identical components, other part
    now = with_components({"inductor_config[max_autotune]": "True", "inductor_config[size_asserts]": "False",
                           "example_inputs[0]": "TensorMetadata(dtype=torch.float64)"}, key="d", cid="0/0")
    row = caches.compare([now], [far, near, backward], "x")["graphs"][0]["lookups"][0]
    assert row["compared_with"] == "0/0" and [d["component"] for d in row["differences"]] == ["example_inputs[0]"]
    assert row["differences"][0]["detail"] == "input 0: dtype torch.float32 -> torch.float64; shape [8, 16] -> None; " \
                                             "stride (16, 1) -> None; requires_grad True -> None"


def test_a_new_graph_has_nothing_to_compare_with_and_totals_count_per_layer():
    now = [with_components(key="k", part="inference"), lookup(layer="tdbg_build", state="hit", part=None)]
    section = caches.compare(now, [], "x")
    assert section["graphs"][0]["lookups"][0]["why"] == "no earlier lookup of this layer and part to compare " \
                                                        "with (a new graph)"
    assert section["totals"] == {"inductor_fx_graph": {"hit": 0, "miss": 1, "bypass": 0},
                                 "tdbg_build": {"hit": 1, "miss": 0, "bypass": 0}}
    assert caches.summary_words(section) == ["Inductor FX graph cache: 1 miss",
                                             "tdbg build cache (g++ libraries): 1 hit"]


def test_tdbg_build_components_name_the_toolchain_and_kernel_source():
    a = lookup(layer="tdbg_build", key="a", part=None, **{"toolchain[cxx_flags]": "-O3",
                                                          "unit[cpp_k0]": "1 kernel(s), sha256 d1c5 (cached)"})
    b = lookup(layer="tdbg_build", key="b", part=None, **{"toolchain[cxx_flags]": "-O2",
                                                          "unit[cpp_k0]": "1 kernel(s), sha256 9dcf (built)"})
    assert [d["detail"] for d in caches.compare([b], [a], "x")["graphs"][0]["lookups"][0]["differences"]] == [
        "g++ toolchain: cxx_flags changed -O3 -> -O2", "C++ source of cpp_k0 changed (sha256 d1c5 -> 9dcf)"]


def test_recorder_writes_lookups_with_frame_and_part(tmp_path):
    rec = caches.CacheRecorder(str(tmp_path / "ev.jsonl"))
    rec.dirs = {}     # skip the cache-dir line: no Inductor here
    rec._record({"str": ["/x/s.py", 1]}, None)
    rec._record({"dynamo_start": {"stack": [{"line": 3, "name": "f", "filename": 1}]}, "frame_id": 0,
                 "frame_compile_id": 1, "attempt": 0}, None)
    payload = {"cache_state": "miss", "key": "fk", "components": ["[a1] fx_kwargs[is_backward]: True"]}
    rec._record({"artifact": {"name": "fx_graph_cache_miss", "encoding": "json"}, "frame_id": 0,
                 "frame_compile_id": 1, "attempt": 0}, json.dumps(payload))
    rec._record({"artifact": {"name": "aotautograd_cache_bypass"}, "frame_id": 2, "frame_compile_id": 0,
                 "attempt": 1}, json.dumps({"cache_state": "bypass", "cache_bypass_reason": "why not"}))
    rec._record({"artifact": {"name": "inductor_output_code"}, "frame_id": 0, "frame_compile_id": 1}, "code")
    events, _ = caches.read_events(str(tmp_path / "ev.jsonl"))
    assert events == [
        {"layer": "inductor_fx_graph", "state": "miss", "compile_id": "0/1", "frame": "f (/x/s.py:3)",
         "part": "backward", "key": "fk", "bypass_reason": None, "components": [["fx_kwargs[is_backward]", "a1", "True"]]},
        {"layer": "aot_autograd", "state": "bypass", "compile_id": "2/0_1", "frame": None, "part": None, "key": None,
         "bypass_reason": "why not", "components": []}]


def test_recorder_prints_nothing_new_from_aot_autograds_logger(tmp_path):
    from tdbg.compiler.torch_compat import trace_log
    from tdbg.minifier.runs.inductor_hooks import ENTRIES
    log = logging.getLogger(ENTRIES.entries["autograd_cache_log"].module)
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    saved = (log.level, list(log.filters), log.propagate)
    log.addHandler(handler)
    rec = caches.CacheRecorder(str(tmp_path / "ev.jsonl")).install()
    try:
        assert log.isEnabledFor(logging.DEBUG)        # AOTAutograd then computes its key's components
        log.debug("debug lines")
        log.info("cache miss")
        log.warning("kept")
        assert [r.getMessage() for r in seen] == ["kept"]
    finally:
        trace_log.removeHandler(rec)
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.filters[:] = saved[1]


@pytest.mark.parametrize("content, words", [
    ("{", "is not JSON"), ('{"schema": "tdbg.run"}', "is not the --json document of a `tdbg explain --caches`"),
    ('{"schema": "tdbg.explain", "caches": null}', "is not the --json document")])
def test_load_saved_refuses_other_documents(tmp_path, content, words):
    p = tmp_path / "a.json"
    p.write_text(content)
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        caches.load_saved(str(p))
    with pytest.raises(ValueError, match="cannot read --against"):
        caches.load_saved(str(tmp_path / "missing.json"))


def test_html_section_has_one_row_per_lookup():
    from tdbg.minifier.artifacts.report.sections import caches_section
    first = with_components(key="k1")
    section = caches.compare([with_components({"inductor_config[size_asserts]": "False"}, key="k2"),
                              with_components(key="k1", state="hit", part="backward")], [first], "a.json")
    section.update(first_run=None, cache_dirs={"inductor": "/tmp/c"})
    html = caches_section({"document": {"schema": "tdbg.explain", "caches": section}})
    assert html.count("<tr>") == 3          # the header and two lookups
    assert ('<td>Inductor FX graph cache (forward)</td><td><span class="bad">miss</span></td>'
            "<td>torch._inductor.config.size_asserts changed True -&gt; False</td><td>0/0</td>") in html
    assert '<span class="good">hit</span>' in html and "<dd>/tmp/c</dd>" in html
    assert caches_section({"document": {"schema": "tdbg.explain"}}) is None


def test_cli_refuses_an_against_file_that_is_no_caches_document_before_any_run(tmp_path):
    import subprocess
    import sys

    from tdbg.cli.console import exit_code
    bad = tmp_path / "run.json"
    bad.write_text('{"schema": "tdbg.run", "version": 2}')
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", "explain", "--against", str(bad), "--backend",
                           "eager", "tests/scenarios/scripts/caches_config.py", "--json", str(out)],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, COLUMNS="300"))
    assert proc.returncode == exit_code("bad_input"), proc.stderr
    assert "is not the --json document of a `tdbg explain --caches` run" in proc.stderr
    assert "grad sum" not in proc.stdout + proc.stderr          # the script never ran
    assert json.loads(out.read_text())["cause"] == "bad_input"


def test_tdbg_builds_report_their_lookup_with_its_key_components(tmp_path):
    from tdbg.compiler import build, config
    from tdbg.compiler.torch_compat import trace_log
    rec = caches.CacheRecorder(str(tmp_path / "ev.jsonl"))
    rec.dirs = {}
    trace_log.addHandler(rec)
    try:
        cfg = config.current()
        units = [("cpp_a", "src a", ["cpp_a"]), ("cpp_b", "src b", ["cpp_b"])]
        build._trace_lookup(cfg, units, [units[1]])
        build._trace_lookup(cfg, units, [])
    finally:
        trace_log.removeHandler(rec)
    events, _ = caches.read_events(str(tmp_path / "ev.jsonl"))
    assert [e["state"] for e in events] == ["miss", "hit"] and {e["layer"] for e in events} == {"tdbg_build"}
    names = [n for n, _, _ in events[0]["components"]]
    assert names == ["toolchain[cxx]", "toolchain[cxx_flags]", "toolchain[link_libs]", "toolchain[compiler_version]",
                     "toolchain[headers]", "toolchain[machine]", "unit[cpp_a]", "unit[cpp_b]"]
    values = {n: v for n, _, v in events[0]["components"]}
    assert values["toolchain[cxx]"] == cfg.cxx and values["toolchain[cxx_flags]"] == " ".join(cfg.cxx_flags)
    assert values["unit[cpp_b]"].endswith("(built)") and values["unit[cpp_a]"].endswith("(cached)")
    assert events[0]["key"] == events[1]["key"]      # the key covers what is built, not whether it was cached


# -- a cache turned off: no lookup, so only its setting can say so -----------------------------------
def test_the_recorder_writes_cache_settings_when_a_compile_ends(tmp_path, monkeypatch):
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    rec = caches.CacheRecorder(str(tmp_path / "ev.jsonl"))
    for _ in range(2):   # the same settings twice: written once
        rec._record({"compilation_metrics": {}, "frame_id": 0, "frame_compile_id": 0}, None)
    settings = caches.read_settings(str(tmp_path / "ev.jsonl"))
    assert settings["torch._inductor.config.fx_graph_cache"] is False
    assert settings["torch._functorch.config.enable_autograd_cache"] is functorch_config.enable_autograd_cache
    assert (tmp_path / "ev.jsonl").read_text().count("settings") == 1
    assert caches.read_events(str(tmp_path / "ev.jsonl")) == ([], {})


def test_a_cache_turned_off_is_said_plainly():
    on = {"torch._inductor.config.force_disable_caches": False, "torch._inductor.config.fx_graph_cache": True,
          "torch._functorch.config.enable_autograd_cache": True, "inductor_loaded": True}
    assert caches.turned_off(on) == []
    [row] = caches.turned_off(dict(on, **{"torch._inductor.config.fx_graph_cache": False}))
    assert (row["layer"], row["words"]) == ("inductor_fx_graph", (
        "Inductor FX graph cache: OFF (torch._inductor.config.fx_graph_cache = False; TORCHINDUCTOR_FX_GRAPH_CACHE=0 "
        "sets it): no lookup was made, every graph was compiled afresh"))
    forced = caches.turned_off(dict(on, **{"torch._inductor.config.force_disable_caches": True}))
    assert [(r["layer"], r["how"]) for r in forced] == [
        ("inductor_fx_graph", "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 or torch.compiler.config.force_disable_caches"),
        ("aot_autograd", "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 or torch.compiler.config.force_disable_caches")]
    # Inductor never compiled (tdbg's own compiler, eager): its caches were not in play
    assert caches.turned_off(dict(on, inductor_loaded=False, **{"torch._inductor.config.fx_graph_cache": False})) == []
