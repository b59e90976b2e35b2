"""Fault injection into tdbg's compiler: a damaged kernel cache, a cache removed while g++ runs,
a cache directory that is not private or not writable, threads meeting new shapes at once.

Each test damages what a user's machine can damage and checks that the compiler recovers (or
refuses with a typed error naming the variable), never crashes the user's process.
"""
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from tdbg.compiler import build
from tdbg.compiler.config import Config
from tdbg.compiler.errors import CacheDirError

SOURCE = 'extern "C" long k(long x) { return x * 3 + 1; }\n'
OTHER = 'extern "C" long j(long x) { return x - 5; }\n'


def call(lib_path: str, symbol: str, x: int) -> int:
    import ctypes
    fn = build.load_kernel(lib_path, symbol)
    fn.argtypes, fn.restype = [ctypes.c_long], ctypes.c_long
    return fn(x)


# ---- item 4: cached artifacts are verified before they are opened -----------------------------

LOAD_IN_CHILD = textwrap.dedent("""\
    import ctypes, sys
    from tdbg.compiler import build
    from tdbg.compiler.config import Config
    lib = build.build_kernels({"k": sys.argv[2]}, Config(cache_dir=sys.argv[1]))["k"]
    fn = build.load_kernel(lib, "k")
    fn.argtypes, fn.restype = [ctypes.c_long], ctypes.c_long
    print(fn(10))
""")


def test_truncated_cached_library_is_rebuilt_not_opened(tmp_path):
    """dlopen of a half-length .so dies with SIGBUS; a fresh process must rebuild it instead
    (and keep doing so: the next run finds a good library)."""
    cache = str(tmp_path / "cache")
    lib = build.build_kernels({"k": SOURCE}, Config(cache_dir=cache))["k"]
    size = os.path.getsize(lib)
    with open(lib, "r+b") as f:
        f.truncate(size // 2)
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", LOAD_IN_CHILD, cache, SOURCE], capture_output=True, text=True,
                              timeout=120)
        assert (proc.returncode, proc.stdout) == (0, "31\n"), proc.stderr[-2000:]
        assert os.path.getsize(lib) == size


def test_cached_library_without_the_kernel_symbol_is_rebuilt(tmp_path):
    """A valid ELF that lacks the kernel (another kernel's library copied over it) is replaced."""
    cfg = Config(cache_dir=str(tmp_path / "cache"))
    lib = build.build_kernels({"k": SOURCE}, cfg)["k"]
    other = build.build_kernels({"j": OTHER}, cfg)["j"]
    shutil.copyfile(other, lib)
    assert build.build_kernels({"k": SOURCE}, cfg)["k"] == lib
    assert call(lib, "k", 10) == 31
    # the other's manifest with it: the manifest does not list k, so it is rebuilt again
    shutil.copyfile(other, lib + ".tmpcopy")
    os.replace(lib + ".tmpcopy", lib)
    shutil.copyfile(other + build.MANIFEST, lib + build.MANIFEST)
    assert build.build_kernels({"k": SOURCE}, cfg)["k"] == lib
    assert "k" in open(lib + build.MANIFEST).read()


def test_library_without_manifest_is_rebuilt(tmp_path, monkeypatch):
    cfg = Config(cache_dir=str(tmp_path / "cache"))
    lib = build.build_kernels({"k": SOURCE}, cfg)["k"]
    os.unlink(lib + build.MANIFEST)
    built = []
    real = build._attempt
    monkeypatch.setattr(build, "_attempt", lambda *a: built.append(a[0]) or real(*a))
    assert build.build_kernels({"k": SOURCE}, cfg)["k"] == lib
    assert built == ["k"] and os.path.exists(lib + build.MANIFEST)


# ---- item 9: the cache removed while g++ runs; an existing cache directory that is not private --

def test_cache_removed_while_the_compiler_runs_is_retried(tmp_path):
    cache = tmp_path / "cache"
    marker = tmp_path / "removed-once"
    cxx = tmp_path / "g++-that-loses-its-cache"
    cxx.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$*" in *--version*) exec g++ "$@";; esac
        if [ ! -e {marker} ]; then touch {marker}; rm -rf {cache}; fi
        exec g++ "$@"
        """))
    cxx.chmod(0o755)
    cfg = Config(cache_dir=str(cache), cxx=str(cxx), cxx_pch=False)
    lib = build.build_kernels({"k": '#include "tdbg_prelude.h"\n' + SOURCE}, cfg)["k"]
    assert marker.exists() and call(lib, "k", 10) == 31


def test_existing_cache_directory_is_made_private(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)
    lib = build.build_kernels({"k": SOURCE}, Config(cache_dir=str(cache)))["k"]
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.dirname(lib)).st_mode) == 0o700


def test_cache_directory_of_another_user_is_refused(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    os.chown(cache, os.geteuid() + 1, -1) if os.geteuid() == 0 else pytest.skip("needs root to chown")
    with pytest.raises(CacheDirError) as info:
        build.build_kernels({"k": SOURCE}, Config(cache_dir=str(cache)))
    assert str(info.value).startswith(f"TDBG_CACHE_DIR={cache} is mode 0777 and owned by uid {os.geteuid() + 1}")


# ---- item 16: an unwritable TDBG_CACHE_DIR is a typed error naming the variable ----------------

def test_unwritable_cache_directory_names_the_variable(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = str(blocker / "cache")
    with pytest.raises(CacheDirError) as info:
        build.build_kernels({"k": SOURCE}, Config(cache_dir=cache))
    e = info.value
    assert str(e).startswith(f"TDBG_CACHE_DIR={cache} is not writable: NotADirectoryError")
    assert e.evidence()["variable"] == "TDBG_CACHE_DIR" and e.evidence()["stage"] == "bad_input"


def test_unwritable_cache_directory_under_torch_compile(tmp_path):
    """The same typed error reaches the user of torch.compile (not a generic backend failure)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    torch._dynamo.reset()
    with Config.patch(cache_dir=str(blocker / "cache")):
        with pytest.raises(Exception) as info:
            torch.compile(lambda x: x.sin() + 1, backend="tdbg")(torch.randn(8))
    chain = [info.value, info.value.__cause__, getattr(info.value, "inner_exception", None)]
    assert any(isinstance(e, CacheDirError) for e in chain), repr(info.value)
    torch._dynamo.reset()


# ---- item 5: a thread meeting a new shape does not break the others ------------------------------

def test_threads_survive_another_thread_specializing_new_shapes():
    """Three threads call one compiled function while a fourth calls a dynamic one with new sizes
    (each a new specialization, compiled at call time): nobody raises, every result is right."""
    torch._dynamo.reset()
    static = torch.compile(lambda x: x.sin() + 1, backend="tdbg")
    dynamic = torch.compile(lambda x: x.cos() * 2, backend="tdbg", dynamic=True)
    x = torch.randn(64)
    expected = static(x)            # tdbg's sin is within an ulp of eager's: compare with itself
    torch.testing.assert_close(expected, x.sin() + 1)
    dynamic(torch.randn(4, 3)), dynamic(torch.randn(5, 3))
    errors, stop = [], threading.Event()

    def caller():
        try:
            while not stop.is_set():
                assert torch.equal(static(x), expected)
        except BaseException as e:
            errors.append(e)

    def specializer():
        try:
            for n in range(6, 8):
                y = torch.randn(n, 3)
                torch.testing.assert_close(dynamic(y), y.cos() * 2)
        except BaseException as e:
            errors.append(e)
        finally:
            stop.set()
    threads = [threading.Thread(target=caller) for _ in range(3)] + [threading.Thread(target=specializer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    torch._dynamo.reset()
    assert errors == []
