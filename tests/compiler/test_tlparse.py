"""TORCH_TRACE + tlparse: a tdbg compile lands in PyTorch's structured trace under the names
tlparse knows (post-grad graph, output code, provenance node mappings) plus tdbg's loop IR,
line-level provenance and stage times, and tlparse 0.4.3 lists them in its index."""
import html
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tdbg.compiler import STAGES

TLPARSE = shutil.which("tlparse")
pytestmark = pytest.mark.skipif(TLPARSE is None, reason="the tlparse binary is not installed (pip install tlparse)")

SCRIPT = """
import torch
from tdbg.compiler import make_backend
from tdbg.compiler.config import current

def f(x, y):
    return torch.relu(x).sum(dim=1) + y

def g(x):
    return torch.neg(x) * 2

print(tuple(torch.compile(f, backend="tdbg")(torch.randn(4, 8), torch.randn(4)).shape))
broken = make_backend(current().replace(inject_bug=("neg", "compile_error")))
try:
    torch.compile(g, backend=broken)(torch.randn(3))
except Exception as e:
    print(type(e).__name__)

def h(x):
    return torch.sigmoid(x) + 1

per_signature = make_backend(current().replace(dynamic="specialize"))
print(tuple(torch.compile(h, backend=per_signature, dynamic=True)(torch.randn(5)).shape))

def k(x):
    return torch.cos(x) * 3

print(tuple(torch.compile(k, backend="tdbg", dynamic=True)(torch.randn(6)).shape))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory):
    """(tlparse output dir, index.html text) for one traced tdbg run of SCRIPT."""
    root = tmp_path_factory.mktemp("tlparse")
    (root / "script.py").write_text(SCRIPT)
    env = dict(os.environ, TORCH_TRACE=str(root / "trace"))
    proc = subprocess.run([sys.executable, "script.py"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["(4,)", "BackendCompilerFailed", "(5,)", "(6,)"]
    (log,) = os.listdir(root / "trace")
    out = root / "out"
    # --strict: every line of the trace must be one tlparse recognizes
    proc = subprocess.run([TLPARSE, str(root / "trace" / log), "-o", str(out), "--overwrite", "--no-browser",
                           "--strict", "-i"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, (out / "index.html").read_text()


def artifact(parsed, name, compile_dir="-_0_0_0"):
    """The one file of a compile (f's: 0/0, g's: 1/0, h's: 2/0) named `<name>_<n>.<ext>` that the index links to."""
    out, index = parsed
    links = re.findall(rf'href="({compile_dir}/{re.escape(name)}_\d+\.(?:html|json|txt))"', index)
    assert len(links) == 1, (name, links)
    return out / links[0]


def test_index_lists_tdbg_output_code(parsed):
    code = artifact(parsed, "inductor_output_code_tdbg_f__0_inference_0").read_text()
    assert "cpp_fused_add_relu_sum_0" in code and "tdbg output code for graph f__0_inference_0" in code


def test_index_lists_the_graph_and_provenance(parsed):
    graph = artifact(parsed, "inductor_post_grad_graph").read_text()
    assert re.search(r'relu: "f32\[4, 8\]" = torch\.ops\.aten\.relu\.default\(arg0_1\)', graph)
    mappings = json.loads(artifact(parsed, "inductor_provenance_tracking_node_mappings").read_text())
    assert mappings == {"preToPost": {}, "postToPre": {}, "version": 2.0,
                        "cppCodeToPost": {"cpp_fused_add_relu_sum_0": ["relu", "sum_1", "add"]},
                        "postToCppCode": {n: ["cpp_fused_add_relu_sum_0"] for n in ("relu", "sum_1", "add")}}
    prov = json.loads(artifact(parsed, "tdbg_provenance").read_text())
    assert (prov["fx"], prov["ir"], prov["cpp"]) == ("inductor_post_grad_graph", "tdbg_loop_ir", "tdbg_kernels_cpp")
    ir = artifact(parsed, "tdbg_loop_ir").read_text().splitlines()
    assert all(ir[n - 1].rstrip().endswith("# relu") for n in prov["nodes"]["relu"]["ir_lines"])
    cpp = artifact(parsed, "tdbg_kernels_cpp").read_text().splitlines()
    assert cpp[prov["nodes"]["relu"]["cpp_lines"][0] - 1].strip().startswith("// FX: relu = ")


def test_stage_times_in_index_and_chrome_trace(parsed):
    out, _ = parsed
    times = json.loads(artifact(parsed, "tdbg_compile_stage_times").read_text())
    assert (times["graph"], times["kind"], times["failed_stage"]) == ("f__0_inference_0", "inference", None)
    assert sorted(times["seconds"]) == sorted(name for name, _ in STAGES)   # tlparse re-sorts JSON keys
    assert all(s >= 0 for s in times["seconds"].values())
    events = {e["name"] for e in json.loads((out / "chromium_events.json").read_text())}
    assert {f"tdbg.{name}" for name, _ in STAGES} <= events


def test_provenance_view_links_graph_lines_to_output_code(parsed):
    out, _ = parsed
    page = (out / "provenance_tracking_-_0_0_0.html").read_text()
    mappings = json.loads(re.search(r'<script id="lineMappings" type="application/json">(.*?)</script>', page,
                                    re.S).group(1))
    graph = artifact(parsed, "inductor_post_grad_graph").read_text().splitlines()
    relu_line = next(i for i, line in enumerate(graph, 1) if line.strip().startswith("relu:"))
    assert mappings["postToPyCode"][str(relu_line)], mappings   # the kernel's lines in the output code


def test_a_compile_that_fails_still_lists_its_output_code(parsed):
    code = artifact(parsed, "inductor_output_code_tdbg_g__1_inference_0", "-_1_0_0").read_text()
    assert "tdbg_injected_compile_error_neg" in code
    times = json.loads(artifact(parsed, "tdbg_compile_stage_times", "-_1_0_0").read_text())
    assert (times["graph"], times["failed_stage"]) == ("g__1_inference_0", "build")


def test_a_symbolic_compile_is_listed_under_its_dynamo_compile(parsed):
    # k has symbolic shapes: compiled once, at Dynamo's compile 3/0, its kernel taking the size
    page = artifact(parsed, "inductor_output_code_tdbg_k__3_inference_0", "-_3_0_0").read_text()
    code = html.unescape(re.sub(r"<[^>]+>", "", page))   # the page highlights the code
    assert re.search(r"int cpp_fused_cos_mul_0\(const float\* in_ptr0, float\* out_ptr0, int64_t ks0\)", code)


def test_a_call_time_compile_is_listed_under_its_dynamo_compile(parsed):
    # h has symbolic shapes and dynamic="specialize": tdbg compiles it per signature when it is first called, after
    # Dynamo's compile 2/0 ended; its files still belong to 2/0
    code = artifact(parsed, "inductor_output_code_tdbg_h__2_inference_0_s0", "-_2_0_0").read_text()
    assert "cpp_fused_add_sigmoid_0" in code
