"""`tdbg explain --break-at` inside a compiled graph: pdb stops in tdbg's output_code.py (and
Inductor's generated module) at the stop op, right before the kernel computing the user's line,
with the output code listed by `l` (it was refused: "compiled backends run native kernels")."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = "tests/scenarios/scripts/code_graph_break.py"


def _explain(backend: str, stdin: str) -> tuple:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TDBG_") or k == "TDBG_CACHE_DIR"}
    proc = subprocess.run([sys.executable, "-m", "tdbg.cli.main", "explain", SCRIPT, "--backend", backend,
                           "--break-at", "7"], cwd=ROOT, env=dict(env, COLUMNS="200"), input=stdin,
                          capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.slow
def test_break_at_stops_in_tdbgs_output_code_before_the_lines_kernel():
    code, out = _explain("inductor", "l\np buf0.shape\nc\nc\n")
    assert code == 0, out
    # both calls of f stop, in graph 0's output code, at the op reading x (buf0: the stop op's result)
    assert out.count("tdbg: stopped in graph code <tdbg output code f__0_inference_0> at the first op of "
                     "code_graph_break.py:7 `y = x.sin() * 2`; `buf0` is the tensor that op reads") == 2
    assert "buf0 = torch.ops.tdbg.stop_at.default(arg0_1, 'code_graph_break.py:7 `y = x.sin() * 2`')" in out
    assert "_k_cpp_fused_mul_sin_0(buf0.data_ptr(), buf1.data_ptr())" in out    # `l` lists the output code
    assert "(Pdb) torch.Size([4, 8])" in out


@pytest.mark.slow
def test_break_at_stops_in_inductors_generated_module():
    code, out = _explain("torch:inductor", "p buf0.sum()\nc\nc\n")
    assert code == 0, out
    assert out.count("at the first op of code_graph_break.py:7 `y = x.sin() * 2`; `buf0` is the tensor") == 2
    assert "(Pdb) tensor(32.)" in out     # x is ones(4, 8)
