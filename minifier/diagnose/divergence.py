"""Where a compiled graph's numerics first diverge from eager: node by node, in graph order.

`compare_graph(gm, inputs, backend)` runs one aten (or Dynamo) FX graph three ways on the same
inputs and returns a `GraphComparison`:

- eager, same dtypes, every node's value kept;
- a float64 reference: floating inputs, constants and dtype arguments raised to float64;
- compiled: for backends that compile aten graphs (tdbg's compiler, torch:inductor's per-graph
  compiler, aot_autograd(...) backends such as aot_eager) a debug copy of the graph in which every
  compared node is also a graph output, compiled ONCE, so the compiler realizes every node; plus
  the original graph compiled as it is, whose outputs are compared too (fusion can hide a bug
  that realized nodes do not show). Other backends: the original graph's outputs only, and the
  comparison says that only outputs were observable.

Per node: max abs / max relative error of the compiled value against the float64 reference and
against eager, and eager's own error against the reference. A node *diverges* by the rule of
`accuracy.py` (the dtype's tolerance against eager, unless the compiled error against float64 is
within `FP64_MULTIPLIER` times eager's own error plus atol). A node is *locally wrong* when the
same rule fails against its op re-run eagerly (and in float64) on the COMPILED values of its
inputs: that separates an op that computes wrongly from error it only inherits.

Verdicts (VERDICTS): `culprit` (the first node that diverges and is locally wrong, or that
*flips*: its inputs are all within tolerance and it computes right from them, yet its error is
FLIP_GAIN times theirs in tolerance units, or any error at all in a bool/integer result, as a
comparison, mask or rounding boundary crossed by a tiny difference gives; its source line, FX
node and kernel, and for a flip the node where the difference starts), `drift` (nodes diverge,
no op is locally wrong and none flips: error grew over many ops; the per-node error curve is
the evidence), `fused` (the original graph's outputs
diverge though no realized node does: the bug needs fusion; `tdbg bisect` narrows it),
`outputs_differ` / `outputs_match` (only outputs observable), `ok`. Relative error is
max |x - r| / max(|r|, atol) over elements (no blow-up near zero). Nothing here prints.
"""
from __future__ import annotations

import operator
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.fx
from torch.fx.node import map_arg

from tdbg.compiler.torch_compat import pytree
from tdbg.minifier.diagnose.accuracy import TOLERANCES, abs_diff, reference_excuses
from tdbg.minifier.diagnose.same_draws import draws_random

VERDICTS = {
    "ok": "every compared node and output is within tolerance",
    "culprit": "one op turns inputs within tolerance into a wrong value: it computes wrongly, or its result "
               "flips (a comparison, mask, rounding or clamp boundary crossed by a tiny input difference)",
    "drift": "error grows over many ops; no single op is the culprit",
    "fused": "the graph's outputs diverge only when nodes are fused; no realized node diverges",
    "outputs_differ": "the outputs diverge; only outputs were observable with this backend",
    "outputs_match": "the outputs match; only outputs were observable with this backend",
}
DIVERGED = ("culprit", "drift", "fused", "outputs_differ")
DEFAULT_TOLERANCE = (1e-5, 1e-5)   # (rtol, atol) of a float dtype TOLERANCES does not list
# An op that computes right from its compiled inputs but whose error, in units of its dtype's
# tolerance, is this many times its worst input's (or any error at all in a bool/integer
# result: those have no tolerance) turned a difference within tolerance into a wrong value by
# itself: a flip at a boundary, never drift. Drift adds a little per op (gain near 1).
FLIP_GAIN = 10.0


@dataclass
class NodeError:
    """One compared value: a node of the realized graph, or an output of the original graph."""
    index: int                  # position among the compared values (graph order)
    name: str                   # FX node name (outputs: the node that produces them)
    op: str
    dtype: str
    shape: list
    abs_ref: Optional[float]    # compiled vs float64 reference
    rel_ref: Optional[float]
    abs_eager: float            # compiled vs eager (same dtype)
    rel_eager: float
    eager_abs_ref: Optional[float]   # eager's own error vs the reference
    diverges: bool
    local_wrong: Optional[bool] = None   # None: not checked (outputs, unobservable inputs)
    flips: Optional[bool] = None   # right on its compiled inputs, which are within tolerance, yet wrong
    origin: Optional[str] = None   # a flip's: the first node feeding it whose compiled value differs at all
    source: Optional[str] = None
    kernel: Optional[str] = None
    path: Optional[str] = None  # outputs only: out[i]
    mismatch: Optional[str] = None   # the compiled value is not comparable: another dtype or shape

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GraphComparison:
    name: str
    kind: str
    backend: str
    mode: str                   # "nodes" (every node realized) or "outputs" (only outputs observable)
    verdict: str                # a VERDICTS key
    message: str
    nodes: list = field(default_factory=list)      # NodeError per compared node, graph order
    outputs: list = field(default_factory=list)    # NodeError per output of the original compiled graph
    first_divergence: Optional[NodeError] = None
    culprit: Optional[NodeError] = None
    drift_ops: Optional[int] = None
    notes: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        return self.verdict in DIVERGED

    def curve(self) -> list:
        """[(node name, relative error vs float64 (vs eager when no reference))] in graph order."""
        return [(n.name, n.rel_ref if n.rel_ref is not None else n.rel_eager) for n in self.nodes]

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("name", "kind", "backend", "mode", "verdict", "message", "drift_ops",
                                          "notes", "seconds")}
        d["diverged"] = self.diverged
        d["nodes"] = [n.to_dict() for n in self.nodes]
        d["outputs"] = [n.to_dict() for n in self.outputs]
        d["first_divergence"] = self.first_divergence.to_dict() if self.first_divergence else None
        d["culprit"] = self.culprit.to_dict() if self.culprit else None
        return d


class CompareError(ValueError):
    """The graph cannot be compared (e.g. a backend with no per-graph compiler for this graph)."""


# -- compiling one graph with a backend ---------------------------------------------------------
def _tdbg_compiler(backend, config, name, kind):
    from tdbg.compiler import compile_aten
    return lambda gm, inputs: compile_aten(gm, inputs, config, graph_name=name, kind=kind)


def _inductor_compiler(backend, config, name, kind):
    def compile_one(gm, inputs):
        from tdbg.minifier.runs.aot_capture import unboxed
        from tdbg.minifier.runs.inductor_hooks import compile_fx_inner
        return unboxed(compile_fx_inner(gm, inputs, is_backward=kind == "backward", is_inference=kind == "inference"))
    return compile_one


def _aot_autograd_compiler(backend, config, name, kind):
    from tdbg.minifier.runs.aot_capture import unboxed
    kwargs = getattr(backend, "kwargs", {})
    key = {"forward": "fw_compiler", "backward": "bw_compiler", "inference": "inference_compiler"}.get(kind)
    compiler = kwargs.get(key) or kwargs["fw_compiler"]
    return lambda gm, inputs: unboxed(compiler(gm, inputs))


# aot_capture family -> its per-graph (aten) compiler: these backends can compile the realized graph
ATEN_COMPILERS = {"tdbg": _tdbg_compiler, "torch:inductor": _inductor_compiler,
                  "aot_autograd": _aot_autograd_compiler}


@dataclass(frozen=True)
class Replay:
    """Compile as a saved run did: a saved graph's meta.json "replay" spec (the
    repro_templates/runtime.py format: backend, config differences, after, aot family) and the
    folder its backend files are found in."""
    spec: dict
    folder: str

    @property
    def label(self) -> str:
        b = self.spec.get("backend") or {}
        return str(b.get("name") or b.get("attr") or b.get("repr") or "the saved backend")


def graph_compiler(backend: Any, *, config=None, name: str = "graph", kind: str = "inference",
                   eager_draws: bool = False) -> tuple:
    """(label, compile(gm, inputs) -> callable(*args), realizes) for `backend`: a backend name
    (backends.resolve), a resolved Backend, a `Replay`, or a per-graph aten compiler
    callable(gm, inputs). `realizes` is True when the compiler compiles aten graphs (then the
    realized-nodes trick works); a graph of kind "dynamo" and a backend with no AOT stage tdbg
    can reach are compiled by the Dynamo backend itself (only outputs are observable).
    `eager_draws`: random ops draw eager's numbers (tdbg's and Inductor's fallback_random)."""
    from tdbg.minifier.runs import backends
    from tdbg.minifier.runs.aot_capture import family_of, unboxed
    if eager_draws:
        from tdbg.compiler import config as tconfig
        config = (config or tconfig.current()).replace(fallback_random=True)
    if isinstance(backend, Replay):
        from tdbg.repro_templates import runtime
        spec = dict(backend.spec, aot=dict(backend.spec.get("aot") or {}, graph=kind))
        if eager_draws:
            spec["config"] = dict(spec.get("config") or {}, fallback_random=True)
        realizes = kind != "dynamo" and spec.get("after", "aot") == "aot"
        # a Dynamo-level backend's result is called as Dynamo calls it: positional args (an
        # aot_autograd result carries a stale `_boxed_call`, see instrument.call_compiled)
        wrap = unboxed if spec.get("after", "aot") == "aot" else (lambda compiled: compiled)
        return backend.label, (lambda gm, inputs: wrap(runtime.compile_graph(gm, inputs, spec, backend.folder))), \
            realizes
    if callable(backend) and not isinstance(backend, backends.Backend):
        return getattr(backend, "__name__", "callable"), (lambda gm, inputs: unboxed(backend(gm, inputs))), True
    resolved = backends.resolve(backend, config) if isinstance(backend, str) else backend
    family = family_of(resolved)
    if kind != "dynamo" and family in ATEN_COMPILERS:
        fn = getattr(resolved, "compiler_fn", resolved)
        compile_one, realizes = ATEN_COMPILERS[family](fn, config, name, kind), True
    else:
        compile_one, realizes = (lambda gm, inputs: resolved.compiler_fn(gm, inputs)), False
    if eager_draws and family == "torch:inductor":
        compile_one = _with_inductor_fallback_random(compile_one)
    return resolved.name, compile_one, realizes


def _with_inductor_fallback_random(compile_one):
    """`compile_one` with Inductor's random ops drawing eager's numbers (decided while compiling)."""
    def compile_eager_draws(gm, inputs):
        from tdbg.minifier.runs.inductor_hooks import inductor_config
        with inductor_config.patch(fallback_random=True):
            return compile_one(gm, inputs)
    return compile_eager_draws


# -- running the graph node by node -------------------------------------------------------------
def _fresh(values):
    return [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in values]


def _to64(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.detach().to(torch.float64)
    if isinstance(value, torch.dtype) and value.is_floating_point:
        return torch.float64
    if isinstance(value, (list, tuple)):
        return type(value)(_to64(v) for v in value)
    if isinstance(value, dict):
        return {k: _to64(v) for k, v in value.items()}
    return value


def _attr(gm, target):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def run_nodes(gm, inputs, *, fp64: bool = False) -> tuple:
    """({node: value} for every node, graph outputs) running `gm` op by op under no_grad; with
    `fp64` every floating tensor and floating dtype argument is float64 (the reference)."""
    env: dict = {}
    args = iter(inputs)
    out = None
    lift = _to64 if fp64 else (lambda v: v)
    # a Dynamo graph's submodules (call_module) hold their own parameters: float64 copies for the reference
    root = _Float64Modules(gm) if fp64 else gm
    with torch.no_grad():
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = lift(next(args))
            elif node.op == "get_attr":
                env[node] = lift(_attr(gm, node.target))
            elif node.op in _CALLS:   # aten graphs hold call_function only; Dynamo graphs all three
                a, kw = map_arg((node.args, node.kwargs), env.__getitem__)
                env[node] = _CALLS[node.op](root, node.target, lift(a), lift(kw))
            elif node.op == "output":
                out = map_arg(node.args[0], env.__getitem__)
            else:
                raise CompareError(f"node {node.name}: op {node.op!r} cannot be run node by node")
    return env, out


class _Float64Modules:
    """`get_submodule` of a graph module, each submodule copied once in float64."""

    def __init__(self, gm):
        self.gm, self.copies = gm, {}

    def get_submodule(self, target: str):
        if target not in self.copies:
            import copy
            self.copies[target] = copy.deepcopy(self.gm.get_submodule(target)).to(torch.float64)
        return self.copies[target]


# FX node op -> how run_nodes calls it: (graph module, target, args, kwargs) -> value
_CALLS = {
    "call_function": lambda gm, target, a, kw: target(*a, **kw),
    "call_method": lambda gm, target, a, kw: getattr(a[0], target)(*a[1:], **kw),
    "call_module": lambda gm, target, a, kw: gm.get_submodule(target)(*a, **kw),
}


def _is_mutating(node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


def observed_nodes(gm, eager_env: dict, include_random: bool = False) -> tuple:
    """(nodes compared, count of skipped random nodes and their users): call_function nodes with a
    tensor value, except mutating ops (their value is an input's storage) and, unless
    `include_random` (the compiled graph draws eager's numbers), anything computed from a random
    op (the compiled RNG stream need not match eager's)."""
    tainted = random_tainted(gm) if not include_random else set()
    chosen = [n for n in gm.graph.nodes if n.op == "call_function" and n not in tainted
              and isinstance(eager_env.get(n), torch.Tensor) and not _is_mutating(n)]
    return chosen, len(tainted)


def random_tainted(gm) -> set:
    """The call_function nodes that draw random numbers or are computed from one that does."""
    tainted: set = set()
    for node in gm.graph.nodes:
        if node.op == "call_function" and (draws_random(node) or any(a in tainted for a in node.all_input_nodes)):
            tainted.add(node)
    return tainted


def realized_graph(gm, nodes) -> torch.fx.GraphModule:
    """A copy of `gm` returning (its own outputs..., every node of `nodes`): compiled once, every
    compared node is a buffer the compiler must write."""
    graph = torch.fx.Graph()
    remap: dict = {}
    out = graph.graph_copy(gm.graph, remap)
    flat, _ = pytree.tree_flatten(out)
    graph.output(tuple(flat) + tuple(remap[n] for n in nodes))
    return torch.fx.GraphModule(gm, graph)


def _ensure_meta(gm, inputs):
    """node.meta["val"] (fake tensors) on every node, as compilers of aten graphs expect."""
    if all("val" in n.meta for n in gm.graph.nodes if n.op in ("placeholder", "call_function")):
        return
    from tdbg.compiler.torch_compat import FakeTensorMode, FakeTensorProp
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*[mode.from_tensor(x) if isinstance(x, torch.Tensor) else x
                                         for x in _fresh(inputs)])


# -- errors -------------------------------------------------------------------------------------
def _tolerance(dtype, tolerance):
    if tolerance is not None:
        return tolerance, tolerance
    return TOLERANCES.get(dtype, DEFAULT_TOLERANCE)


def _looser(a, b):
    """The floating dtype of the two with the larger tolerance (None: no rounding)."""
    if a is None or b is None:
        return a if b is None else b
    return a if _tolerance(a, None)[0] >= _tolerance(b, None)[0] else b


def rounding_dtypes(gm, eager_env: dict) -> dict:
    """node -> the least precise floating dtype eager rounded to on the way to the node's value
    (its own dtype, or an ancestor op's). A float32 value computed from a bfloat16 intermediate
    carries bfloat16's error, and a compiler that keeps that intermediate in float32 (Inductor does,
    as eager's fused CPU kernels do) differs from eager by it: such a value is judged at bfloat16's
    tolerance. Graph inputs are exact, so they start no rounding; a constant 'x.float()' of a
    bfloat16 input is still judged at float32's."""
    out: dict = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        own = eager_env.get(node)
        dtype = own.dtype if isinstance(own, torch.Tensor) and own.is_floating_point() else None
        for a in node.all_input_nodes:
            dtype = _looser(dtype, out.get(a))
        out[node] = dtype
    return out


def _max_errors(x64, r64, atol) -> tuple:
    """(max |x - r|, max |x - r| / max(|r|, atol)) of two float64 tensors; a NaN where r has none
    is inf. In place on fresh temporaries: five passes over the data in the common, NaN-free case."""
    if x64.numel() == 0:
        return 0.0, 0.0
    d = torch.sub(x64, r64).abs_()
    worst = float(d.max())            # max propagates NaN: the NaN handling only when one is there
    if worst != worst:                # equal infinities (inf - inf) count 0, a lone NaN inf
        d = abs_diff(x64, r64)
        scale = r64.abs().nan_to_num_(nan=0.0).clamp_min_(atol)
        worst = float(d.max())
    else:
        scale = r64.abs().clamp_min_(atol)
    return worst, float(d.div_(scale).max())


def judge(compiled, eager, ref, *, tolerance=None, rounded=None) -> dict:
    """Errors of one compiled value and whether it diverges (accuracy.py's rule, for one tensor),
    at the tolerance of the looser of its dtype and `rounded` (rounding_dtypes)."""
    if compiled.shape != eager.shape or compiled.dtype != eager.dtype:
        what = "dtype" if compiled.shape == eager.shape else "shape"
        return dict(abs_ref=None, rel_ref=None, abs_eager=float("inf"), rel_eager=float("inf"),
                    eager_abs_ref=None, diverges=True,
                    mismatch=f"{what} differs: expected {tuple(eager.shape)} {eager.dtype}, got "
                             f"{tuple(compiled.shape)} {compiled.dtype}")
    if not eager.is_floating_point():
        equal = torch.equal(compiled, eager)
        d = 0.0 if equal else float((compiled.double() - eager.double()).abs().max())
        return dict(abs_ref=None, rel_ref=None, abs_eager=d, rel_eager=d, eager_abs_ref=None, diverges=not equal)
    precision = _looser(eager.dtype, rounded)
    rtol, atol = _tolerance(precision, tolerance)
    c64, e64 = compiled.detach().double(), eager.detach().double()
    abs_e, rel_e = _max_errors(c64, e64, atol)
    row = dict(abs_ref=None, rel_ref=None, abs_eager=abs_e, rel_eager=rel_e, eager_abs_ref=None, diverges=False)
    close = abs_e == 0.0 or torch.allclose(compiled, eager, rtol=rtol, atol=atol, equal_nan=True)
    if isinstance(ref, torch.Tensor) and ref.shape == eager.shape:
        r64 = ref.detach().double()
        row["abs_ref"], row["rel_ref"] = _max_errors(c64, r64, atol)
        row["eager_abs_ref"] = _max_errors(e64, r64, atol)[0] if abs_e else row["abs_ref"]
        if close:
            return row
        # the rule of accuracy.compare, so compare and run judge a value alike
        row["diverges"] = not reference_excuses(eager, compiled, r64, rtol, atol, dtype=precision)
        return row
    row["diverges"] = not close
    return row


def _local_wrong(node, compiled_value, comp_env, tolerance) -> Optional[bool]:
    """Is `node`'s op wrong on its own: its compiled value against the op re-run on the compiled
    values of its inputs (eagerly in the same dtype, and in float64)?"""
    a, kw = map_arg((node.args, node.kwargs), comp_env.__getitem__)
    try:
        with torch.no_grad():
            local = node.target(*a, **kw)
            local_ref = node.target(*_to64(a), **_to64(kw))
    except Exception:
        return None
    if not isinstance(local, torch.Tensor):
        return None
    return judge(compiled_value, local, local_ref if isinstance(local_ref, torch.Tensor) else None,
                 tolerance=tolerance)["diverges"]


# -- sources and kernels ------------------------------------------------------------------------
def node_sources(gm) -> dict:
    """FX node name -> its user line ('file:line in fn: code'), for nodes that have one."""
    from tdbg.minifier.diagnose.checks import node_source
    from tdbg.minifier.runs.instrument import is_user_file
    found = {}
    for n in gm.graph.nodes:
        line = node_source(n, is_user_file)
        if line:
            found[n.name] = line
    return found


def kernel_of(compiled) -> Callable[[str], Optional[str]]:
    """FX node name -> the kernel computing it in a tdbg CompiledGraph (the first kernel listing
    it), 'aten fallback' for a node tdbg did not lower, None when the backend names no kernels."""
    kernels = getattr(compiled, "kernel_nodes", None)
    if kernels is None:
        return lambda name: None
    first: dict = {}
    for kernel, names in kernels.items():
        for n in names:
            first.setdefault(n, kernel)
    lowered = set(getattr(compiled, "lowered_nodes", ()))
    return lambda name: first.get(name) or (None if name in lowered else "aten fallback")


def _producer(node):
    """The node that computes `node`'s value: a tuple element's (getitem's) producer, else itself."""
    if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
        return node.args[0]
    return node


def _op_name(node) -> str:
    """'aten.neg' for aten.neg.default (the overload adds nothing a reader needs); 'aten.var_mean[1]'
    for an element of a tuple-valued op."""
    if _producer(node) is not node:
        return f"{_op_name(node.args[0])}[{node.args[1]}]"
    packet = getattr(node.target, "overloadpacket", None)
    return str(packet) if packet is not None else getattr(node.target, "__name__", str(node.target))


# -- the comparison -----------------------------------------------------------------------------
def compare_graph(gm, inputs, backend: Any = "inductor", *, name: str = "graph", kind: str = "inference",
                  config=None, tolerance: Optional[float] = None, sources: Optional[dict] = None) -> GraphComparison:
    """Compare `gm` compiled by `backend` with eager and float64, node by node (module docstring).

    `inputs` are not modified (every run gets fresh copies). `sources` (FX node name -> user line)
    replaces the stack traces on the nodes (saved graphs carry them that way). A compile or run
    failure of the backend propagates (it is not an accuracy verdict)."""
    seconds: dict = {}
    t0 = time.perf_counter()
    notes = []
    sources = dict(sources) if sources is not None else node_sources(gm)
    eager_inputs = _fresh(inputs)      # kept: a graph that writes into its inputs is judged there too
    rng = torch.get_rng_state()        # every run starts here: random ops draw what eager drew
    eager_env, eager_out = run_nodes(gm, eager_inputs)
    draws = not torch.equal(torch.get_rng_state(), rng)
    label, compile_one, realizes = graph_compiler(backend, config=config, name=name, kind=kind, eager_draws=draws)
    try:
        torch.set_rng_state(rng)
        ref_env, ref_out = run_nodes(gm, _fresh(inputs), fp64=True)
    except Exception as e:   # an op without float64 support: judge against eager alone, and say so
        ref_env, ref_out = {}, None
        notes.append(f"no float64 reference ({type(e).__name__}: {(str(e).splitlines() or [''])[0]}); "
                     "errors are judged against eager alone")
    if draws:   # a float64 run draws other numbers: what comes from random ops is judged against eager alone
        ref_env, ref_out = _without_random(gm, ref_env, ref_out)
        notes.append("the graph draws random numbers: each run started from eager's generator state, the "
                     "compiler drawing eager's numbers (fallback_random); values computed from them are "
                     "judged against eager alone")
    seconds["eager_and_reference"] = time.perf_counter() - t0

    if kind != "dynamo" and realizes:
        _ensure_meta(gm, inputs)
    t1 = time.perf_counter()
    # a copy: a backend that edits the graph it is given in place must not change the eager graph
    from tdbg.minifier.diagnose.checks import snapshot
    original = compile_one(snapshot(gm), _fresh(inputs))
    seconds["compile"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    compiled_inputs = _fresh(inputs)
    torch.set_rng_state(rng)
    compiled_out = original(*compiled_inputs)
    seconds["run"] = time.perf_counter() - t1
    kernel = kernel_of(original)
    rounded = rounding_dtypes(gm, eager_env)
    outputs = _compare_outputs(gm, eager_out, ref_out, compiled_out, sources, kernel, tolerance, rounded)
    outputs += _written_inputs(gm, inputs, eager_inputs, compiled_inputs, len(outputs), tolerance)

    nodes: list = []
    if realizes:
        # the run drew eager's numbers (graph_compiler's eager_draws): the nodes computed from
        # them are compared too, against eager alone; a backend drawing its own numbers shows
        # first at its random op, and the message says so (left out, a wrong op after a dropout
        # read as a fusion bug)
        observed, skipped = observed_nodes(gm, eager_env, include_random=draws)
        if skipped:
            notes.append(f"{skipped} node(s) computed from random ops are not compared (the compiled random "
                         "stream need not match eager's)")
        t1 = time.perf_counter()
        try:
            debug_gm = realized_graph(gm, observed)
            debug = compile_one(debug_gm, _fresh(inputs))
            seconds["compile_realized"] = time.perf_counter() - t1
            t1 = time.perf_counter()
            torch.set_rng_state(rng)
            values = list(debug(*_fresh(inputs)))[len(_flat_outputs(gm)):]
            seconds["run_realized"] = time.perf_counter() - t1
        except Exception as e:   # the original graph compiled and ran: its outputs still say something
            realizes = False
            notes.append(f"the realized graph (every node an output) failed with {label} ({type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0]}): only the graph's outputs were compared")
    if realizes:
        if len(values) != len(observed):
            raise CompareError(f"the realized graph returned {len(values)} node values for {len(observed)} nodes")
        t1 = time.perf_counter()
        nodes = _compare_nodes(gm, observed, values, inputs, eager_env, ref_env, sources, kernel,
                               kernel_of(debug), tolerance, rounded)
        seconds["errors"] = time.perf_counter() - t1
    elif not notes or "realized graph" not in notes[-1]:
        notes.append(f"{label} compiles Dynamo-level graphs its own way: only the graph's outputs were observable")
    seconds["total"] = time.perf_counter() - t0
    result = GraphComparison(name, kind, label, "nodes" if realizes else "outputs", "ok", "", nodes, outputs,
                             notes=notes, seconds=seconds)
    _decide(result)
    if result.culprit is not None and any(n.name == result.culprit.name and draws_random(n) for n in gm.graph.nodes):
        result.message += ("; it draws random numbers: the compiled graph's random stream differs from eager's "
                           "(tdbg's compiler and Inductor are told to draw eager's numbers; another backend may "
                           "draw its own, by design)")
    return result


def _without_random(gm, ref_env: dict, ref_out) -> tuple:
    """The float64 reference less every value computed from a random op (random_tainted)."""
    tainted = random_tainted(gm)
    env = {n: v for n, v in ref_env.items() if n not in tainted}
    if ref_out is None:
        return env, None
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    return env, map_arg(out_node.args[0], lambda n: None if n in tainted else env.get(n))


def _flat_outputs(gm) -> list:
    return pytree.tree_flatten(next(n for n in gm.graph.nodes if n.op == "output").args[0])[0]


def _compare_outputs(gm, eager_out, ref_out, compiled_out, sources, kernel, tolerance, rounded) -> list:
    from tdbg.minifier.diagnose.accuracy import flatten
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    producers = [p for _, p in flatten(out_node.args[0])]
    exp, act = flatten(eager_out), flatten(list(compiled_out) if isinstance(compiled_out, tuple) else compiled_out)
    if not isinstance(compiled_out, (list, tuple)):
        act = flatten([compiled_out])
    refs = flatten(ref_out) if ref_out is not None else [(p, None) for p, _ in exp]
    if len(act) != len(exp):
        raise CompareError(f"the compiled graph returned {len(act)} outputs; eager returned {len(exp)}")
    rows = []
    for i, ((path, e), (_, a), (_, r), producer) in enumerate(zip(exp, act, refs, producers)):
        if not isinstance(e, torch.Tensor):
            continue
        node_name = getattr(producer, "name", path)
        row = judge(a, e, r, tolerance=tolerance, rounded=rounded.get(producer))
        rows.append(NodeError(i, node_name, _op_name(producer) if hasattr(producer, "target") else "output",
                              str(e.dtype).replace("torch.", ""), list(e.shape), local_wrong=None,
                              source=sources.get(node_name), kernel=kernel(node_name), path=path, **row))
    return rows


def _written_inputs(gm, inputs, eager_inputs, compiled_inputs, start: int, tolerance) -> list:
    """Rows for the inputs eager or the compiled graph wrote into (path 'input NAME (written)'):
    a mutation is part of what the graph computes, and no output shows it."""
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    rows = []
    for name, x, e, a in zip(names, inputs, eager_inputs, compiled_inputs):
        if not isinstance(x, torch.Tensor) or (torch.equal(e, x) and torch.equal(a, x)):
            continue
        row = judge(a, e, None, tolerance=tolerance)
        rows.append(NodeError(start + len(rows), name, "input", str(e.dtype).replace("torch.", ""), list(e.shape),
                              path=f"input {name} (written)", **row))
    return rows


def _compare_nodes(gm, observed, values, inputs, eager_env, ref_env, sources, kernel, debug_kernel,
                   tolerance, rounded) -> list:
    comp_env = dict(eager_env)          # unobserved nodes (scalars, mutations) keep their eager value
    for node, inp in zip((n for n in gm.graph.nodes if n.op == "placeholder"), _fresh(inputs)):
        comp_env[node] = inp
    rows = []
    for i, (node, value) in enumerate(zip(observed, values)):
        comp_env[node] = value
    for i, (node, value) in enumerate(zip(observed, values)):
        eager = eager_env[node]
        row = judge(value, eager, ref_env.get(node), tolerance=tolerance, rounded=rounded.get(node))
        # the local check costs two op calls: only where the node diverges (or for its culprit role)
        local = _local_wrong(node, value, comp_env, tolerance) if row["diverges"] else None
        rows.append(NodeError(i, node.name, _op_name(node), str(eager.dtype).replace("torch.", ""),
                              list(eager.shape), local_wrong=local, source=sources.get(node.name),
                              kernel=kernel(_producer(node).name) or debug_kernel(_producer(node).name), **row))
    _mark_flips(observed, rows, comp_env, eager_env, tolerance, rounded)
    return rows


def tolerance_units(compiled, eager, tolerance=None, rounded=None) -> float:
    """max |compiled - eager| / (atol + rtol |eager|): the error in units of the dtype's tolerance
    (1 is allclose's edge); a bool/integer tensor: 0 when equal, inf otherwise (no tolerance)."""
    if compiled.shape != eager.shape or compiled.dtype != eager.dtype:
        return float("inf")
    if not eager.is_floating_point():
        return 0.0 if torch.equal(compiled, eager) else float("inf")
    if eager.numel() == 0:
        return 0.0
    rtol, atol = _tolerance(_looser(eager.dtype, rounded), tolerance)
    e64 = eager.detach().double()
    d = torch.sub(compiled.detach().double(), e64).abs_().nan_to_num_(nan=float("inf"))
    return float(d.div_(e64.abs().nan_to_num_(nan=0.0).mul_(rtol).add_(atol)).max())


def flips(out_units: float, input_units: list) -> bool:
    """The flip rule (FLIP_GAIN): an op right on its inputs, all within tolerance, whose own error
    is FLIP_GAIN times the worst input's in tolerance units (inf units: a bool/integer result
    that changed)."""
    worst = max(input_units, default=0.0)
    return worst <= 1.0 and out_units > 1.0 and out_units >= FLIP_GAIN * worst


def _mark_flips(observed, rows, comp_env, eager_env, tolerance, rounded) -> None:
    """Set `flips` (and a flip's `origin`) on each diverging row whose op was right on its own."""
    row_of = {node: row for node, row in zip(observed, rows)}
    for node, row in row_of.items():
        if not row.diverges or row.local_wrong is not False:
            continue
        inputs = [a for a in node.all_input_nodes if isinstance(comp_env.get(a), torch.Tensor)]
        if any(row_of[a].diverges for a in inputs if a in row_of):
            row.flips = False    # it inherits a divergence: the culprit (or drift) is upstream
            continue
        units = [tolerance_units(comp_env[a], eager_env[a], tolerance, rounded.get(a)) for a in inputs
                 if isinstance(eager_env.get(a), torch.Tensor)]
        row.flips = flips(tolerance_units(comp_env[node], eager_env[node], tolerance, rounded.get(node)), units)
        if row.flips:
            row.origin = _origin(node, row_of)


def _origin(node, row_of: dict) -> Optional[str]:
    """The first compared node (graph order) among `node`'s ancestors whose compiled value
    differs from eager at all: where the difference a flip turns on starts."""
    seen, todo = set(), list(node.all_input_nodes)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += n.all_input_nodes
    differing = [row_of[n] for n in seen if n in row_of and row_of[n].abs_eager > 0]
    return min(differing, key=lambda r: r.index).name if differing else None


def _decide(c: GraphComparison) -> None:
    """Verdict, first divergence, culprit and drift length from the rows."""
    out_bad = next((o for o in c.outputs if o.diverges), None)
    if c.mode == "outputs":
        c.first_divergence = out_bad
        c.verdict = "outputs_differ" if out_bad else "outputs_match"
        c.message = (f"{out_bad.path} diverges ({_err_text(out_bad)}); " if out_bad else "") + VERDICTS[c.verdict]
        return
    c.first_divergence = next((n for n in c.nodes if n.diverges), None)
    # drift needs every diverging op shown right on its own inputs; an op that could not be re-run
    # alone (local_wrong None) is blamed rather than hidden in a drift
    # a flip (right on inputs within tolerance, yet wrong) is a culprit too: one op did it
    c.culprit = next((n for n in c.nodes if n.diverges and (n.local_wrong is not False or n.flips)), None)
    if c.culprit is not None:
        c.verdict = "culprit"
        c.message = f"first diverging op: {c.culprit.name} ({c.culprit.op}), {_err_text(c.culprit)}"
        if c.culprit.flips:
            c.message += (f"; its result flips: it computes right from its compiled inputs, which are within "
                          f"tolerance of eager's, yet lands on the other side of a boundary")
            origin = next((n for n in c.nodes if n.name == c.culprit.origin), None)
            if origin is not None:
                c.message += (f"; the input difference starts at {origin.name} ({origin.op}, node {origin.index}, "
                              f"{_err_text(origin)})")
        if c.culprit.local_wrong is None:
            c.notes.append(f"{c.culprit.name}'s op could not be re-run alone on the compiled inputs, so it is "
                           "blamed without that check (it may only inherit its inputs' error)")
        if c.first_divergence is not c.culprit:
            c.message += (f"; error had already drifted past tolerance at {c.first_divergence.name} "
                          f"(node {c.first_divergence.index}) without a wrong op")
        return
    if c.first_divergence is not None:
        c.verdict = "drift"
        start = next((n for n in c.nodes if _grows(n)), c.first_divergence)
        c.drift_ops = c.first_divergence.index - start.index + 1
        c.message = (f"error grows over {c.drift_ops} ops; no single op is the culprit (tolerance first "
                     f"exceeded at {c.first_divergence.name}, node {c.first_divergence.index} of {len(c.nodes)}, "
                     f"{_err_text(c.first_divergence)})")
        return
    if out_bad is not None:
        c.verdict = "fused"
        c.first_divergence = out_bad
        how = ("the compiled graph writes the input wrongly, or only fused code computes it wrong"
               if out_bad.path and out_bad.path.startswith("input ") else
               "the divergence appears only when nodes are fused (a fusion or scheduling bug)")
        c.message = (f"{out_bad.path} ({out_bad.name}) diverges ({_err_text(out_bad)}) but no realized node does: "
                     f"{how}; `tdbg bisect` finds the fusion")
        return
    c.verdict = "ok"
    c.message = f"{len(c.nodes)} nodes and {len(c.outputs)} outputs within tolerance"


def _grows(n: NodeError) -> bool:
    """The compiled value is already further from float64 than eager is (where drift starts)."""
    if n.abs_ref is None or n.eager_abs_ref is None:
        return n.abs_eager > 0
    return n.abs_ref > n.eager_abs_ref


def _err_text(n: NodeError) -> str:
    if n.mismatch:
        return n.mismatch
    if n.abs_ref is not None:
        return f"max abs error {n.abs_ref:.3g} vs float64 (eager's own {n.eager_abs_ref:.3g}), {n.abs_eager:.3g} vs eager"
    return f"max abs error {n.abs_eager:.3g} vs eager"
