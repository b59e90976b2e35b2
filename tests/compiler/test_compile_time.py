"""What keeps tdbg's compile cheap, pinned by behaviour (timings themselves are benchmarks' job):
no one-off imports inside a graph's compile, no fake-tensor dispatch in the stages, the
precompiled prelude started early, and a warm cache that never runs the compiler."""
import json
import os
import subprocess
import sys
import textwrap

import torch

import tdbg.compiler as tc
from tdbg.compiler import build
from tdbg.compiler.config import Config

_FRESH_PROCESS = textwrap.dedent("""
    import json, sys, torch
    from tdbg.compiler import config
    before = {m: m in sys.modules for m in ("sympy.tensor.tensor", "torch._inductor.debug")}
    import tdbg.compiler.ir
    with torch.no_grad():
        out = torch.compile(lambda x: (x + 1).relu(), backend="tdbg")(torch.arange(-2.0, 2.0))
    print(json.dumps({"before": before, "after_ir": "sympy.tensor.tensor" in sys.modules,
                      "inductor_debug": "torch._inductor.debug" in sys.modules, "out": out.tolist()}))
""")


def test_stages_run_without_the_fake_tensor_mode_aot_autograd_traces_in(monkeypatch):
    modes = []

    def probe(c):
        modes.append(torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE))
    monkeypatch.setattr(tc, "STAGES", [("probe", probe)] + list(tc.STAGES))
    seen_inputs = []

    def inner(gm, inputs, cfg, **kw):
        seen_inputs.extend(type(x).__name__ for x in inputs)
        return tc.compile_aten(gm, inputs, cfg, **kw)
    fn = torch.compile(lambda x: x * 2, backend=tc.make_backend(inner_compile=inner))
    with torch.no_grad():
        assert fn(torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    assert seen_inputs == ["FakeTensor"] and modes == [None]


def test_aot_flattens_nested_inputs_and_compiles_backward(tmp_path):
    cfg = Config(cache_dir=str(tmp_path / "cache"))
    fn = torch.compile(lambda xs: (xs[0] * xs[1]).sum(), backend=tc.make_backend(cfg))
    a, b = torch.tensor([1.0, 2.0], requires_grad=True), torch.tensor([3.0, 4.0])
    out = fn([a, b])
    out.backward()
    assert out.item() == 11.0 and a.grad.tolist() == [3.0, 4.0]


def test_prepare_builds_the_pch_once_in_the_background_for_the_build_to_use(tmp_path):
    log = tmp_path / "cxx.log"
    script = tmp_path / "counting-g++"
    script.write_text(f'#!/bin/sh\ncase "$*" in *--version*) ;; *) echo "$*" >> {log};; esac\nexec g++ "$@"\n')
    script.chmod(0o755)
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=str(script))
    build.prepare(cfg)
    build.prepare(cfg)
    src = f'#include "{build.PRELUDE_NAME}"\nextern "C" long k(long x) {{ return x + 1; }}\n'
    build.build_kernels({"k": src}, cfg)
    commands = log.read_text().splitlines()
    assert len(commands) == 2 and "c++-header" in commands[0] and "c++-header" not in commands[1]
    assert os.path.exists(os.path.join(cfg.cache_dir, "pch", build._toolchain_digest(cfg)[:20], build.PCH_NAME))


def test_fresh_process_imports_no_inductor_and_a_warm_cache_runs_no_compiler(tmp_path):
    log = tmp_path / "cxx.log"
    script = tmp_path / "counting-g++"
    script.write_text(f'#!/bin/sh\ncase "$*" in *--version*) ;; *) echo run >> {log};; esac\nexec g++ "$@"\n')
    script.chmod(0o755)
    env = dict(os.environ, TDBG_CACHE_DIR=str(tmp_path / "cache"), TDBG_CXX=str(script))
    env.pop("TDBG_CONFIG", None)
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        assert seen == {"before": {"sympy.tensor.tensor": False, "torch._inductor.debug": False},
                        "after_ir": True, "inductor_debug": False, "out": [0.0, 0.0, 1.0, 2.0]}
        runs.append(len(log.read_text().splitlines()))
    assert runs == [2, 2]   # the pch and the graph's unit, then nothing
