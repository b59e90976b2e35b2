"""compiler/build.py: the on-disk kernel cache, parallel g++, atomic writes, compile errors."""
import ctypes
import hashlib
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


def _wrapped_cxx(tmp_path, pause: float):
    """A g++ wrapper that records each compile's start/end time and pauses `pause` s before compiling."""
    log = tmp_path / "cxx.log"
    script = tmp_path / "logging-g++"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in *--version*) exec g++ "$@";; esac
        echo "start $(date +%s.%N)" >> {log}
        sleep {pause}
        g++ "$@"; rc=$?
        echo "end $(date +%s.%N)" >> {log}
        exit $rc
        """))
    script.chmod(0o755)
    return str(script), log


@pytest.fixture
def logging_cxx(tmp_path):
    """Pauses 0.4 s per compile, so that compiles that overlap in time show it."""
    return _wrapped_cxx(tmp_path, 0.4)


@pytest.fixture
def counting_cxx(tmp_path):
    return _wrapped_cxx(tmp_path, 0)


def compiles(log) -> list:
    return log.read_text().split("\n")[:-1] if log.exists() else []


def test_warm_hit_returns_same_path_without_running_the_compiler(tmp_path, counting_cxx):
    cxx, log = counting_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx)
    first = build.build_kernels({"k": kernel_source("k")}, cfg)
    assert len(compiles(log)) == 2  # one start, one end
    second = build.build_kernels({"k": kernel_source("k")}, cfg)
    assert second == first and len(compiles(log)) == 2
    assert call(first["k"], "k", 4) == 13


def test_changed_flags_change_the_key_and_rebuild(tmp_path, counting_cxx):
    cxx, log = counting_cxx
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
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx, cxx_jobs=2, cxx_unit_chars=0)
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


# ---- translation units of several kernels, lean linking, untrusted cache entries ----------

def test_units_balance_source_size_and_keep_kernel_order():
    sources = {"a": "x" * 50, "b": "x" * 10, "c": "x" * 40, "d": "x" * 20}
    assert build.plan_units(sources, 2) == [["a", "b"], ["c", "d"]]   # 60 and 60 characters
    assert build.plan_units(sources, 1) == [["a", "b", "c", "d"]]
    assert build.plan_units(sources, 8) == [["a"], ["b"], ["c"], ["d"]]
    assert build.plan_units({}, 2) == []


def test_units_per_build_follow_source_size_up_to_the_jobs():
    cfg = Config(cxx_jobs=2, cxx_unit_chars=100)
    assert build.unit_count({"a": "x" * 60, "b": "x" * 40}, cfg) == 1
    assert build.unit_count({"a": "x" * 60, "b": "x" * 41}, cfg) == 2
    assert build.unit_count({f"k{i}": "x" * 100 for i in range(5)}, cfg) == 2
    assert build.unit_count({"a": "x"}, cfg.replace(cxx_unit_chars=0)) == 2
    assert build.unit_count({}, cfg) == 1


def test_unit_source_hoists_includes_once_and_wraps_each_kernel():
    sources = {"k1": '#include "tdbg_prelude.h"\nint k1_body;\n',
               "k2": '#include "tdbg_prelude.h"\n#include <omp.h>\nint k2_body;\n'}
    assert build.unit_source(["k1", "k2"], sources) == (
        '#include "tdbg_prelude.h"\n#include <omp.h>\n'
        'namespace tdbg_unit_0 {  // k1\nint k1_body;\n\n}\n'
        'namespace tdbg_unit_1 {  // k2\nint k2_body;\n\n}\n')
    assert build.unit_source(["k2"], sources) == sources["k2"]


def _helper_kernel(name: str, factor: int) -> str:
    # the same helper name in every kernel: units keep them apart
    return (f'#include "tdbg_prelude.h"\nstatic long helper(long x) {{ return x * {factor}; }}\n'
            f'extern "C" long {name}(long x) {{ return helper(x); }}\n')


def test_one_job_builds_all_kernels_in_one_g_plus_plus_run(tmp_path, counting_cxx):
    cxx, log = counting_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx, cxx_jobs=1, cxx_pch=False)
    sources = {f"k{i}": _helper_kernel(f"k{i}", i + 2) for i in range(3)}
    libs = build.build_kernels(sources, cfg)
    assert len(compiles(log)) == 2 and len(set(libs.values())) == 1
    assert os.path.basename(libs["k0"]).startswith("k0_and_2_more-")
    assert [call(libs[k], k, 10) for k in sources] == [20, 30, 40]
    unit = build.unit_source(["k0", "k1", "k2"], sources)
    assert libs["k0"] == build.cached_paths(unit, cfg, name="k0_and_2_more")[1]
    with open(libs["k0"][:-3] + ".cpp") as f:
        assert f.read() == unit
    assert build.build_kernels(sources, cfg) == libs and len(compiles(log)) == 2   # warm


def test_two_jobs_make_two_units_built_at_once(tmp_path, logging_cxx):
    cxx, log = logging_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx, cxx_jobs=2, cxx_unit_chars=0, cxx_pch=False)
    sources = {f"k{i}": _helper_kernel(f"k{i}", i + 2) for i in range(4)}
    libs = build.build_kernels(sources, cfg)
    kinds = [e.split()[0] for e in sorted(compiles(log), key=lambda e: float(e.split()[1]))]
    assert kinds == ["start", "start", "end", "end"]
    assert libs["k0"] == libs["k2"] != libs["k1"] == libs["k3"]    # equal sizes: alternate units
    assert [call(libs[k], k, 1) for k in sources] == [2, 3, 4, 5]


def test_failed_unit_is_rebuilt_kernel_by_kernel_to_name_the_culprit(tmp_path, counting_cxx):
    cxx, log = counting_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx, cxx_jobs=1)
    bad = kernel_source("bad", "return x +* ;")
    sources = {"good": kernel_source("good"), "bad": bad, "also_good": kernel_source("also_good", "return x;")}
    with pytest.raises(CppCompileError) as info:
        build.build_kernels(sources, cfg)
    err = info.value
    assert err.kernels == ("bad",) and err.command == build.build_command(bad, cfg, "bad")
    with open(err.source_path) as f:
        assert f.read() == bad
    first = next(line for line in err.stderr.splitlines() if "error:" in line)
    assert first.startswith(err.source_path + ":1:")
    assert len(compiles(log)) == 2 * 4   # the unit, then each of its three kernels alone


def test_unit_that_fails_only_together_falls_back_to_one_library_per_kernel(tmp_path, counting_cxx):
    cxx, log = counting_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx, cxx_jobs=1)
    # each defines the same global (C linkage ignores the namespaces): fine alone, not together
    sources = {k: f'extern "C" int shared_global = {i};\n' + kernel_source(k, f"return x + {i};")
               for i, k in enumerate(("p", "q"))}
    libs = build.build_kernels(sources, cfg)
    assert libs["p"] != libs["q"] and (call(libs["p"], "p", 5), call(libs["q"], "q", 5)) == (5, 6)
    assert libs["p"] == build.cached_paths(sources["p"], cfg, name="p")[1]
    assert len(compiles(log)) == 2 * 3


def _needed(lib_path: str) -> list:
    out = subprocess.run(["readelf", "-d", lib_path], capture_output=True, text=True, check=True).stdout
    return sorted(line.split("[")[1].split("]")[0] for line in out.splitlines() if "(NEEDED)" in line)


def test_kernels_link_without_libstdcxx_unless_they_need_it(tmp_path):
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx_jobs=1)
    plain = '#include "tdbg_prelude.h"\nextern "C" int fill(float* a) {\n#pragma omp parallel for\n' \
            'for (int i = 0; i < 64; ++i) a[i] = i;\nreturn 0; }\n'
    lib = build.build_kernels({"fill": plain}, cfg)["fill"]
    assert _needed(lib) == ["libgomp.so.1"]   # as-needed: nothing else is used
    assert "-nodefaultlibs" in build.build_command(plain, cfg, "fill")
    needs = ('struct S { S(); long v; };\nS::S() : v(41) {}\n'
             'extern "C" long guarded(long x) { static S s; long* p = new long(s.v + x); long r = *p; delete p; return r; }\n')
    lib = build.build_kernels({"guarded": needs}, cfg)["guarded"]
    assert "libstdc++.so.6" in _needed(lib) and call(lib, "guarded", 1) == 42


def test_unresolved_symbol_is_a_compile_error_not_a_failed_load(tmp_path):
    cfg = Config(cache_dir=str(tmp_path / "cache"))
    src = 'extern "C" long missing_helper(long);\n' + kernel_source("k", "return missing_helper(x);")
    with pytest.raises(CppCompileError) as info:
        build.build_kernels({"k": src}, cfg)
    assert "undefined reference to `missing_helper'" in info.value.stderr
    assert info.value.kernels == ("k",) and "-nodefaultlibs" not in info.value.command   # the relink's command


@pytest.mark.parametrize("damage", [b"", b"\x7fELF truncated"])
def test_cached_library_that_does_not_load_is_rebuilt(tmp_path, counting_cxx, damage):
    cxx, log = counting_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx)
    src = kernel_source("k")
    lib = build.build_kernels({"k": src}, cfg)["k"]
    os.unlink(lib)
    with open(lib, "wb") as f:
        f.write(damage)
    build._libraries.pop(lib, None)    # as in a new process
    assert build.build_kernels({"k": src}, cfg)["k"] == lib and len(compiles(log)) == 4
    assert call(lib, "k", 2) == 7


def test_cached_source_is_rewritten_before_a_rebuild(tmp_path):
    cfg = Config(cache_dir=str(tmp_path / "cache"))
    src = kernel_source("k")
    source_path, lib_path = build.cached_paths(src, cfg, name="k")
    os.makedirs(os.path.dirname(source_path))
    with open(source_path, "w") as f:
        f.write(kernel_source("k", "return 0;"))   # stale text under the right name
    assert build.build_kernels({"k": src}, cfg)["k"] == lib_path and call(lib_path, "k", 2) == 7
    with open(source_path) as f:
        assert f.read() == src


# ---- the precompiled prelude ---------------------------------------------------------------

def _prelude_kernel(name: str, body: str = "return x * 3 + 1;") -> str:
    return f'#include "{build.PRELUDE_NAME}"\n' + kernel_source(name, body)


def _gch(cfg) -> str:
    return os.path.join(cfg.cache_dir, "pch", build._toolchain_digest(cfg)[:20], build.PCH_NAME)


@pytest.fixture
def fresh_process():
    """What a new process would see: no verified pch, no opened libraries."""
    build._pch_ok.clear()
    yield
    build._pch_ok.clear()


def test_prelude_is_precompiled_once_and_used_by_g_plus_plus(tmp_path, counting_cxx, fresh_process):
    cxx, log = counting_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx)
    a = build.build_kernels({"a": _prelude_kernel("a")}, cfg)["a"]
    b = build.build_kernels({"b": _prelude_kernel("b", "return -x;")}, cfg)["b"]
    assert len(compiles(log)) == 2 * 3   # the pch, then a, then b
    gch = _gch(cfg)
    with open(gch, "rb") as f, open(gch + ".sha256") as d:
        assert hashlib.sha256(f.read()).hexdigest() == d.read()
    assert (call(a, "a", 2), call(b, "b", 2)) == (7, -2)
    src = build.cached_paths(_prelude_kernel("a"), cfg, name="a")[0]
    cmd = build.compile_command(cfg.replace(cxx="g++"), src, str(tmp_path / "x.so"), pch=os.path.dirname(gch))
    shown = subprocess.run(cmd + ["-H"], capture_output=True, text=True, check=True).stderr.splitlines()
    assert shown[0] == f"! {gch}"   # g++ -H: "!" marks a precompiled header it used


def test_sources_without_the_prelude_first_build_no_pch(tmp_path, counting_cxx, fresh_process):
    cxx, log = counting_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx)
    build.build_kernels({"k": kernel_source("k")}, cfg)
    assert len(compiles(log)) == 2 and not os.path.exists(os.path.join(cfg.cache_dir, "pch"))
    off = cfg.replace(cxx_pch=False)
    build.build_kernels({"k": _prelude_kernel("k")}, off)
    assert len(compiles(log)) == 4 and not os.path.exists(os.path.join(cfg.cache_dir, "pch"))


@pytest.mark.parametrize("damage", ["truncate", "stale digest"])
def test_corrupt_pch_is_rebuilt_not_trusted(tmp_path, counting_cxx, fresh_process, damage):
    cxx, log = counting_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx)
    build.build_kernels({"a": _prelude_kernel("a")}, cfg)
    gch = _gch(cfg)
    if damage == "truncate":
        with open(gch, "r+b") as f:
            f.truncate(4096)
    else:
        with open(gch + ".sha256", "w") as f:
            f.write("0" * 64)
    build._pch_ok.clear()
    lib = build.build_kernels({"b": _prelude_kernel("b", "return x - 1;")}, cfg)["b"]
    assert len(compiles(log)) == 2 * 4   # pch, a, pch again, b
    assert build._pch_verified(gch) and call(lib, "b", 5) == 4


def test_pch_damaged_after_its_check_is_dropped_and_the_unit_retried(tmp_path, counting_cxx, fresh_process):
    cxx, log = counting_cxx
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=cxx)
    build.build_kernels({"a": _prelude_kernel("a")}, cfg)
    with open(_gch(cfg), "r+b") as f:
        f.truncate(4096)   # g++: "error: while reading precompiled header"
    lib = build.build_kernels({"b": _prelude_kernel("b", "return x - 1;")}, cfg)["b"]
    assert call(lib, "b", 5) == 4 and len(compiles(log)) == 2 * 4   # pch, a, b with the pch, b without
    assert build._pch_ok[_gch(cfg)] is False and not os.path.exists(_gch(cfg) + ".sha256")


def test_prelude_that_does_not_precompile_still_builds(tmp_path, fresh_process):
    script = tmp_path / "no-pch-g++"
    script.write_text('#!/bin/sh\ncase "$*" in *c++-header*) echo "no headers here" >&2; exit 1;; esac\nexec g++ "$@"\n')
    script.chmod(0o755)
    cfg = Config(cache_dir=str(tmp_path / "cache"), cxx=str(script))
    lib = build.build_kernels({"k": _prelude_kernel("k")}, cfg)["k"]
    assert call(lib, "k", 1) == 4 and build._pch_ok[_gch(cfg)] is False
    assert not os.path.exists(_gch(cfg))
