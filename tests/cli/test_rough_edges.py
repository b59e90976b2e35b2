"""Issue 25's rough edges, one regression test each (in-process and cheap: no tdbg subprocess)."""
import io

from tdbg.cli import console

LONG = "torch:aot_eager_decomp_partition"


def _chain_table(c) -> str:
    from tdbg.cli.bisect import _render_chain
    rows = [{"backend": b, "status": "ok", "adds": "AOTAutograd with the decompositions and partitioner Inductor "
             "uses, run eagerly (no code generation)", "duration_s": 1.5} for b in ("eager", LONG)]
    _render_chain(c, {"backends": rows, "chain": ["eager", LONG]})
    return c.file.getvalue()


def test_piped_tables_keep_backend_names_whole():
    """A console that is not a terminal (a pipe, a CI log) printed `torch:aot_eager_decomp_partiti` /
    `on` on two lines at 80 columns; it is now PIPE_WIDTH wide, so the name is on one line."""
    text = _chain_table(console._console(file=io.StringIO()))
    (line,) = [ln for ln in text.splitlines() if "aot_eager_decomp" in ln]
    assert LONG in line and "run eagerly (no code generation)" in line
    assert console._console(file=io.StringIO()).width == console.PIPE_WIDTH


def test_a_terminal_keeps_its_own_width():
    c = console._console(file=io.StringIO(), force_terminal=True, color_system=None, width=60)
    assert c.width == 60
    assert max(len(ln) for ln in _chain_table(c).splitlines()) <= 60


# ---------------------------------------------------------------- timings that hold (item 1)

import time  # noqa: E402

import pytest  # noqa: E402

from tdbg.minifier.diagnose import timing  # noqa: E402

ISSUE_SAMPLES_MS = [46.1, 96.0, 51.9, 0.061, 0.030]   # what `run --save-io --profile` saved: warm-up included


def _legacy(times_ms) -> dict:
    """A timing record as folders saved before issue 25 wrote it (no warm-up, no NOISY verdict)."""
    times = [t / 1e3 for t in times_ms]
    return {"median_s": sorted(times)[len(times) // 2], "min_s": min(times), "samples": len(times), "times_s": times,
            "per_kernel": None}


def _saved_folder(path, record: dict) -> str:
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from tdbg.minifier.artifacts.saved_io import Writer
    x = torch.ones(4, 3)
    gm = make_fx(lambda x: (torch.relu(x),))(x)
    writer = Writer(str(path), {"backend": "inductor", "script": "s.py", "after": "aot"})
    name = writer.add(kind="forward", graph=0, call=1, gm=gm, inputs=[x], expected=[torch.relu(x)],
                      compiled=[torch.relu(x)], compiled_error=None, node_sources={}, replay={}, signature="sig")
    writer.set_timing(name, record)
    writer.finish()
    return str(path)


def _quiet(times_ms) -> dict:
    return timing.Timing([t / 1e3 for t in times_ms], warmup_calls=4, busy_share=0.0).to_dict()


def test_diff_of_warm_up_samples_says_too_noisy_not_slower(tmp_path, monkeypatch):
    """The issue's two identical runs: `slower: 0.206 ms -> 15.294 ms (74.23x)` from samples with
    warm-up in them. Now: too noisy to compare, and why."""
    from tdbg.cli import diff as cli_diff
    from tdbg.minifier.diagnose.diff import diff_saved
    a = _saved_folder(tmp_path / "a", _legacy([0.206, 0.210, 0.204, 0.209, 0.205]))
    b = _saved_folder(tmp_path / "b", _legacy(ISSUE_SAMPLES_MS))
    (g,) = diff_saved(a, b).graphs
    assert g.timing["verdict"] == "noisy" and g.timing["slower"] is False
    assert g.timing["why"] == "B: the samples spread 112% of their median (interquartile range)"
    monkeypatch.setattr(console, "_out", console._console(file=io.StringIO()))
    cli_diff.render(diff_saved(a, b))
    text = console._out.file.getvalue()
    assert "slower" not in text
    assert ("    time: 0.206 ms -> 46.100 ms median per call: timings too noisy to compare "
            "(B: the samples spread 112% of their median (interquartile range))") in text


def test_diff_calls_slower_only_when_both_runs_are_quiet_and_apart(tmp_path):
    from tdbg.minifier.diagnose.diff import diff_saved
    base = _saved_folder(tmp_path / "a", _quiet([1.00, 1.01, 0.99, 1.02, 1.00, 0.98]))
    slower = _saved_folder(tmp_path / "b", _quiet([2.00, 2.02, 1.98, 2.01, 2.00, 1.99]))
    busy = _saved_folder(tmp_path / "c", dict(_quiet([2.00, 2.02, 1.98, 2.01, 2.00, 1.99]), busy_share=0.6, noisy=None))
    (g,) = diff_saved(base, slower).graphs
    assert (g.timing["verdict"], g.timing["slower"], g.timing["ratio"]) == ("slower", True, pytest.approx(2.0))
    (g,) = diff_saved(slower, base).graphs
    assert g.timing["verdict"] == "faster" and g.timing["ratio"] == pytest.approx(0.5)
    (g,) = diff_saved(base, busy).graphs
    assert g.timing["verdict"] == "noisy"
    assert g.timing["why"] == "B: the machine was busy: other processes used 60% of the CPUs while timing"


def test_a_ratio_within_the_runs_spread_is_the_same_time():
    a = timing.Timing([1.0, 1.0, 1.0, 1.0, 1.3, 1.3, 1.3, 1.3], busy_share=0.0)   # spread 30%: NOISY
    assert timing.compare_times(a, a, 1.25)["verdict"] == "noisy"
    a = timing.Timing([1.0, 1.0, 1.1, 1.2, 1.2, 1.2], busy_share=0.0)
    b = timing.Timing([1.1, 1.15, 1.35, 1.4, 1.45, 1.5], busy_share=0.0)
    assert a.noisy is None and b.noisy is None
    assert timing.compare_times(a, b, 1.2) == {"verdict": "same", "ratio": pytest.approx(1.375 / 1.15), "why": None}
    # medians 1.20x apart, but B's first quartile (1.2) is not above A's third (1.2)
    assert timing.compare_times(a, b, 1.15) == {
        "verdict": "same", "ratio": pytest.approx(1.375 / 1.15),
        "why": "the difference is within the runs' spread (their middle halves overlap)"}
    b = timing.Timing([1.2, 1.3, 1.35, 1.4, 1.45, 1.5], busy_share=0.0)
    assert timing.compare_times(a, b, 1.15)["verdict"] == "slower"


def test_measure_leaves_warm_up_out():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.02 if len(calls) <= 3 else 0.0005)    # three slow first calls, as in the issue
    t = timing.measure(fn, min_seconds=0.02)
    assert t.warmup_calls >= 3 + timing.WARMUP_WINDOW
    assert t.samples >= timing.MIN_SAMPLES and max(t.times_s) < 0.01
    assert len(calls) == t.warmup_calls + t.samples * t.calls_per_sample


def test_alternate_never_times_a_callable_on_another_ones_caches():
    """ELECTRA read tdbg/Inductor 1.07 in the models benchmark, 1.02 timed alone: Inductor ran on the
    weights eager had just pulled into cache, tdbg's packed copy was cold. A callable's first call
    after another one is now a settling call, never timed."""
    log = []

    def runner(name):
        def run():
            cold = not log or log[-1] != name
            log.append(name)
            time.sleep(0.02 if cold else 0.001)    # slow only right after the other callable
        return run
    samples = timing.alternate({"a": runner("a"), "b": runner("b")}, repeat=3, number=2)
    assert log == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3
    for name in "ab":
        assert len(samples[name]["seconds"]) == 3 and max(samples[name]["seconds"]) < 0.01
    unsettled = timing.alternate({"a": runner("a"), "b": runner("b")}, repeat=3, number=2, settle=0)
    assert min(unsettled["b"]["seconds"]) >= 0.01    # what the old timing did: half of each run cold


def test_busy_share_is_other_processes_ticks(monkeypatch):
    """/proc/stat's busy ticks minus this process's own, over all ticks."""
    stats = iter([(1000, 5000), (1000 + 300, 5000 + 400)])
    own = iter([50.0, 50.0 + 100])
    monkeypatch.setattr(timing, "_proc_stat", lambda: next(stats))
    monkeypatch.setattr(timing, "_own_ticks", lambda: next(own))
    monkeypatch.setattr(timing.os, "cpu_count", lambda: 2)
    assert timing.CpuWatch().share() == pytest.approx(200 / 400)
    assert timing.noisy_reason([1.0] * 10, 0.5) == \
        "the machine was busy: other processes used 50% of the CPUs while timing"


def test_profile_never_calls_noisy_timings_slower():
    from tdbg.minifier.diagnose.profiling import CallableProfile, ProfileReport, lost_speed_flags
    noisy = CallableProfile("Model", 3, 0.5, 0.001, 0.002, 0.5, 0.0, noisy="compiled: the samples spread 40% of "
                            "their median (interquartile range)")
    quiet = CallableProfile("Other", 3, 0.5, 0.001, 0.002, 0.5, 0.0)
    report = ProfileReport("s.py", "inductor", 20, 1.0, 1.0, [noisy, quiet], [], {}, [], [],
                           {"functions": []}, [], [], None)
    assert lost_speed_flags(report) == [
        {"kind": "slower", "message": "Other: compiled is 2.00x slower than eager"},
        {"kind": "noisy", "message": "Model: timings too noisy to compare eager and compiled (compiled: the samples "
                                     "spread 40% of their median (interquartile range)); rerun on a quiet machine"}]


def test_profile_times_after_warm_up():
    """`profile` once showed eager at 15.753 ms, then 0.047 ms on a rerun: the first replays are
    warm-up and are not timed."""
    from tdbg.minifier.diagnose.profiling import TimedCallable, _time_callable
    calls = {"eager": 0}

    def eager(x):
        calls["eager"] += 1
        time.sleep(0.03 if calls["eager"] <= 2 else 0.0002)
        return x

    c = TimedCallable("f", eager, lambda x: x)
    c(1)
    calls["eager"] = 0       # the script's call above ran the compiled one: eager is cold
    p = _time_callable(c, 10)
    assert p.eager_s < 0.005


# ---------------------------------------------------------------- explain's counts (item 5)

def _graph(index, frame, ops):
    return {"index": index, "frame": frame, "ops": ops, "lines": [], "reason": "", "graph_break": False, "stack": []}


def test_explain_counts_the_graphs_it_lists_and_says_why_a_piece_has_two(monkeypatch):
    """toy_example said "3 graph(s) (4 compiled...)" and listed graphs 0-3: the count is now the
    graphs listed, and each extra graph of a piece says why it exists."""
    from tdbg.cli import explain as cli_explain
    from tdbg.minifier.diagnose.explain import build_report
    resume = "torch_dynamo_resume_in_toy_example_at_8"
    verdict = {"status": "ok", "graphs": [
        _graph(0, "toy_example", ["abs"]), _graph(1, "torch_dynamo_resume_in_toy_example_at_7", ["lt"]),
        _graph(2, resume, ["mul"]), _graph(3, resume, ["mul", "mul"]), _graph(4, resume, ["mul"])],
        "recompiles": [{"frame": resume, "file": "t.py", "line": 8, "reason": "0/0: tensor 'x' size mismatch at index 0."
                        " expected 8, actual 16", "graphs_before": 4}]}
    report = build_report(verdict)
    (fn,) = report["functions"]
    assert [(g["again"], g["again_of"]) for g in fn["graphs"]] == [
        (None, None), (None, None), (None, None), ("other_path", 2), ("recompile", 2)]
    monkeypatch.setattr(console, "_out", console._console(file=io.StringIO()))
    cli_explain.render(report, verdict, [], "t.py")
    lines = console._out.file.getvalue().splitlines()
    assert lines[0] == "t.py: 1 compiled function(s), 5 graph(s) for 3 piece(s), 0 graph break(s), 1 recompile(s)"
    assert "toy_example: 5 graph(s) for 3 piece(s), 0 graph break(s), 1 recompile(s)" in lines
    shown = "toy_example, resumed after the break at line 8"   # frames by the user's function name
    assert f"  graph 3 ({shown}; graph 2's piece again, reached another way, e.g. the other side of a branch): " \
           "2 op(s): mul x2" in lines
    assert f"  graph 4 ({shown}; recompile of graph 2's piece: a guard failed): 1 op(s): mul" in lines


# ---------------------------------------------------------------- repro.py's verdict (item 6)

def test_a_repro_that_cannot_run_says_why_once(monkeypatch, capsys):
    """A repro.py run where tdbg does not import printed its "install tdbg" message twice (the
    verdict line, then the same message as evidence), after "cannot run: cannot run"."""
    from tdbg.repro_templates import runtime
    message = ("this repro compiles with tdbg's own compiler, and tdbg does not import here (no tdbg); "
               "install tdbg (pip install tdbg) to run it")
    monkeypatch.setattr(runtime, "_in_child", lambda namespace, timeout: runtime.outcome(
        "cannot_run", exc_type="CannotRun", message=message))
    assert runtime.run_repro({"EXPECTED": None}, []) == 3
    assert capsys.readouterr().out == f"Cannot run this repro: {message}\n"


# ---------------------------------------------------------------- profile's trace file (item 7)

def test_profile_trace_goes_to_a_new_temporary_folder_never_the_current_one(tmp_path, monkeypatch):
    import os
    import tempfile

    from tdbg.cli.profile import _trace_path
    monkeypatch.chdir(tmp_path)
    path = _trace_path("examples/foo1.py", None, False)
    assert os.path.basename(path) == "foo1.trace.json" and os.listdir(os.path.dirname(path)) == []
    assert os.path.dirname(os.path.dirname(path)) == tempfile.gettempdir() and os.listdir(tmp_path) == []
    os.rmdir(os.path.dirname(path))
    assert _trace_path("x.py", "mine.json", False) == "mine.json"


def test_profile_never_overwrites_a_trace_file_without_force(tmp_path, capsys):
    from tdbg.cli.profile import _trace_path
    mine = tmp_path / "mine.json"
    mine.write_text("keep")
    with pytest.raises(SystemExit) as done:
        _trace_path("x.py", str(mine), False)
    assert done.value.code == console.exit_code("usage") and mine.read_text() == "keep"
    assert f"{mine} already exists; pass --force" in capsys.readouterr().err
    assert _trace_path("x.py", str(mine), True) == str(mine)


def test_a_median_without_samples_is_not_compared(tmp_path):
    from tdbg.minifier.diagnose.diff import diff_saved
    import json
    import os
    a = _saved_folder(tmp_path / "a", _quiet([1.0] * 10))
    b = _saved_folder(tmp_path / "b", _quiet([3.0] * 10))
    meta_path = os.path.join(a, "g0_forward_c1", "meta.json")
    meta = json.load(open(meta_path))
    meta["timing"] = {"median_s": 0.001, "min_s": 0.001, "samples": 5, "per_kernel": None}   # an older folder
    json.dump(meta, open(meta_path, "w"))
    (g,) = diff_saved(a, b).graphs
    assert (g.timing["verdict"], g.timing["slower"]) == ("noisy", False)
