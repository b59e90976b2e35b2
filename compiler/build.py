"""Build generated C++ kernels into shared libraries, cached on disk.

`build_kernels({name: source}, config) -> {name: library path}` compiles each kernel's
translation unit with its own g++ process (threads run them in parallel) into
`config.cache_dir`, keyed by a hash of the source, compiler, flags, `cxx --version` and the
headers shipped in this package (`tdbg_prelude.h` resolves to `cpp_prelude.h`).

Invariants:
- The cache directory and its subdirectories are created with mode 0700.
- A library path returned by `build_kernels` names a complete library: compilers write to a
  unique temporary name in the same directory and `os.replace` it into place, so concurrent
  processes never load a half-written file.
- A warm hit costs one hash and one `stat` per kernel (plus one `stat` per header per call);
  `cxx --version` runs once per process.
- On a g++ failure the source stays on disk and `CppCompileError` names the command, the
  first errors and the source path.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from .errors import CppCompileError
from .trace import get_logger

PRELUDE_NAME = "tdbg_prelude.h"      # what generated sources #include
_PACKAGE_DIR = Path(__file__).resolve().parent
_PRELUDE_SOURCE = "cpp_prelude.h"    # package data file that PRELUDE_NAME resolves to

log = get_logger("compiler")
_lock = threading.Lock()
_versions: dict = {}                 # cxx -> `cxx --version` output
_headers: dict = {}                  # (name, mtime_ns, size) per header -> (digest, {name: bytes})
_include_dirs: dict = {}             # (cache_dir, digest) -> materialised include dir
_libraries: dict = {}                # library path -> ctypes.CDLL


def ensure_private_dir(path: str) -> str:
    """Create `path` (parents as needed, with the umask's mode) and make it mode 0700; return it."""
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
    return path


def compiler_version(cxx: str) -> str:
    """`cxx --version` output, run once per process per compiler."""
    with _lock:
        if cxx not in _versions:
            try:
                proc = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
                _versions[cxx] = proc.stdout + proc.stderr
            except OSError as e:
                _versions[cxx] = f"unavailable: {e}"
        return _versions[cxx]


def _header_files() -> dict:
    """{include name: bytes} for every header shipped in the package, prelude under its alias."""
    files = sorted(_PACKAGE_DIR.glob("*.h"))
    stamp = tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    with _lock:
        if stamp not in _headers:
            contents = {f.name: f.read_bytes() for f in files}
            if _PRELUDE_SOURCE in contents:
                contents[PRELUDE_NAME] = contents[_PRELUDE_SOURCE]
            digest = hashlib.sha256()
            for name in sorted(contents):
                digest.update(name.encode() + b"\0" + contents[name] + b"\0")
            _headers.clear()
            _headers[stamp] = (digest.hexdigest(), contents)
        return _headers[stamp]


def _atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def include_dir(cache_dir: str) -> str:
    """A directory holding the package headers (and `tdbg_prelude.h`), named by their hash."""
    digest, contents = _header_files()
    key = (cache_dir, digest)
    # re-checked with one stat: a test or the user may have removed the cache meanwhile
    if key not in _include_dirs or not os.path.exists(os.path.join(_include_dirs[key], PRELUDE_NAME)):
        includes = ensure_private_dir(os.path.join(ensure_private_dir(cache_dir), "include"))
        path = ensure_private_dir(os.path.join(includes, digest[:20]))
        for name, data in contents.items():
            target = os.path.join(path, name)
            if not os.path.exists(target):
                _atomic_write(target, data)
        _include_dirs[key] = path
    return _include_dirs[key]


def _toolchain_digest(config) -> str:
    """Hash of what, besides the source, determines a library: compiler, flags, headers, CPU."""
    h = hashlib.sha256()
    for part in (config.cxx, "\0".join(config.cxx_flags), compiler_version(config.cxx),
                 _header_files()[0], platform.machine()):
        h.update(part.encode() + b"\0\1")
    return h.hexdigest()


def cache_key(source: str, config, toolchain: Optional[str] = None) -> str:
    """Hash of everything that determines the built library."""
    toolchain = toolchain or _toolchain_digest(config)
    return hashlib.sha256(toolchain.encode() + b"\0" + source.encode()).hexdigest()


def cached_paths(source: str, config, toolchain: Optional[str] = None, name: str = "kernel") -> tuple:
    """(source path, library path) that kernel `name` with `source` has in the cache under `config`."""
    key = cache_key(source, config, toolchain)
    readable = "".join(c if c.isalnum() or c == "_" else "_" for c in name)[:80]
    stem = os.path.join(config.cache_dir, key[:2], f"{readable}-{key[:32]}")
    return stem + ".cpp", stem + ".so"


def compile_command(config, source_path: str, lib_path: str) -> list:
    """The g++ command line that builds `source_path` into `lib_path`."""
    # only the hashed copy of the headers is on the include path: what the key covers is what g++ reads
    return [config.cxx, *config.cxx_flags, f"-I{include_dir(config.cache_dir)}", source_path, "-o", lib_path]


def build_command(source: str, config, name: str = "kernel") -> list:
    """The command `build_kernels` runs (or ran) for kernel `name`, for evidence and repro scripts."""
    return compile_command(config, *cached_paths(source, config, name=name))


def _compile_one(name: str, source: str, config, toolchain: str) -> tuple:
    """Build one kernel into the cache; (lib path, error or None)."""
    source_path, lib_path = cached_paths(source, config, toolchain, name)
    ensure_private_dir(os.path.dirname(lib_path))
    if not os.path.exists(source_path):
        _atomic_write(source_path, source.encode())
    tmp_lib = f"{lib_path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    cmd = compile_command(config, source_path, tmp_lib)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        proc = subprocess.CompletedProcess(cmd, 127, "", f"cannot run {config.cxx!r}: {e}")
    if proc.returncode != 0:
        if os.path.exists(tmp_lib):
            os.unlink(tmp_lib)
        shown = compile_command(config, source_path, lib_path)
        stderr = proc.stderr or proc.stdout or f"{config.cxx} exited with status {proc.returncode}"
        return lib_path, CppCompileError(command=shown, stderr=stderr, source_path=source_path,
                                         kernels=(name,))
    os.replace(tmp_lib, lib_path)
    log.debug("built %s in %.2fs: %s", name, time.perf_counter() - start, lib_path)
    return lib_path, None


def build_kernels(sources: dict, config) -> dict:
    """{kernel name: C++ translation unit} -> {kernel name: path of its built shared library}.

    Raises CppCompileError for the first kernel (in `sources` order) that fails to build.
    """
    ensure_private_dir(config.cache_dir)
    toolchain = _toolchain_digest(config)
    result, misses = {}, {}
    for name, source in sources.items():
        lib_path = cached_paths(source, config, toolchain, name)[1]
        if os.path.exists(lib_path):
            result[name] = lib_path
        else:
            misses[name] = source
    if misses:
        log.info("compiling %d kernel(s) with %s (%d cached)", len(misses), config.cxx, len(result))
        workers = max(1, min(len(misses), os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tdbg-cxx") as pool:
            futures = {name: pool.submit(_compile_one, name, src, config, toolchain) for name, src in misses.items()}
        outcomes = {name: f.result() for name, f in futures.items()}
        for name in sources:
            if name in outcomes and outcomes[name][1] is not None:
                raise outcomes[name][1]
        result.update({name: path for name, (path, _) in outcomes.items()})
    return {name: result[name] for name in sources}


def load_library(lib_path: str) -> ctypes.CDLL:
    """The CDLL for `lib_path`, opened once per process."""
    lib = _libraries.get(lib_path)
    if lib is None:
        with _lock:
            lib = _libraries.get(lib_path)
            if lib is None:
                lib = _libraries[lib_path] = ctypes.CDLL(lib_path)
    return lib


def load_kernel(lib_path: str, symbol: str):
    """A fresh ctypes function object for `symbol` (callers set their own argtypes/restype)."""
    return load_library(lib_path)[symbol]


def cxx_available(cxx: Optional[str] = None) -> bool:
    """Whether the C++ compiler runs at all (for tests and `tdbg` diagnostics)."""
    return not compiler_version(cxx or "g++").startswith("unavailable")
