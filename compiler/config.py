"""tdbg's compiler configuration: one explicit object.

`Config` is a frozen dataclass. The compiler takes one as an argument; the Dynamo backend entry
point (which cannot receive arguments) uses `current()`, the process-wide default, which
`Config.patch(...)` and `use(cfg)` replace for the length of a `with` block.

`from_env()` (and `repro_from_env()`) are the only readers of environment variables in tdbg.
`to_json()` / `from_json()` carry a config across processes (bisect, minifier workers) and
into repro files.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Iterator, Optional

from .logs import LOG_CHANNELS
from .toolchain import VENDORS, cpu_vendor, native_vector

BUG_KINDS = ("compile_error", "runtime_error", "accuracy", "crash")
DYNAMIC_MODES = ("symbolic", "specialize")
CPU_VENDORS = tuple(sorted(set(VENDORS.values()))) + ("other",)
# The aten/prims ops tdbg lowers, by name: the ops `inject_bug` can break (an op that is not
# lowered has no generated code to break). tests/test_config.py pins it to lowering.LOWERINGS;
# spelled out here so that reading the configuration stays torch-free.
INJECTABLE_OPS = frozenset("""
    _to_copy _unsafe_masked_index_put_accumulate _unsafe_view abs acos acosh add alias all amax amin any arange argmax argmin as_strided
    asin asinh atan atan2 atanh avg_pool2d bernoulli bitwise_and bitwise_left_shift bitwise_not bitwise_or
    bitwise_right_shift bitwise_xor cat ceil clamp clamp_max clamp_min clone constant_pad_nd
    convert_element_type copy copysign cos cosh cummax cummin cumprod cumsum detach diagonal div embedding empty
    empty_permuted empty_strided eq erf erfc exp exp2 expand expm1
    floor floor_divide fmax fmin fmod frac full full_like gather ge gt hypot index index_select iota isinf
    isnan le lgamma lift_fresh_copy log log10 log1p log2 logical_and logical_not logical_or
    logical_xor lt max maximum mean min minimum mul native_dropout native_dropout_backward ne neg permute pow prod
    rand rand_like randn randn_like reciprocal relu remainder
    reshape rev round rsqrt scalar_tensor scatter select sigmoid sign signbit sin sinh slice sqrt squeeze sub sum
    t tan tanh transpose trunc uniform unsafe_split unsafe_split_with_sizes unsqueeze var var_mean view where""".split())


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tdbg")


# -fno-math-errno: nothing reads errno, and without it g++ keeps sqrt & co. scalar (a call
# that may set errno cannot vectorize); NaN/inf semantics and no-FMA contraction stay exact.
# -Wl,-z,defs: a symbol the library cannot resolve is a build error, not a failed dlopen later.
BASE_CXX_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-finite-math-only",
                  "-ffp-contract=off", "-fPIC", "-shared", "-std=c++17", "-w", "-Wl,-z,defs")


def _native_vector() -> tuple:
    return native_vector()   # g++ is asked once per process, when a default is first needed


@dataclass(frozen=True)
class Config:
    # scheduling
    max_fusion_size: int = 64          # most IR nodes in one fused kernel
    fusion: bool = True                # vertical and horizontal fusion; off = one kernel per node
    max_fusions: Optional[int] = None  # bisect: only the first N fusion decisions are accepted
    # lowering
    decompose: bool = True             # apply tdbg's decomposition table in AOTAutograd
    fallback_ops: frozenset = frozenset()  # aten op names ("neg", "aten.neg.default") forced to aten
    fallback_random: bool = False      # random ops through aten (bit-exact with eager)
    max_lowered_ops: Optional[int] = None  # bisect: only the first N lowerable nodes are lowered
    layout_optimization: bool = True   # inference graphs with 2-d convolutions run NHWC (layout.py)
    pack_weights: bool = True          # inference linears run on MKL-packed weights (prepack.py)
    hoist_weights: bool = True         # inference work on weights alone runs once per weight version (hoist.py)
    bias_epilogue: bool = True         # inference linears' biases added by the kernels after them (bias_epilogue.py)
    linear_gelu: bool = True           # inference linears of many rows run GELU as oneDNN's post-op (linear_gelu.py)
    concat_linears: bool = True        # inference linears reading one input run as one GEMM (concat_linears.py)
    # whose CPU the GEMM choices are made for (prepack.LINEAR_PACKINGS): "intel", "amd" or "other";
    # default: this machine's (toolchain.cpu_vendor)
    cpu_vendor: str = field(default_factory=cpu_vendor)
    # graphs with symbolic shapes: "symbolic" compiles once into kernels taking the sizes as
    # arguments (falling back per graph where it cannot); "specialize" compiles one static copy
    # per concrete call signature (the bisect subsystem / the older path)
    dynamic: str = "symbolic"
    # codegen
    # vector width in float32 lanes (0 disables vectorization); default: the CPU's (toolchain.native_vector)
    simdlen: int = field(default_factory=lambda: _native_vector()[0])
    vectorize: bool = True
    parallel: bool = True              # OpenMP over outer loops
    min_chunk_size: int = 4096         # least work (elements) before a loop goes parallel
    num_threads: int = 0               # 0 = torch.get_num_threads()
    enable_kernel_profile: bool = False  # kernels show up by name in torch.profiler
    # wrapper: outputs and intermediates of >= 1 MB reuse an earlier call's storage once
    # nothing can observe it (no page faults on fresh memory); off = a fresh allocation per call
    reuse_outputs: bool = True
    # build
    cxx: str = "g++"
    # BASE_CXX_FLAGS, then -mprefer-vector-width=512 on an AVX-512 CPU (toolchain.native_vector)
    cxx_flags: tuple = field(default_factory=lambda: BASE_CXX_FLAGS + _native_vector()[1])
    # After the source. Kernels need no libstdc++, and not linking it halves the link (~20 ms
    # per g++); code that does need it (undefined references) is relinked with g++'s defaults.
    link_libs: tuple = ("-nodefaultlibs", "-lgomp", "-lm", "-lc", "-lgcc")
    cxx_jobs: int = 0                  # most g++ at once (translation units per build); 0 = usable CPUs
    cxx_unit_chars: int = 4000         # kernel source per unit before a build splits; 0 = cxx_jobs units
    cxx_pch: bool = True               # precompile the prelude once per cache dir and toolchain
    cache_dir: str = field(default_factory=default_cache_dir)
    # debugging
    debug: bool = False                # write the debug directory for every compiled graph
    debug_dir: str = "tdbg_debug"      # parent of run_<time>-pid_<pid>/
    logs: frozenset = frozenset()      # enabled channels, subset of LOG_CHANNELS
    verbose_logs: frozenset = frozenset()  # channels given as +name
    # testing only: (op, kind) makes the codegen of `op` wrong in the way `kind` says
    inject_bug: Optional[tuple] = None
    # when set, every compiled graph appends one JSON line here: its lowered nodes, fallbacks,
    # fusions and kernels, each counted application numbered per process (what bisect reads)
    report_path: Optional[str] = None

    def __post_init__(self):
        if self.inject_bug is not None:
            op, kind = self.inject_bug
            if kind not in BUG_KINDS:
                raise ValueError(f"inject_bug kind {kind!r} is not one of {', '.join(BUG_KINDS)}")
            check_injectable(op)
        if self.cpu_vendor not in CPU_VENDORS:
            raise ValueError(f"cpu_vendor must be one of {', '.join(CPU_VENDORS)}, got {self.cpu_vendor!r}")
        if self.dynamic not in DYNAMIC_MODES:
            raise ValueError(f"dynamic must be one of {', '.join(DYNAMIC_MODES)}, got {self.dynamic!r}")
        unknown = set(self.logs) - set(LOG_CHANNELS)
        if unknown:
            raise ValueError(f"unknown log channel(s) {sorted(unknown)}; channels: {', '.join(LOG_CHANNELS)}")

    def replace(self, **changes) -> "Config":
        return dataclasses.replace(self, **_normalize(changes))

    @contextlib.contextmanager
    def patch(self=None, **changes) -> Iterator["Config"]:
        """`with Config.patch(x=1):` or `with cfg.patch(x=1):` sets the process default."""
        base = self if isinstance(self, Config) else current()
        with use(base.replace(**changes)) as cfg:
            yield cfg

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, (frozenset, set, tuple)):
                d[k] = sorted(v) if isinstance(v, (frozenset, set)) else list(v)
        return json.dumps(d, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Config":
        """The Config `to_json` wrote; ValueError for text that is not a JSON object or has a key
        that is not a field (a typo would otherwise be dropped without a word)."""
        d = json.loads(text)
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object of config fields, got {type(d).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"unknown config key(s) {', '.join(map(repr, unknown))}; keys: {', '.join(known)}")
        return cls(**_normalize(d))


def _normalize(d: dict) -> dict:
    out = dict(d)
    for k in ("fallback_ops", "logs", "verbose_logs"):
        if k in out and out[k] is not None:
            out[k] = frozenset(out[k])
    for k in ("cxx_flags", "link_libs"):
        if k in out:
            out[k] = tuple(out[k])
    if out.get("inject_bug") is not None:
        out["inject_bug"] = tuple(out["inject_bug"])
    return out


_current: Optional[Config] = None


def current() -> Config:
    """The process default: from the environment on first use, or whatever `use` set."""
    global _current
    if _current is None:
        _current = from_env()
    return _current


@contextlib.contextmanager
def use(cfg: Config) -> Iterator[Config]:
    global _current
    saved = _current
    _current = cfg
    try:
        yield cfg
    finally:
        _current = saved


def set_default(cfg: Config) -> None:
    global _current
    _current = cfg


def parse_logs(spec: str) -> tuple:
    """'+compiler,output_code' -> (logs, verbose_logs). Unknown names raise ValueError."""
    logs, verbose = set(), set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name = part.lstrip("+")
        if name not in LOG_CHANNELS:
            raise ValueError(f"unknown log channel {name!r}; channels: {', '.join(LOG_CHANNELS)}")
        logs.add(name)
        if part.startswith("+"):
            verbose.add(name)
    return frozenset(logs), frozenset(verbose)


def parse_inject_bug(spec: str) -> tuple:
    """'neg:accuracy' -> ('neg', 'accuracy'); OP must name an op of INJECTABLE_OPS."""
    op, sep, kind = spec.partition(":")
    if not sep or kind not in BUG_KINDS:
        raise ValueError(f"inject_bug must look like OP:KIND with KIND in {', '.join(BUG_KINDS)}, got {spec!r}")
    check_injectable(op)
    return (op, kind)


def check_injectable(op: str) -> None:
    """ValueError unless `op` ("neg", "aten.neg", "aten.neg.default", "prims.convert_element_type")
    names an op in INJECTABLE_OPS."""
    parts = op.split(".")
    name = parts[1] if len(parts) > 1 and parts[0] in ("aten", "prims") else parts[0]
    if name not in INJECTABLE_OPS:
        raise ValueError(f"inject_bug op {op!r} is not an op tdbg lowers, so no generated code could break; "
                         f"ops: {', '.join(sorted(INJECTABLE_OPS))}")


def _flag(v: str) -> bool:
    return v.strip().lower() not in ("", "0", "false", "no", "off")


# TDBG_<NAME> -> (field, parser). TDBG_CONFIG (a to_json() text) is applied first.
_ENV = {
    "TDBG_COMPILE_DEBUG": ("debug", _flag),
    "TDBG_DEBUG_DIR": ("debug_dir", str),
    "TDBG_CACHE_DIR": ("cache_dir", str),
    "TDBG_CXX": ("cxx", str),
    "TDBG_NUM_THREADS": ("num_threads", int),
    "TDBG_MAX_FUSION_SIZE": ("max_fusion_size", int),
    "TDBG_SIMDLEN": ("simdlen", int),
    "TDBG_MIN_CHUNK_SIZE": ("min_chunk_size", int),
    "TDBG_FUSION": ("fusion", _flag),
    "TDBG_PARALLEL": ("parallel", _flag),
    "TDBG_VECTORIZE": ("vectorize", _flag),
    "TDBG_DECOMPOSE": ("decompose", _flag),
    "TDBG_LAYOUT_OPTIMIZATION": ("layout_optimization", _flag),
    "TDBG_PACK_WEIGHTS": ("pack_weights", _flag),
    "TDBG_HOIST_WEIGHTS": ("hoist_weights", _flag),
    "TDBG_BIAS_EPILOGUE": ("bias_epilogue", _flag),
    "TDBG_LINEAR_GELU": ("linear_gelu", _flag),
    "TDBG_CONCAT_LINEARS": ("concat_linears", _flag),
    "TDBG_CPU_VENDOR": ("cpu_vendor", str),
    "TDBG_DYNAMIC": ("dynamic", str),
    "TDBG_FALLBACK_RANDOM": ("fallback_random", _flag),
    "TDBG_FALLBACK_OPS": ("fallback_ops", lambda v: frozenset(filter(None, v.split(",")))),
    "TDBG_MAX_LOWERED_OPS": ("max_lowered_ops", int),
    "TDBG_MAX_FUSIONS": ("max_fusions", int),
    "TDBG_KERNEL_PROFILE": ("enable_kernel_profile", _flag),
    "TDBG_REUSE_OUTPUTS": ("reuse_outputs", _flag),
    "TDBG_INJECT_BUG": ("inject_bug", parse_inject_bug),
    "TDBG_REPORT": ("report_path", str),
}


def from_env(environ=None) -> Config:
    """Build a Config from TDBG_* variables; a malformed value raises ValueError naming it."""
    env = os.environ if environ is None else environ
    try:
        cfg = Config.from_json(env["TDBG_CONFIG"]) if env.get("TDBG_CONFIG") else Config()
    except (ValueError, TypeError) as e:
        shown = env["TDBG_CONFIG"] if len(env["TDBG_CONFIG"]) <= 200 else env["TDBG_CONFIG"][:200] + "..."
        raise ValueError(f"environment variable TDBG_CONFIG={shown!r}: {e}") from None
    changes = {}
    for var, (name, parse) in _ENV.items():
        if env.get(var):
            try:
                changes[name] = parse(env[var])
            except ValueError as e:
                raise ValueError(f"environment variable {var}={env[var]!r}: {e}") from None
    if env.get("TDBG_LOGS"):
        changes["logs"], changes["verbose_logs"] = parse_logs(env["TDBG_LOGS"])
    return cfg.replace(**changes)


def to_env(cfg: Config) -> dict:
    """Environment that makes a child process's from_env() return `cfg`."""
    return {"TDBG_CONFIG": cfg.to_json()}


def repro_from_env(environ=None) -> tuple:
    """(repro_after, repro_level) from TDBG_REPRO_AFTER/LEVEL, else the TORCHDYNAMO_ names."""
    env = os.environ if environ is None else environ
    after = env.get("TDBG_REPRO_AFTER") or env.get("TORCHDYNAMO_REPRO_AFTER") or None
    level = env.get("TDBG_REPRO_LEVEL") or env.get("TORCHDYNAMO_REPRO_LEVEL") or "2"
    if after not in (None, "dynamo", "aot"):
        raise ValueError(f"repro_after must be 'dynamo' or 'aot', got {after!r}")
    if level not in ("1", "2", "3", "4"):
        raise ValueError(f"repro_level must be 1, 2, 3 or 4, got {level!r}")
    return after, int(level)
