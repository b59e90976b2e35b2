"""`tdbg run --check-determinism` beyond a graph's first call: a graph compiled for dynamic sizes
whose reduction turns parallel (nondeterministic) only above a grain size is caught at the call
with the new input shape (it was OK: only call 1 was checked), and the OK line says at which calls
it checked."""
import json
import os

import pytest
from click.testing import CliRunner

from tdbg.cli.console import exit_code
from tdbg.cli.main import cli
from tdbg.cli.determinism_view import ok_text

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
SCRIPT = os.path.join(HERE, "determinism_grain.py")
BACKENDS = os.path.join(HERE, "determinism_backends.py")


def test_a_later_call_with_new_shapes_is_checked_and_named(tmp_path):
    out = tmp_path / "run.json"
    r = CliRunner().invoke(cli, ["run", SCRIPT, "--backend", f"{BACKENDS}:grain_sum", "--check-determinism",
                                 "--no-check-accuracy", "--json", str(out)])
    assert r.exit_code == exit_code("nondeterministic") == 24, r.output
    v = json.loads(out.read_text())["verdict"]
    [g] = v["graphs"]
    assert g["determinism_calls"] == [1, 2]
    d = g["determinism"]
    assert (v["error"]["graph"], v["error"]["call"], d["call"], d["verdict"]) == (0, 2, 2, "backend")
    assert [x["path"] for x in d["compiled"]] == ["out[0]"] and d["compiled"][0]["elements"] == 1
    assert d["first_node"]["source"].endswith("determinism_grain.py:9 in f: return h.sum()")


def test_the_ok_line_says_which_calls_were_checked():
    verdict = {"check_determinism": True, "graphs": [
        {"index": 0, "determinism_calls": [1, 3], "determinism": {"verdict": "deterministic", "grads_checked": True}},
        {"index": 1, "determinism": {"verdict": "deterministic"}}]}
    assert ok_text(verdict) == ("; determinism checked on 2 of 2 graph(s) at 3 call(s) (each graph's first call "
                                "and each call with new input shapes): the same bits on two compiled runs "
                                "(gradients on 1)")


BACKWARD = os.path.join(HERE, "determinism_backward.py")


def test_only_gradients_differ_names_the_backward_graphs_node(tmp_path):
    out = tmp_path / "run.json"
    r = CliRunner().invoke(cli, ["run", BACKWARD, "--backend", f"{BACKENDS}:aot_mm_backward", "--check-determinism",
                                 "--no-check-accuracy", "--json", str(out)])
    assert r.exit_code == exit_code("nondeterministic"), r.output
    v = json.loads(out.read_text())["verdict"]
    err, d = v["error"], v["graphs"][0]["determinism"]
    assert [x["path"] for x in d["compiled"]] == ["grad of w"]
    # the backward's mm computing w's gradient: x.t() @ grad (the only mm: x needs no gradient)
    assert (d["first_node"]["op"], d["first_node"]["level"]) == ("aten.mm", "aten backward")
    assert (err["part"], err["during"]) == ("backward", "backward")
    assert err["fx_node"] == f"{d['first_node']['node']} (aten.mm in the backward aten graph)"
    assert d["first_node"]["source"].endswith("determinism_backward.py:8 in f: return torch.tanh(x @ w).sum()")
    assert not any("located" in n for n in d["notes"])
    assert "backward, while running (call 1)" in r.output


# -- inputs copied as they are; a real nondeterministic Inductor kernel -------------------------------
EMBEDDINGS = os.path.join(HERE, "embeddings_inductor.py")


def test_the_checks_copy_inputs_with_their_strides():
    import torch

    from tdbg.minifier.diagnose.checks import _clones
    for t in (torch.arange(32).expand(4, 32), torch.randn(8, 6)[:, ::2], torch.randn(3, 4).t(),
              torch.randn(5, 7)[1:3], torch.randn(2, 3, 4).permute(2, 0, 1), torch.tensor(3.0)):
        [c] = _clones([t])
        assert (c.shape, c.stride()) == (t.shape, t.stride()) and torch.equal(c, t)
        assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()


@pytest.mark.slow
def test_an_expanded_input_is_no_backend_failure(tmp_path):
    """The accuracy check (on by default) ran torch:inductor's graph on contiguous copies of an
    expanded input: Inductor's stride assert failed, reported as FAILED at stage backend (exit 19)."""
    r = CliRunner().invoke(cli, ["run", EMBEDDINGS, "--backend", "torch:inductor"])
    assert r.exit_code == 0, r.output


@pytest.mark.slow
@pytest.mark.skipif(__import__("torch").get_num_threads() < 2, reason="one thread adds in one order")
def test_inductors_atomic_add_embedding_backward_is_named_by_its_kernel(tmp_path):
    """A race: two runs may add in the same order (about one check in three here saw the same bits),
    so up to 4 checks; the first that sees it must name the node and kernel."""
    out = tmp_path / "run.json"
    for _ in range(4):
        r = CliRunner().invoke(cli, ["run", EMBEDDINGS, "--backend", "torch:inductor", "--check-determinism",
                                     "--no-check-accuracy", "--json", str(out)])
        if r.exit_code != 0:
            break
    assert r.exit_code == exit_code("nondeterministic"), r.output
    v = json.loads(out.read_text())["verdict"]
    node = v["graphs"][0]["determinism"]["first_node"]
    assert (node["op"], node["level"]) == ("aten._unsafe_masked_index_put_accumulate", "aten backward")
    assert node["kernel"].startswith("cpp_fused_") and "embedding_dense_backward" in node["kernel"]
    assert node["source"].endswith("embeddings_inductor.py:21 in f: h = norm(word(ids) + tt(types) + pos(positions))")
    assert v["error"]["kernel"] == node["kernel"]
