"""compiler/build.py: the on-disk kernel cache, parallel g++, atomic writes, compile errors."""
import ctypes
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from tdbg.compiler import build
from tdbg.compiler.config import Config
from tdbg.compiler.errors import CppCompileError


def kernel_source(name: str, body: str = "return x * 3 + 1;") -> str:
    return f'extern "C" long {name}(long x) {{ {body} }}\n'


def call(lib_path: str, symbol: str, x: int) -> int:
    fn = build.load_kernel(lib_path, symbol)
    fn.argtypes, fn.restype = [ctypes.c_long], ctypes.c_long
    return fn(x)


@pytest.fixture
def logging_cxx(tmp_path):
    """A g++ wrapper that records each compile's start/end time and pauses 0.4 s before compiling."""
    log = tmp_path / "cxx.log"
    script = tmp_path / "logging-g++"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in *--version*) exec g++ "$@";; esac
        echo "start $(date +%s.%N)" >> {log}
        sleep 0.4
        g++ "$@"; rc=$?
        echo "end $(date +%s.%N)" >> {log}
        exit $rc
        """))
    script.chmod(0o755)
    return str(script), log


def compiles(log) -> list:
    return log.read_text().split("\n")[:-1] if log.exists() else []


def test_warm_hit_returns_same_path_without_running_the_compiler(tmp_path, logging_cxx):
    cxx, log = logging_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx)
    first = build.build_kernels({"k": kernel_source("k")}, cfg)
    assert len(compiles(log)) == 2  # one start, one end
    second = build.build_kernels({"k": kernel_source("k")}, cfg)
    assert second == first and len(compiles(log)) == 2
    assert call(first["k"], "k", 4) == 13


def test_changed_flags_change_the_key_and_rebuild(tmp_path, logging_cxx):
    cxx, log = logging_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx)
    o2 = cfg.replace(cxx_flags=tuple(f if f != "-O3" else "-O2" for f in cfg.cxx_flags))
    src = kernel_source("k")
    assert build.cache_key(src, cfg) != build.cache_key(src, o2)
    assert build.cache_key(src, cfg) != build.cache_key(kernel_source("k", "return x;"), cfg)
    assert build.cache_key(src, cfg) == build.cache_key(src, cfg.replace(debug=True))
    a = build.build_kernels({"k": src}, cfg)["k"]
    b = build.build_kernels({"k": src}, o2)["k"]
    assert a != b and len(compiles(log)) == 4
    assert "-O2" in build.build_command(src, o2) and "-O2" not in build.build_command(src, cfg)


def test_cache_directories_are_private(tmp_path):
    cache = tmp_path / "deep" / "cache"
    lib = build.build_kernels({"k": kernel_source("k")}, Config(cache_dir=str(cache)))["k"]
    private = [os.path.join(root, d) for root, dirs, _ in os.walk(cache) for d in dirs]
    assert os.path.dirname(lib) in private and len(private) >= 3  # <key[:2]>/, include/, include/<hash>/
    for d in [cache, *private]:
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d


def test_kernels_of_one_call_compile_in_parallel(tmp_path, logging_cxx):
    cxx, log = logging_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx)
    libs = build.build_kernels({"a": kernel_source("a"), "b": kernel_source("b", "return -x;")}, cfg)
    events = [line.split() for line in compiles(log)]
    kinds = [kind for kind, _ in sorted(events, key=lambda e: float(e[1]))]
    assert kinds == ["start", "start", "end", "end"]  # both g++ were running at once
    assert (call(libs["a"], "a", 2), call(libs["b"], "b", 2)) == (7, -2)


def test_warm_hits_cost_well_under_a_millisecond(tmp_path):
    cfg = Config(cache_dir=str(tmp_path / "cache"))
    sources = {f"k{i}": kernel_source(f"k{i}", f"return x + {i};") for i in range(16)}
    build.build_kernels(sources, cfg)
    best = min(_timed(build.build_kernels, sources, cfg) for _ in range(5))
    assert best / len(sources) < 0.5e-3, f"{best / len(sources) * 1e3:.3f} ms per kernel"


def _timed(fn, *args):
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


_CONCURRENT = """
import ctypes, sys
from tdbg.compiler import build, config
cfg = config.current().replace(cxx=sys.argv[1])
lib = build.build_kernels({"k": 'extern "C" long k(long x) { return x * 7; }'}, cfg)["k"]
fn = build.load_kernel(lib, "k"); fn.argtypes, fn.restype = [ctypes.c_long], ctypes.c_long
print(lib, fn(6))
"""


def test_two_processes_building_the_same_source_both_load_it(tmp_path, logging_cxx):
    """Also: the cache directory comes from TDBG_CACHE_DIR (through config.from_env)."""
    cxx, log = logging_cxx
    cache = str(tmp_path / "from-env")
    env = dict(os.environ, TDBG_CACHE_DIR=cache)
    env.pop("TDBG_CONFIG", None)
    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT, cxx], stdout=subprocess.PIPE, env=env,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    (lib_a, val_a), (lib_b, val_b) = (out.split() for out, _ in outs)
    assert lib_a == lib_b and val_a == val_b == "42"
    assert lib_a.startswith(cache + os.sep)
    leftovers = [f for _, _, files in os.walk(cache) for f in files if f.endswith(".tmp")]
    assert leftovers == []  # each compile replaced its own temporary atomically


def test_compile_error_carries_command_first_errors_and_kept_source(tmp_path):
    cfg = Config(cache_dir=str(tmp_path / "cache"))
    bad = kernel_source("bad", "return x +* ;") + "int also_bad = undefined_name;\n"
    with pytest.raises(CppCompileError) as info:
        build.build_kernels({"good": kernel_source("good"), "bad": bad}, cfg)
    err = info.value
    assert err.kernels == ("bad",)
    assert err.command[0] == "g++" and err.source_path in err.command
    assert err.command == build.build_command(bad, cfg, "bad")
    assert os.path.basename(err.source_path).startswith("bad-")
    with open(err.source_path) as f:
        assert f.read() == bad
    first = next(line for line in err.stderr.splitlines() if "error:" in line)
    assert first.startswith(err.source_path + ":1:") and "expected primary-expression" in first
    assert "undefined_name" in err.stderr
    evidence = err.evidence()
    assert evidence["stage"] == "cpp_build" and evidence["kernel"] == "bad"
    assert not os.path.exists(build.cached_paths(bad, cfg, name="bad")[1])


def test_prelude_header_resolves_from_the_package(tmp_path):
    cfg = Config(cache_dir=str(tmp_path / "cache"))
    src = '#include "tdbg_prelude.h"\n' + kernel_source("k")
    lib = build.build_kernels({"k": src}, cfg)["k"]
    assert call(lib, "k", 1) == 4
    copied = os.path.join(build.include_dir(cfg.cache_dir), build.PRELUDE_NAME)
    with open(copied, "rb") as a, open(os.path.join(os.path.dirname(build.__file__), "cpp_prelude.h"), "rb") as b:
        assert a.read() == b.read()


def test_library_handles_are_opened_once_per_path(tmp_path):
    lib = build.build_kernels({"k": kernel_source("k")}, Config(cache_dir=str(tmp_path / "c")))["k"]
    assert build.load_library(lib) is build.load_library(lib)
    assert build.load_kernel(lib, "k") is not build.load_kernel(lib, "k")  # independent argtypes


def test_missing_compiler_is_a_compile_error(tmp_path):
    cfg = Config(cache_dir=str(tmp_path / "c"), cxx=str(tmp_path / "no-such-g++"))
    with pytest.raises(CppCompileError) as info:
        build.build_kernels({"k": kernel_source("k")}, cfg)
    assert info.value.command[0] == cfg.cxx and "No such file or directory" in info.value.stderr


def test_cache_removed_mid_process_is_rebuilt(tmp_path):
    import shutil
    cfg = Config(cache_dir=str(tmp_path / "c"))
    src = '#include "tdbg_prelude.h"\n' + kernel_source("k")
    first = build.build_kernels({"k": src}, cfg)["k"]
    shutil.rmtree(cfg.cache_dir)
    assert build.build_kernels({"k": src}, cfg)["k"] == first and os.path.exists(first)
