"""Build generated C++ kernels into shared libraries, cached on disk.

`build_kernels({name: source}, config) -> {name: library path}` splits the kernels into
`unit_count` translation units of about equal size (several kernels share one g++ run: the
fixed cost of a g++ process, ~50 ms, is paid once per unit instead of once per kernel), compiles
the units in parallel threads into `config.cache_dir`, each keyed by a hash of its source,
compiler, flags, libraries, `cxx --version` and the headers shipped in this package
(`tdbg_prelude.h` resolves to `cpp_prelude.h`).

Invariants:
- The cache directory and its subdirectories are mode 0700: created so, or an existing one of
  ours is chmod-ed (kernels are loaded from it, so nobody else may write there). One that cannot
  be created, written or made private raises `CacheDirError` naming TDBG_CACHE_DIR.
- A library path returned by `build_kernels` names a complete library: compilers write to a
  unique temporary name in the same directory and `os.replace` it into place, so concurrent
  processes never load a half-written file.
- Each library is installed with a manifest (`<lib>.manifest`: size, sha256, exported symbols).
  A cached library is opened only when its size and sha256 equal its manifest's and the manifest
  lists every kernel of the unit; anything else (truncated, replaced, no manifest) is removed and
  rebuilt, never opened: dlopen of a truncated library kills the process with SIGBUS.
- A warm hit costs one hash, one `stat` and one (memoized) dlopen per unit, plus one `stat` per
  header per call; the library's sha256 is checked once per process (again when its `stat`
  changes); `cxx --version` runs once per process.
- A build whose cache directory disappears while g++ runs is retried once into a recreated one.
- On a g++ failure the source stays on disk and `CppCompileError` names the kernel, the command,
  the first errors and the kernel's own source path (a failed unit of several kernels is rebuilt
  kernel by kernel to find it).
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import stat
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from .errors import CacheDirError, CppCompileError
from .logs import get_logger
from .toolchain import native_vector  # noqa: F401 (build.native_vector: the name callers and tests use)

PRELUDE_NAME = "tdbg_prelude.h"      # what generated sources #include
_PACKAGE_DIR = Path(__file__).resolve().parent
_PRELUDE_SOURCE = "cpp_prelude.h"    # package data file that PRELUDE_NAME resolves to
PCH_NAME = PRELUDE_NAME + ".gch"     # g++ looks for it in each include directory before the header

log = get_logger("compiler")
_lock = threading.Lock()
_versions: dict = {}                 # cxx -> `cxx --version` output
_headers: dict = {}                  # (name, mtime_ns, size) per header -> (digest, {name: bytes})
_include_dirs: dict = {}             # (cache_dir, digest) -> materialised include dir
_libraries: dict = {}                # library path -> ctypes.CDLL
_verified: dict = {}                 # library path -> (inode, size, mtime_ns) that matched its manifest
MANIFEST = ".manifest"               # <lib>.manifest: {"size", "sha256", "symbols"} written at install
_pch_lock = threading.Lock()
_pch_ok: dict = {}                   # .gch path -> usable, decided once per process
_prepared: set = set()               # configs whose pch `prepare` started


def ensure_private_dir(path: str, cache_dir: Optional[str] = None) -> str:
    """Create `path` (parents as needed) or take the existing directory, and leave it mode 0700;
    return it. Raises CacheDirError (naming `cache_dir`, the configured root, default `path`) when
    it cannot be created or written, or is group/other accessible and owned by another user."""
    cache_dir = cache_dir or path
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
        if stat.S_IMODE(st.st_mode) != 0o700:
            if st.st_uid != os.geteuid():
                raise CacheDirError(cache_dir, path, f"is mode {stat.S_IMODE(st.st_mode):04o} and owned by uid "
                                    f"{st.st_uid}, not this user: kernels loaded from it could be replaced")
            os.chmod(path, 0o700)
        if not os.access(path, os.W_OK | os.X_OK):
            raise CacheDirError(cache_dir, path, "is not writable")
    except OSError as e:
        raise CacheDirError(cache_dir, path, f"is not writable: {type(e).__name__}: {e.strerror or e}") from None
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
        includes = ensure_private_dir(os.path.join(ensure_private_dir(cache_dir), "include"), cache_dir)
        path = ensure_private_dir(os.path.join(includes, digest[:20]), cache_dir)
        for name, data in contents.items():
            target = os.path.join(path, name)
            if not os.path.exists(target):
                _atomic_write(target, data)
        _include_dirs[key] = path
    return _include_dirs[key]


def _toolchain_parts(config) -> tuple:
    """(name, text) of each thing besides the source that determines a library: compiler, flags,
    headers, CPU. The cache key hashes the texts; explain --caches names the one that changed."""
    return (("cxx", config.cxx), ("cxx_flags", "\0".join(config.cxx_flags)), ("link_libs", "\0".join(config.link_libs)),
            ("compiler_version", compiler_version(config.cxx)), ("headers", _header_files()[0]),
            ("machine", platform.machine()))


def _toolchain_digest(config) -> str:
    """Hash of what, besides the source, determines a library (_toolchain_parts)."""
    h = hashlib.sha256()
    for _, part in _toolchain_parts(config):
        h.update(part.encode() + b"\0\1")
    return h.hexdigest()


def _trace_lookup(config, units: list, misses: list) -> None:
    """Under a structured-trace handler (TORCH_TRACE, explain --caches), one artifact for this
    build's cache lookup, shaped as Inductor's FX graph cache reports its own: `tdbg_build_cache_hit`
    (every unit cached) or `_miss`, with the key components as `[hash] name: value` lines."""
    if "torch._logging" not in sys.modules:     # no torch loaded: nobody can be tracing
        return
    from .torch_compat import trace_log, trace_structured
    if not trace_log.handlers:
        return

    def line(name: str, text: str, shown: str) -> str:
        return f"[{hashlib.sha256(text.encode()).hexdigest()[:20]}] {name}: {shown}"
    components = [line(f"toolchain[{n}]", t, t.replace("\0", " ")) for n, t in _toolchain_parts(config)]
    missed = {name for name, _, _ in misses}
    components += [line(f"unit[{name}]", src, f"{len(members)} kernel(s), sha256 {hashlib.sha256(src.encode()).hexdigest()[:16]}"
                        + (" (built)" if name in missed else " (cached)")) for name, src, members in units]
    state = "miss" if misses else "hit"
    key = hashlib.sha256("\0".join(sorted(c.partition(" ")[0] for c in components)).encode()).hexdigest()
    trace_structured("artifact", metadata_fn=lambda: {"name": f"tdbg_build_cache_{state}", "encoding": "json"},
                     payload_fn=lambda: json.dumps({"cache_state": state, "key": key, "components": components,
                                                    "units": len(units), "built": len(misses)}))


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


def compile_command(config, source_path: str, lib_path: str, lean: bool = True, pch: Optional[str] = None) -> list:
    """The g++ command line that builds `source_path` into `lib_path` (`lean`: with
    `config.link_libs` after the source, else with g++'s default libraries; `pch`: a directory
    holding the precompiled prelude, searched before the headers)."""
    # only the hashed copy of the headers is on the include path: what the key covers is what g++ reads
    libs = list(config.link_libs) if lean else []
    first = [f"-I{pch}"] if pch else []
    return [config.cxx, *config.cxx_flags, *first, f"-I{include_dir(config.cache_dir)}", source_path,
            "-o", lib_path, *libs]


def build_command(source: str, config, name: str = "kernel") -> list:
    """The command `build_kernels` runs (or ran) for kernel `name`, for evidence and repro scripts
    (without the precompiled prelude, which changes nothing but g++'s time)."""
    return compile_command(config, *cached_paths(source, config, name=name))


# ---- the precompiled prelude -----------------------------------------------------------------

def pch_command(config, out_path: str) -> list:
    """The g++ command that precompiles the prelude: the units' flags minus the link-only ones
    (g++ uses a precompiled header only if it was built with the flags of the unit)."""
    flags = [f for f in config.cxx_flags if f != "-shared" and not f.startswith("-Wl,")]
    includes = include_dir(config.cache_dir)
    return [config.cxx, *flags, f"-I{includes}", "-x", "c++-header", os.path.join(includes, PRELUDE_NAME),
            "-o", out_path]


def pch_dir(config, toolchain: str) -> Optional[str]:
    """`<cache>/pch/<toolchain>/` holding `tdbg_prelude.h.gch` and its sha256 (`.sha256`),
    checked once per process against that digest and rebuilt when it differs or is missing;
    None when `config.cxx_pch` is off or the prelude does not precompile."""
    if not config.cxx_pch:
        return None
    path = os.path.join(config.cache_dir, "pch", toolchain[:20])
    gch = os.path.join(path, PCH_NAME)
    with _pch_lock:
        if gch not in _pch_ok:
            _pch_ok[gch] = _pch_verified(gch) or _build_pch(config, path, gch)
        return path if _pch_ok[gch] else None


def prepare(config) -> None:
    """Start precompiling the prelude for `config` in a background thread (once per cache dir and
    toolchain per process), so that it overlaps tracing and lowering instead of delaying the
    first build; `build_kernels` waits for it (the lock in `pch_dir`)."""
    if not config.cxx_pch:
        return
    key = (config.cache_dir, config.cxx, config.cxx_flags, config.link_libs)
    with _lock:   # not _pch_lock: that one is held while the pch builds
        if key in _prepared:
            return
        _prepared.add(key)
    threading.Thread(target=_prepare, args=(config,), name="tdbg-pch", daemon=True).start()


def _prepare(config) -> None:
    try:
        pch_dir(config, _toolchain_digest(config))
    except (OSError, CacheDirError) as e:   # the build that needs it reports it in the caller's thread
        log.info("precompiling the prelude in the background failed: %s", e)


def _digest_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _pch_verified(gch: str) -> bool:
    try:
        with open(gch + ".sha256") as f:
            return f.read().strip() == _digest_file(gch)
    except OSError:
        return False


def _build_pch(config, path: str, gch: str) -> bool:
    ensure_private_dir(os.path.join(ensure_private_dir(config.cache_dir), "pch"), config.cache_dir)
    ensure_private_dir(path, config.cache_dir)
    tmp = f"{gch}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    start = time.perf_counter()
    proc = _run(pch_command(config, tmp), config.cxx)
    if proc.returncode != 0:
        log.info("building without a precompiled prelude: %s", (proc.stderr or "").strip()[:500])
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    digest = _digest_file(tmp)
    os.replace(tmp, gch)
    _atomic_write(gch + ".sha256", digest.encode())
    log.debug("precompiled the prelude in %.2fs: %s", time.perf_counter() - start, gch)
    return True


def _drop_pch(pch: str) -> None:
    """A precompiled prelude g++ could not read: not used again, rebuilt by the next process."""
    gch = os.path.join(pch, PCH_NAME)
    with _pch_lock:
        _pch_ok[gch] = False
    with contextlib.suppress(OSError):
        os.unlink(gch + ".sha256")


# ---- compiling ---------------------------------------------------------------------------------

def _run(cmd: list, cxx: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        return subprocess.CompletedProcess(cmd, 127, "", f"cannot run {cxx!r}: {e}")


def _compile_one(name: str, source: str, config, toolchain: str, pch: Optional[str] = None,
                 symbols: tuple = ()) -> tuple:
    """Build one translation unit exporting `symbols` into the cache; (lib path, error or None).
    A build whose directory vanished meanwhile (the cache removed while g++ ran: an `ld` error, or
    the install failing) is retried once into recreated directories."""
    lib_path, error, vanished = _attempt(name, source, config, toolchain, pch, symbols)
    if vanished:
        log.info("the cache directory of %s disappeared during the build; building it again", name)
        lib_path, error, _ = _attempt(name, source, config, toolchain, pch, symbols)
    return lib_path, error


def _attempt(name: str, source: str, config, toolchain: str, pch: Optional[str], symbols: tuple) -> tuple:
    """(lib path, error or None, whether the unit's directory vanished during the build)."""
    source_path, lib_path = cached_paths(source, config, toolchain, name)
    ensure_private_dir(config.cache_dir)
    ensure_private_dir(os.path.dirname(lib_path), config.cache_dir)
    _atomic_write(source_path, source.encode())   # g++ reads exactly what the key names
    tmp_lib = f"{lib_path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    start = time.perf_counter()
    lean = True
    proc = _run(compile_command(config, source_path, tmp_lib, lean, pch), config.cxx)
    if proc.returncode != 0 and pch and "precompiled header" in proc.stderr:
        _drop_pch(pch)
        pch = None
        proc = _run(compile_command(config, source_path, tmp_lib, lean, pch), config.cxx)
    if proc.returncode != 0 and config.link_libs and "undefined reference to" in proc.stderr:
        # the code needs more than the lean libraries (libstdc++: operator new, static guards, ...)
        lean = False
        proc = _run(compile_command(config, source_path, tmp_lib, lean, pch), config.cxx)
    if proc.returncode != 0:
        with contextlib.suppress(OSError):
            os.unlink(tmp_lib)
        shown = compile_command(config, source_path, lib_path, lean)
        stderr = proc.stderr or proc.stdout or f"{config.cxx} exited with status {proc.returncode}"
        return lib_path, CppCompileError(command=shown, stderr=stderr, source_path=source_path,
                                         kernels=(name,)), not os.path.exists(source_path)
    try:
        _install(tmp_lib, lib_path, symbols or (name,))
    except FileNotFoundError as e:
        return lib_path, CppCompileError(command=compile_command(config, source_path, lib_path, lean),
                                         stderr=f"installing the library failed: {e}", source_path=source_path,
                                         kernels=(name,)), True
    log.debug("built %s in %.2fs: %s", name, time.perf_counter() - start, lib_path)
    return lib_path, None, False


def _install(tmp_lib: str, lib_path: str, symbols: tuple) -> None:
    """Move a built library into place after its manifest (so a reader that sees the library
    sees a manifest; a stale pair fails verification and is rebuilt, never loaded)."""
    with open(tmp_lib, "rb") as f:
        data = f.read()
    manifest = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "symbols": sorted(symbols)}
    _atomic_write(lib_path + MANIFEST, json.dumps(manifest).encode())
    os.replace(tmp_lib, lib_path)


def _manifest_problem(lib_path: str, size: int, symbols: tuple) -> str:
    """Why the library at `lib_path` (of `size` bytes) is not the one its manifest describes, or ''."""
    try:
        with open(lib_path + MANIFEST) as f:
            manifest = json.load(f)
        if manifest["size"] != size:
            return f"{size} bytes, {manifest['size']} when installed"
        missing = sorted(set(symbols) - set(manifest["symbols"]))
        if missing:
            return f"does not export {', '.join(missing)}"
        if _digest_file(lib_path) != manifest["sha256"]:
            return "content changed since it was installed (sha256 differs)"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no usable manifest ({type(e).__name__}: {e})"
    return ""


def jobs(config) -> int:
    """How many g++ processes one build runs at once (and so how many translation units it makes)."""
    if config.cxx_jobs > 0:
        return config.cxx_jobs
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def unit_count(sources: dict, config) -> int:
    """Translation units for one build: one per `config.cxx_unit_chars` characters of kernel source,
    at most `jobs(config)` (0 chars: always `jobs`). A small graph compiles fastest as one unit:
    a second g++ costs its own ~50 ms start (and the pch load) and on a busy 2-core machine runs
    no earlier (mlp, reductions: 0.25-0.31 s as one unit, 0.31-0.38 s as two)."""
    if config.cxx_unit_chars <= 0:
        return jobs(config)
    total = sum(len(s) for s in sources.values())
    return max(1, min(jobs(config), -(-total // config.cxx_unit_chars)))


def plan_units(sources: dict, n: int) -> list:
    """Kernel names split into at most `n` translation units of about equal source size (longest
    first onto the lightest unit; ties by order), each unit in `sources` order."""
    units = [[] for _ in range(max(1, min(n, len(sources))))]
    load = [0] * len(units)
    order = sorted(enumerate(sources), key=lambda p: (-len(sources[p[1]]), p[0]))
    for _, name in order:
        i = min(range(len(units)), key=lambda u: (load[u], u))
        units[i].append(name)
        load[i] += len(sources[name])
    position = {name: i for i, name in enumerate(sources)}
    return sorted((sorted(u, key=position.get) for u in units if u), key=lambda u: position[u[0]])


def unit_source(names: list, sources: dict) -> str:
    """One translation unit for several kernels: their leading #include lines once, then each
    kernel's code in its own namespace (helpers of different kernels may share names; the
    extern "C" entry points keep their symbol names). One kernel's unit is its source unchanged."""
    if len(names) == 1:
        return sources[names[0]]
    includes, bodies = [], []
    for i, name in enumerate(names):
        lines = sources[name].splitlines(keepends=True)
        n = 0
        while n < len(lines) and lines[n].startswith("#include"):
            n += 1
        includes += [line for line in lines[:n] if line not in includes]
        bodies.append(f"namespace tdbg_unit_{i} {{  // {name}\n{''.join(lines[n:])}\n}}\n")
    return "".join(includes) + "".join(bodies)


def unit_name(names: list) -> str:
    return names[0] if len(names) == 1 else f"{names[0]}_and_{len(names) - 1}_more"


def build_kernels(sources: dict, config) -> dict:
    """{kernel name: C++ source} -> {kernel name: path of the shared library that exports it}.

    Each kernel's source exports an extern "C" symbol named after the kernel (the manifest
    records them). The kernels are split into `unit_count` translation units built at once (one g++ each; a
    unit of one kernel is that kernel's source). When a unit of several kernels fails, its
    kernels are built one by one, so the error names the kernel and shows its own source.
    Raises CppCompileError for the first kernel (in `sources` order) that fails to build.
    """
    ensure_private_dir(config.cache_dir)
    toolchain = _toolchain_digest(config)
    units = [(unit_name(u), unit_source(u, sources), u) for u in plan_units(sources, unit_count(sources, config))]
    result, misses = {}, []
    for name, source, members in units:
        lib_path = cached_paths(source, config, toolchain, name)[1]
        if _cached(lib_path, tuple(members)):
            result.update(dict.fromkeys(members, lib_path))
        else:
            misses.append((name, source, members))
    _trace_lookup(config, units, misses)
    if misses:
        log.info("compiling %d kernel(s) in %d unit(s) with %s (%d cached)", sum(len(m) for *_, m in misses),
                 len(misses), config.cxx, len(result))
        # g++ uses a precompiled header only when it is the unit's first include
        uses_prelude = any(src.startswith(f'#include "{PRELUDE_NAME}"') for _, src, _ in misses)
        pch = pch_dir(config, toolchain) if uses_prelude else None
        outcomes = _compile_all([(name, src, tuple(members)) for name, src, members in misses], config, toolchain,
                                pch)
        failed = [members for (name, _, members) in misses if outcomes[name][1] is not None]
        alone = [(k, sources[k], (k,)) for members in failed if len(members) > 1 for k in members]
        outcomes.update(_compile_all(alone, config, toolchain, pch) if alone else {})
        for name in sources:
            if name in outcomes and outcomes[name][1] is not None:
                raise outcomes[name][1]
        for name, _, members in misses:
            for k in members:
                result[k] = outcomes[name][0] if outcomes[name][1] is None else outcomes[k][0]
    return {name: result[name] for name in sources}


def _cached(lib_path: str, symbols: tuple) -> bool:
    """Whether the cache holds a usable library exporting `symbols` at `lib_path`: one that
    matches its manifest (checked once per process per `stat`) and opens. A library that does
    not is removed (with its manifest) so that the caller rebuilds it."""
    try:
        st = os.stat(lib_path)
    except OSError:
        return False
    identity = (st.st_ino, st.st_size, st.st_mtime_ns)
    if _verified.get(lib_path) != identity:
        problem = _manifest_problem(lib_path, st.st_size, symbols)
        if problem:
            return _discard(lib_path, problem)
        _verified[lib_path] = identity
    try:
        load_library(lib_path)
        return True
    except OSError as e:
        return _discard(lib_path, f"does not load ({e})")


def _discard(lib_path: str, problem: str) -> bool:
    log.info("rebuilding %s: cached library %s", lib_path, problem)
    _verified.pop(lib_path, None)
    for path in (lib_path, lib_path + MANIFEST):
        with contextlib.suppress(OSError):
            os.unlink(path)
    return False


def _compile_all(units: list, config, toolchain: str, pch: Optional[str]) -> dict:
    """{unit name: (lib path, error or None)} for units (name, source, symbols), compiled in parallel."""
    workers = max(1, min(len(units), jobs(config)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tdbg-cxx") as pool:
        futures = {name: pool.submit(_compile_one, name, src, config, toolchain, pch, symbols)
                   for name, src, symbols in units}
    return {name: f.result() for name, f in futures.items()}


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
