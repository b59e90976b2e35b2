"""`tdbg memory`: measured eager vs compiled peaks on graphs whose answer is known.

Bounds: PyTorch's CPU allocator reports each tensor's exact byte size; besides the tensors named
in each script a call allocates only a few scalars (at most SMALL bytes in all), so every
expected figure is exact up to SMALL.
"""
import json
import os

import pytest
from click.testing import CliRunner

from tdbg.cli.console import exit_code
from tdbg.cli.main import cli
from tdbg.minifier.diagnose.memory import CallMemory, MemoryReport, GraphMemory, Trace, track

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scenarios", "scripts")
MB4 = 4 << 20        # one float32 tensor of 2**20 elements
SMALL = 64


def _memory(tmp_path, script, *options):
    out = tmp_path / "memory.json"
    result = CliRunner().invoke(cli, ["memory", os.path.join(SCRIPTS, script), "--json", str(out), *options])
    return result, json.loads(out.read_text()) if out.exists() else None


def _calls(doc):
    return [c for g in doc["graphs"] for c in g["calls"]]


# ---------------------------------------------------------------- the measurement itself

def test_trace_curve_peak_end_and_samples():
    t = Trace([(0, 100, 1), (10, 50, 2), (20, -100, 1), (30, 30, 3)], duration_ns=40)
    assert t.curve() == [100, 150, 50, 80]
    assert (t.peak, t.end, t.live_at_end()) == (150, 80, {2: 50, 3: 30})
    samples = t.sampled(5)
    assert len(samples) == 5 and max(samples) == 150 and samples[-1] == 80


def test_track_counts_the_calls_own_allocations_exactly():
    import torch
    older = torch.empty(1 << 20)

    def body():
        nonlocal older
        a = torch.empty(1 << 20)
        b = torch.empty(1 << 20)
        del a
        older = None      # freeing memory allocated before the call is not this call's
        return b
    result, trace = track(body)
    assert (trace.peak, trace.end) == (2 * MB4, MB4)
    assert list(trace.live_at_end().values()) == [MB4]
    assert result.untyped_storage().data_ptr() in trace.live_at_end()


def test_over_ratio_judges_only_measured_calls_above_the_floor():
    def call(eager, compiled):
        return CallMemory(0, "forward", 1, eager, compiled, eager, compiled, 0, 0)
    report = MemoryReport("s.py", "b", "m", 3, [GraphMemory(0, "f", None, calls=[
        call(1000, 3000), call(10000, 30000), call(None, 30000), call(10000, 15000)])])
    assert [(c.eager_peak_bytes, c.compiled_peak_bytes) for c in report.over_ratio(1.5)] == [(10000, 30000)]
    assert report.over_ratio(3.0) == []


# ---------------------------------------------------------------- known answers, end to end

def test_a_backend_holding_an_extra_copy_peaks_one_input_higher(tmp_path):
    backend = os.path.join(SCRIPTS, "memory_copy_backend.py") + ":copying"
    result, doc = _memory(tmp_path, "memory_copy_backend.py", "--backend", backend, "--max-memory-ratio", "1.5")
    assert result.exit_code == exit_code("threshold"), result.output
    [c] = _calls(doc)
    assert (c["graph"], c["kind"], c["call"]) == (0, "inference", 1)
    # eager: x * 2's output; compiled: that plus the backend's copy of x
    assert MB4 <= c["eager_peak_bytes"] <= MB4 + SMALL
    assert c["compiled_peak_bytes"] - c["eager_peak_bytes"] == MB4
    assert c["compiled_end_bytes"] == c["compiled_output_bytes"] == MB4
    # the backend's copy is no graph node: the allocating op names it
    big = [(b["name"], b["op"]) for b in c["compiled_peak_buffers"] if b["bytes"] == MB4]
    assert sorted(big, key=lambda b: b[1]) == [(None, "aten::clone"), ("mul", "aten::mul")]
    assert doc["over_ratio"] == [{"graph": 0, "kind": "inference", "call": 1, "ratio": c["ratio"]}]
    assert doc["exit_code"] == exit_code("threshold") and doc["max_memory_ratio"] == 1.5
    assert "OVER --max-memory-ratio 1.5: 1 call(s)" in result.output


def test_tdbg_fuses_a_pointwise_chain_that_eager_materializes(tmp_path):
    result, doc = _memory(tmp_path, "memory_chain.py", "--backend", "inductor", "--max-memory-ratio", "0.6")
    assert result.exit_code == 0, result.output
    first, second = _calls(doc)
    # eager: one op's input and output alive together (2 x 4 MB); tdbg: one fused kernel, its output
    assert 2 * MB4 <= first["eager_peak_bytes"] <= 2 * MB4 + SMALL
    assert MB4 <= first["compiled_peak_bytes"] <= MB4 + SMALL
    # the script drops each result: tdbg's output pool hands call 1's storage to call 2
    assert second["compiled_peak_bytes"] <= SMALL and second["compiled_reused_bytes"] == MB4
    assert any("reuses storage kept from earlier calls" in n for n in doc["notes"])
    # at eager's peak: `x * 2` and `+ 1`, each with its line; at tdbg's: the fused kernel's one buffer
    script = os.path.join(SCRIPTS, "memory_chain.py")
    assert [(b["name"], b["op"], b["bytes"], b["source"]) for b in first["eager_peak_buffers"][:2]] == [
        ("y", "aten::mul", MB4, f"{script}:13 in chain: y = x * 2"),
        ("y_1", "aten::add", MB4, f"{script}:14 in chain: y = y + 1")]
    [buf] = [b for b in first["compiled_peak_buffers"] if b["bytes"] >= 1024]
    assert (buf["name"], buf["bytes"]) == ("buf0", MB4)
    assert {"mul", "add", "sin", "mul_1", "sub"} == set(buf["made_by"])
    assert buf["source"].startswith(f"{script}:1")   # one of the chain's lines (13-17)
    assert "within --max-memory-ratio 0.6" in result.output


HIDDEN = 512 * 512 * 4   # memory_train.py: the first Linear's and the GELU's outputs, saved by both


def _training(tmp_path, backend):
    """memory_train.py's one call under `backend`: (document, forward call, backward call), with
    what every backend must agree on checked: both parts measured, the same bytes saved for backward."""
    result, doc = _memory(tmp_path, "memory_train.py", "--backend", backend, "--calls", "1")
    assert result.exit_code == 0, result.output
    forward, backward = _calls(doc)
    assert (forward["kind"], backward["kind"]) == ("forward", "backward")
    assert forward["eager_saved_bytes"] == forward["compiled_saved_bytes"] == 2 * HIDDEN
    return doc, forward, backward


def test_a_decomposed_gelu_materializes_what_eager_runs_as_one_op(tmp_path):
    doc, forward, backward = _training(tmp_path, "aot_eager")
    # AOTAutograd's GELU decomposition (x * 0.5, erf(x * 0.7071), ...) runs op by op: at least one
    # more hidden-sized intermediate alive at the compiled peak than at eager's (one aten::gelu)
    assert forward["compiled_peak_bytes"] - forward["eager_peak_bytes"] >= HIDDEN
    # the backward: the same aten graph run by eager and by aot_eager (which runs it as is)
    assert backward["compiled_peak_bytes"] == backward["eager_peak_bytes"]


def test_torch_aot_eager_has_its_backward_graph_measured(tmp_path):
    """torch's own aot_eager (a function, no AotAutograd object) was taken for a backend without an
    AOT stage: its backward went unmeasured and a note said it was PyTorch eager autograd."""
    doc, forward, backward = _training(tmp_path, "torch:aot_eager")
    assert doc["graphs"][0]["has_backward_graph"] is True and not doc["notes"]
    # the same aten graph, run by eager op by op and by aot_eager's boxed_nop
    assert backward["compiled_peak_bytes"] == backward["eager_peak_bytes"]


@pytest.mark.slow
def test_training_measures_forward_saved_bytes_and_the_backward_graph(tmp_path):
    doc, forward, backward = _training(tmp_path, "inductor")
    assert forward["compiled_output_bytes"] == 512 * 256 * 4
    # eager runs the backward aten graph op by op; tdbg fuses GELU's backward
    assert backward["compiled_peak_bytes"] < backward["eager_peak_bytes"]
    assert doc["graphs"][0]["has_backward_graph"] is True


def test_a_script_without_torch_compile_is_bad_input(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("print('no compile')\n")
    result = CliRunner().invoke(cli, ["memory", str(script), "--backend", "eager"])
    assert result.exit_code == exit_code("bad_input")
    assert "never calls torch.compile" in result.output


def test_the_html_section_draws_both_curves():
    from tdbg.minifier.artifacts.report.sections import memory_section
    call = CallMemory(0, "forward", 1, 2048, 4096, 0, 0, 0, 0, eager_curve=[0, 2048, 0], compiled_curve=[0, 4096, 0])
    doc = dict(MemoryReport("s.py", "b", "measured", 1, [GraphMemory(0, "f", None, calls=[call])]).to_dict(),
               schema="tdbg.memory")
    html = memory_section({"document": doc})
    assert 'id="memory-0-forward-1"' in html
    assert 'data-series="compiled"' in html and 'data-series="eager"' in html


# ---------------------------------------------------------------- naming buffers of compiled code

# the call() of the module Inductor generated for memory_linear_gelu.py's forward (torch 2.13),
# trimmed: an extern addmm under Inductor's `Source Nodes` comment, a renamed buffer, one C++ kernel
INDUCTOR_CALL = """
    def call(self, args):
        primals_1, primals_2, primals_3 = args
        args.clear()
        buf0 = empty_strided_cpu((1024, 256), (256, 1), torch.float32)
        # Topologically Sorted Source Nodes: [y], Original ATen: [aten.t, aten.addmm]
        extern_kernels.addmm(primals_2, primals_3, reinterpret_tensor(primals_1, (256, 256), (1, 256), 0), alpha=1, beta=1, out=buf0)
        del primals_2
        buf2 = empty_strided_cpu((), (), torch.float32)
        buf1 = empty_strided_cpu((1024, ), (1, ), torch.float32)
        buf3 = buf1; del buf1  # reuse
        cpp_fused_add_gelu_mean_mul_sum_0(buf3, buf0, buf2)
        return (buf3, primals_1, primals_3, buf0, )
"""


def test_inductor_buffers_are_named_by_their_kernels_origins_and_source_comments():
    from types import SimpleNamespace

    from tdbg.minifier.diagnose.memory_buffers import Namer
    trace = 'File "/u/model.py", line 12, in f\n    z = torch.nn.functional.gelu(y) * 2\n'
    kernels = {"cpp_fused_add_gelu_mean_mul_sum_0": [("mul", trace), ("erf", trace), ("sum_1", "")]}
    namer = Namer(compiled_graph=SimpleNamespace(source_code=INDUCTOR_CALL), kernels=kernels)
    # an extern kernel: the FX nodes of Inductor's comment above it
    assert namer.describe("buf0") == {"made_by": ["y"], "source": None}
    # a C++ kernel's buffer, also through `buf3 = buf1; del buf1  # reuse`: the kernel's origins
    for buf in ("buf1", "buf2"):
        assert namer.describe(buf) == {"made_by": ["mul", "erf", "sum_1"],
                                       "source": "/u/model.py:12 in f: z = torch.nn.functional.gelu(y) * 2"}


def test_a_view_bound_after_its_base_is_not_taken_for_a_new_allocation():
    """FX code binds `view = h.view(...);  h = None` on one line: the storage is still h's; the
    next allocation at that pointer must not be named `view` (it was, shifting every name after)."""
    import torch

    from tdbg.minifier.diagnose.memory_buffers import LocalNames

    class M(torch.nn.Module):
        def forward(self, x):
            h = x * 2
            v = h.view(4, 4, 4).transpose(1, 2)
            return torch.softmax(v, -1)
    gm = torch.fx.symbolic_trace(M())
    with LocalNames() as names:
        gm(torch.randn(8, 8))
    assert sorted(n for ns in names.first.values() for n, _ in ns) == ["mul", "softmax", "x"]


def test_a_temporary_of_another_size_at_a_reused_pointer_does_not_shift_names():
    """The n-th allocation at a pointer took the n-th name bound there: an allocation never bound
    to a local (an op's temporary) in between shifted every later name (BERT's eager buffers were
    named after the wrong nodes). Names are matched by size too."""
    from tdbg.minifier.diagnose.memory_buffers import Namer, peak_buffers
    # pointer 1 holds in turn: a 64-byte temporary (never bound), a, b (alive at the peak, with
    # 256 bytes at pointer 2), then c
    events = [(0, 64, 1), (1, -64, 1), (2, 128, 1), (3, -128, 1), (4, 128, 1), (5, 256, 2), (6, -256, 2),
              (7, -128, 1), (8, 128, 1)]
    trace = Trace(events, duration_ns=9, ops=["aten::t"] * 2 + ["aten::mm"] * 7)
    names = {1: [("a", 128), ("b", 128), ("c", 128)], 2: [("d", 256)]}
    assert [(r["name"], r["bytes"]) for r in peak_buffers(trace, names, Namer())] == [("d", 256), ("b", 128)]


@pytest.mark.slow
def test_torch_inductor_buffers_at_the_peak_name_their_fx_nodes_and_lines(tmp_path):
    result = CliRunner().invoke(cli, ["memory", os.path.join(os.path.dirname(__file__), "scripts", "memory_linear_gelu.py"),
                                      "--backend", "torch:inductor", "--calls", "1",
                                      "--json", str(tmp_path / "m.json")])
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "m.json").read_text())
    forward, backward = _calls(doc)
    script = os.path.join(os.path.dirname(__file__), "scripts", "memory_linear_gelu.py")
    # eager: y, gelu(y) and its * 2 (1 MiB each) alive together; Inductor: y (saved) and tiny sums
    assert 3 << 20 <= forward["eager_peak_bytes"] <= (3 << 20) + 8192
    assert 1 << 20 <= forward["compiled_peak_bytes"] <= (1 << 20) + 8192
    big = forward["compiled_peak_buffers"][0]
    assert (big["bytes"], big["made_by"], big["source"]) == (1 << 20, ["y"], f"{script}:10 in f: y = lin(x)")
    fused = [b for b in forward["compiled_peak_buffers"] if "erf" in b["made_by"]]
    assert fused and fused[0]["source"] == f"{script}:11 in f: z = torch.nn.functional.gelu(y) * 2"
    # the backward's buffers too: every one named by its FX nodes
    assert backward["compiled_peak_buffers"] and all(b["made_by"] for b in backward["compiled_peak_buffers"])
