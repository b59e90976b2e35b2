"""Subnormal values: the census counts exactly what each op reads, flushed() flushes in every
thread and restores, the lost-speed rule, and `tdbg profile` end to end."""
import json
import os

import pytest
import torch
from click.testing import CliRunner

from tdbg.cli.main import cli
from tdbg.minifier.diagnose import subnormals

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
TINY = torch.finfo(torch.float32).tiny
needs_flush = pytest.mark.skipif(subnormals.flush_supported() is not None, reason="no x86 flush-to-zero here")


def test_census_counts_each_ops_reads_and_skips_moves_and_float16():
    a = torch.ones(4, 8)
    a[0, :3] = 1e-39                      # 3 subnormal
    a[1, 0] = -TINY / 2                   # 1 negative subnormal; 0.0 and TINY itself are not
    a[2, 0], a[2, 1] = 0.0, TINY
    b = torch.ones(8, 2, dtype=torch.float64)
    b[0, 0] = 1e-310                      # float64 subnormal
    h = torch.full((4,), 1e-6, dtype=torch.float16)   # float16 subnormal, normal in float32: not counted

    def fn():
        t = a.t().contiguous().t()        # moves only: skipped
        return torch.mm(t, b.float()), torch.relu(t), h * 2

    c = subnormals.census(fn)
    rows = {o.op: (o.calls, o.values, o.subnormal) for o in c.ops}
    # b.float() (a _to_copy) is a move; 1e-310 becomes 0 in float32, so mm reads a's 4 only
    assert rows == {"mm": (1, 32 + 16, 4), "relu": (1, 32, 4)}
    assert (c.values, c.subnormal) == (80, 8) and c.share == pytest.approx(0.1)
    assert [o.op for o in c.top()] == ["mm", "relu"]
    assert "_to_copy" in subnormals.MOVES and "mul" not in subnormals.MOVES


def test_census_counts_float64_and_bfloat16_by_their_own_smallest_normal():
    d = torch.tensor([1e-310, 1e-300, 1e-39], dtype=torch.float64)   # 1e-39 is normal in float64
    bf = torch.tensor([1e-39, 1.0], dtype=torch.bfloat16)
    c = subnormals.census(lambda: (d + 1, bf * 2))
    assert {o.op: o.subnormal for o in c.ops} == {"add": 1, "mul": 1}


@needs_flush
def test_flushed_reaches_every_thread_and_restores():
    x = torch.full((1 << 20,), 1e-39)     # split between the OpenMP threads by aten's parallel_for
    assert torch.get_num_threads() == 1 or (x * 1).count_nonzero() == x.numel()
    with subnormals.flushed():
        assert (x * 1).count_nonzero() == 0
        assert subnormals.already_flushed()
    assert (x * 1).count_nonzero() == x.numel()
    assert not subnormals.already_flushed()
    with pytest.raises(ValueError), subnormals.flushed():
        raise ValueError("the body failed")
    assert (x * 1).count_nonzero() == x.numel()
    assert subnormals.set_flush(True) is False and subnormals.set_flush(False) is True
    assert (x * 1).count_nonzero() == x.numel()


def _found(share=0.1, cost=None, why=None, already=False, census=True):
    ops = [{"op": "addmm", "calls": 2, "values": 100, "subnormal": 7}, {"op": "add", "calls": 1, "values": 10, "subnormal": 3}]
    return {"census": {"values": 100, "subnormal": 10, "share": share, "ops": ops} if census else None,
            "already_flushed": already, "cost": cost, "not_measured": why}


def _cost(eager, flushed):
    return {"eager": {"as_is_s": eager, "flushed_s": flushed, "noisy": None}}


@pytest.mark.parametrize("found, flagged", [
    (_found(cost=_cost(1.0, 0.96)), False),            # flushing saves 4%: not worth a line
    (_found(cost=_cost(1.0, 0.95)), True),
    (_found(share=0.009, why="no x86"), False),         # unmeasured: by the share of values
    (_found(share=0.01, why="no x86"), True),
    (_found(cost=None, why="already", already=True), False),
    (_found(census=False, why="the count failed"), False),
])
def test_flag_rule(found, flagged):
    assert (subnormals.flag_message("f", found) is not None) == flagged


def test_flag_message_names_the_ops_and_both_times():
    cost = {"eager": {"as_is_s": 0.0625, "flushed_s": 0.005, "noisy": None},
            "compiled": {"as_is_s": 0.06, "flushed_s": 0.004, "noisy": "only 3 sample(s)"}}
    assert subnormals.flag_message("f (s.py:3)", _found(cost=cost)) == (
        "f (s.py:3): 10.0% of the values its ops read are subnormal (nonzero, below the smallest normal number, "
        "1.2e-38 in float32; most in addmm 7, add 3); CPUs do arithmetic on them in microcode, for eager and every "
        "backend alike: eager 62.500 ms, 5.000 ms with them flushed to zero; compiled 60.000 ms, 4.000 ms with them "
        "flushed to zero (noisy: only 3 sample(s)); torch.set_flush_denormal(True) at the top of the script, before "
        "torch starts its threads, flushes them in every thread (it changes values below 1.2e-38 to 0)")
    assert subnormals.flag_message("f", _found(share=0.5, why="no x86")).endswith(
        "(the cost was not measured: no x86); torch.set_flush_denormal(True) at the top of the script, before torch "
        "starts its threads, flushes them in every thread (it changes values below 1.2e-38 to 0)")


def _profile(tmp_path, script):
    out = tmp_path / "p.json"
    result = CliRunner().invoke(cli, ["profile", script, "--backend", "inductor", "--iterations", "3",
                                      "--trace", str(tmp_path / "t.json"), "--json", str(out)])
    assert result.exit_code == 0, result.output
    return result, json.loads(out.read_text())


@needs_flush
def test_profile_counts_and_times_a_models_subnormal_input(tmp_path):
    result, doc = _profile(tmp_path, os.path.join(SCRIPTS, "subnormal_linear.py"))
    [net] = doc["callables"]
    found = net["subnormals"]
    ops = {o["op"]: o["subnormal"] for o in found["census"]["ops"]}
    assert ops == {"addmm": 256 * 512} and not found["already_flushed"] and found["not_measured"] is None
    assert sorted(found["cost"]) == ["compiled", "eager"]
    assert all(0 < c["flushed_s"] and 0 < c["as_is_s"] for c in found["cost"].values())
    flagged = [f for f in doc["flags"] if f["kind"] == "subnormals"]
    # whether flushing pays is the CPU's business (some handle subnormals at full speed); the rule is ours
    assert len(flagged) == (subnormals.saved_share(found["cost"]) >= subnormals.FLAG_COST)
    if flagged:
        assert flagged[0]["message"].startswith("Net: ") and "most in addmm 131,072" in flagged[0]["message"]
        assert "subnormals: Net: " in result.output


@needs_flush
def test_profile_of_a_script_that_flushes_already_has_no_flag(tmp_path):
    script = tmp_path / "flushing.py"
    source = open(os.path.join(SCRIPTS, "subnormal_linear.py")).read()
    script.write_text(source.replace("import torch\n", "import torch\ntorch.set_flush_denormal(True)\n", 1))
    try:
        _, doc = _profile(tmp_path, str(script))
    finally:   # the script's flush reached every thread (already_flushed): off again in all of them
        subnormals.set_flush(False)
    [net] = doc["callables"]
    found = net["subnormals"]
    # counted on the bits (a flushing thread compares subnormals as 0), not timed, not flagged
    assert found["census"]["subnormal"] == 256 * 512 and found["already_flushed"] and found["cost"] is None
    assert found["not_measured"] == "this thread already flushes subnormals (torch.set_flush_denormal(True))"
    assert [f for f in doc["flags"] if f["kind"] == "subnormals"] == []
    big = torch.full((1 << 20,), 1e-39)
    assert (big * 1).count_nonzero() == big.numel()      # no thread left flushing


def test_profile_without_subnormals_measures_nothing_more(tmp_path):
    _, doc = _profile(tmp_path, os.path.join(SCRIPTS, "small_add.py"))
    for c in doc["callables"]:
        assert c["subnormals"]["census"]["subnormal"] == 0 and c["subnormals"]["cost"] is None
