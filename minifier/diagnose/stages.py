"""Which stage first changes what the user's function computes: the Dynamo graph, the aten graph
AOTAutograd makes of it, or the compiled graph.

`compare_stages(gm, inputs, backend)` takes one Dynamo graph (as Dynamo handed it to the
backend, with the real inputs of its first call) and runs it three ways on copies of those
inputs, under no_grad:

- the Dynamo graph eagerly: the user's function, the truth;
- the backend's own AOT stage (aot_capture: AOTAutograd with the backend's decompositions and
  partitioner) with every aten graph run eagerly instead of compiled: the aten graph's values;
- the backend itself (the compiled graph).

Each run's values are the graph's outputs AND every tensor input after the call (an input the
graph writes into is part of what the user sees: a bug in functionalizing a mutation or in
regenerating a returned view shows there), and every tensor it reads through get_attr after the
call (`attribute TARGET`: a compiled `optimizer.step()` reads and writes its parameters so); each
run starts from the program's values of those (kept_state) and leaves them as they were. Each value is judged against the eager one with
divergence.judge (dtype tolerance, float64 reference). Verdicts (STAGE_VERDICTS): `aot` (the
aten graph already differs: AOTAutograd is at fault, whatever the compiler does; the first
Dynamo node whose graph prefix AOTAutograd gets wrong is the culprit, with its user line),
`compiled` (the aten graph matches, the compiled graph does not), `ok`. A graph that draws
random numbers is not judged (three runs need not draw the same stream). Nothing here prints.

`StageRecorder` does this inside a script's run (runner.RunRequest.stage_check): at each Dynamo
graph's first call, on copies of the real inputs, with the graph as Dynamo made it (its nodes
keep their user lines); the results go to a JSON file that `tdbg compare` reads.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch
import torch.fx

from tdbg.compiler.torch_compat import pytree
from tdbg.minifier.diagnose.divergence import judge, run_nodes
from tdbg.minifier.diagnose.kept_state import KeptState, fetch_attr

STAGE_VERDICTS = {
    "ok": "the aten graph and the compiled graph compute what the Dynamo graph computes (outputs and "
          "inputs written)",
    "aot": "the aten graph AOTAutograd made already differs from the Dynamo graph run eagerly: AOTAutograd "
           "(tracing to aten, functionalization, decompositions) is at fault, before any compiler",
    "compiled": "the aten graph matches the Dynamo graph but the compiled graph does not: the compiler (or "
                "what runs around its code) is at fault",
    "unjudged": "not judged",
}
# Dynamo backends that ARE AOTAutograd with each aten graph run eagerly: their result is the aten
# graph's (a backend with an AOT stage tdbg can hook gets that stage from aot_capture instead)
AOT_EAGER = ("torch:aot_eager", "torch:aot_eager_decomp_partition")
# who made the aten graph, by backend: Inductor's AOT stage runs its own pre-grad and joint-graph
# passes (pattern matching, constant folding) before the aten graph exists
AOT_BLAME = {
    None: "AOTAutograd is at fault",
    "torch:inductor": ("AOTAutograd or Inductor's passes that run inside its AOT stage (pre-grad, joint-graph: "
                       "pattern matching, constant folding) are at fault; `tdbg bisect --backend torch:inductor` "
                       "tells them apart, and `tdbg minify --after dynamo` captures the graph before them"),
}
MAX_PROBES = 14     # AOT traces spent finding the first Dynamo node AOTAutograd gets wrong


@dataclass
class StageValue:
    """One value the user sees: an output (out[i]) or an input after the call (input NAME)."""
    path: str
    dtype: str
    shape: list
    aot: Optional[dict]        # judge() of the aten graph's value against eager
    compiled: Optional[dict]   # judge() of the compiled value against eager


@dataclass
class StageComparison:
    name: str
    backend: str
    verdict: str               # a STAGE_VERDICTS key
    message: str
    values: list = field(default_factory=list)
    culprit: Optional[dict] = None    # {"name", "op", "source", "index"} of a Dynamo graph node
    notes: list = field(default_factory=list)

    @property
    def diverged(self) -> bool:
        return self.verdict in ("aot", "compiled")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["diverged"] = self.diverged
        return d


def _fresh(values):
    return [v.detach().clone() if isinstance(v, torch.Tensor) else v for v in values]


def _seen(fn, inputs, state: KeptState, holder) -> list:
    """[(path, value)] of what a call shows: its flat outputs, every tensor input after it, then
    copies of the tensors `state` keeps as `holder` (the graph module the call ran, or a copy of
    it) holds them after it. The call starts from `state`'s saved values and leaves the
    program's as they were."""
    args = _fresh(inputs)
    with torch.no_grad(), state.from_saved():
        out = fn(*args)
        attributes = [(f"attribute {t}", fetch_attr(holder, t).detach().clone()) for t in state.tensors]
    flat = pytree.tree_leaves(out if isinstance(out, (list, tuple)) else [out])
    return [(f"out[{i}]", v) for i, v in enumerate(flat)] + [(f"input {i}", a) for i, a in enumerate(args)] \
        + attributes


def _seen64(gm, inputs, state: KeptState) -> list:
    """`_seen` of the float64 reference, op by op (divergence.run_nodes: every op's floating
    arguments in float64, so tensors the graph itself creates in float32 are lifted too)."""
    with state.from_saved():
        env, out = run_nodes(gm, _fresh(inputs), fp64=True)
    flat = pytree.tree_leaves(out if isinstance(out, (list, tuple)) else [out])
    placeholders = [env[n] for n in gm.graph.nodes if n.op == "placeholder"]
    lifted = {n.target: env[n] for n in gm.graph.nodes if n.op == "get_attr"}
    return [(f"out[{i}]", v) for i, v in enumerate(flat)] + [(f"input {i}", a) for i, a in enumerate(placeholders)] \
        + [(f"attribute {t}", lifted[t]) for t in state.tensors]


def _names(gm) -> list:
    return [n.name for n in gm.graph.nodes if n.op == "placeholder"]


def _eager_hook(gm, example_inputs, kind, compile_one):
    return lambda *args: gm(*args)


def _aot_eager(backend, config):
    """The backend's own AOT stage with each aten graph run as it is (a Dynamo backend), or None
    when tdbg cannot reach the backend's AOT stage."""
    from tdbg.minifier.runs.aot_capture import capture, family_of
    if backend.name in AOT_EAGER:
        return backend.compiler_fn
    return capture(backend, _eager_hook, config)[1] if family_of(backend) else None


def _run_backend(dynamo_backend, gm, inputs, config, state: KeptState) -> list:
    from tdbg.compiler import config as tconfig
    with tconfig.use(config):
        with state.from_saved():   # the copy starts from the program's values
            mine = copy.deepcopy(gm)
        # called as Dynamo calls a backend's result: positional args (an aot_autograd result
        # carries a stale `_boxed_call`, see instrument.call_compiled)
        compiled = dynamo_backend(mine, _fresh(inputs))
        return _seen(compiled, inputs, state, mine)


def _differs(mine: list, eager: list, ref: Optional[list], tolerance) -> list:
    """judge() per value (None where it is not a tensor)."""
    rows = []
    for i, ((_, a), (_, e)) in enumerate(zip(mine, eager)):
        r = ref[i][1] if ref is not None else None
        ok = isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor)
        rows.append(judge(a.detach(), e.detach(), r if isinstance(r, torch.Tensor) else None, tolerance=tolerance)
                    if ok else None)
    return rows


def compare_stages(gm, inputs, backend: str, *, config=None, tolerance: Optional[float] = None,
                   sources: Optional[dict] = None, name: str = "graph") -> StageComparison:
    """Judge one Dynamo graph's aten graph and compiled graph against the graph run eagerly
    (module docstring). `backend` is a backend name (backends.resolve) with an AOT stage tdbg can
    hook; `config` the tdbg Config it ran with. Failures of the backend propagate."""
    from tdbg.compiler import config as tconfig
    from tdbg.minifier.runs.backends import resolve
    from tdbg.minifier.runs.names import backend_label
    config = config or tconfig.current()
    resolved = resolve(backend, config) if isinstance(backend, str) else backend
    backend = resolved.name
    sources = sources or {}
    rng = torch.get_rng_state()
    state = KeptState(gm)   # get_attr tensors (an optimizer's state): each run starts from the program's
    eager = _seen(gm, inputs, state, gm)
    if not torch.equal(rng, torch.get_rng_state()):
        torch.set_rng_state(rng)
        return StageComparison(name, backend, "unjudged", "the graph draws random numbers: its stages are not "
                               "judged against each other (each run would draw other numbers)")
    names = _names(gm)
    eager = [(p if not p.startswith("input ") else f"input {names[int(p.split()[1])]}", v) for p, v in eager]
    try:
        ref = _seen64(gm, inputs, state)
    except Exception:   # an op without float64 support: judged against eager alone
        ref = None
    aot_eager = _aot_eager(resolved, config)
    notes = [] if aot_eager else [f"{backend_label(backend)} has no AOT stage tdbg can reach: the aten graph is not judged"]
    aot = _run_backend(aot_eager, gm, inputs, config, state) if aot_eager else None
    compiled = _run_backend(resolved.compiler_fn, gm, inputs, config, state)
    if len(aot or eager) != len(eager) or len(compiled) != len(eager):
        raise ValueError(f"the stages returned {len(aot or eager)} and {len(compiled)} values; eager {len(eager)}")
    aot_rows = _differs(aot, eager, ref, tolerance) if aot else [None] * len(eager)
    comp_rows = _differs(compiled, eager, ref, tolerance)
    values = [StageValue(p, str(e.dtype).replace("torch.", ""), list(e.shape), a, c)
              for (p, e), a, c in zip(eager, aot_rows, comp_rows) if isinstance(e, torch.Tensor)]
    result = StageComparison(name, backend, "ok", "", values, notes=notes)
    bad_aot = [v for v in values if v.aot and v.aot["diverges"]]
    bad_comp = [v for v in values if v.compiled and v.compiled["diverges"]]
    if bad_aot:
        result.verdict = "aot"
        result.culprit = _first_wrong_prefix(gm, inputs, aot_eager, config, tolerance, sources, state)
        where = (f"; the first Dynamo node whose graph prefix AOTAutograd gets wrong is {result.culprit['name']} "
                 f"({result.culprit['op']})" if result.culprit else "")
        result.message = (f"{_listing(bad_aot, 'aot')} differ(s) between the aten graph (AOTAutograd, run eagerly) "
                          f"and the Dynamo graph run eagerly{where}; the compiled graph "
                          + ("differs too" if bad_comp else "matches eager") + ": " + AOT_BLAME.get(backend, AOT_BLAME[None]))
    elif bad_comp:
        result.verdict = "compiled"
        result.message = (f"{_listing(bad_comp, 'compiled')} differ(s) from the Dynamo graph run eagerly in the "
                          "compiled graph" + (" while the aten graph matches it: the compiler is at fault" if aot
                                              else f" (inside {backend_label(backend)}, which tdbg cannot look into)"))
    else:
        result.message = f"{len(values)} value(s) (outputs and inputs after the call) match at every stage"
    return result


def _listing(rows: list, key: str) -> str:
    return ", ".join(f"{v.path} ({v.__dict__[key].get('mismatch') or 'max abs error %.3g' % v.__dict__[key]['abs_eager']})"
                     for v in rows[:4]) + \
        (f" and {len(rows) - 4} more" if len(rows) > 4 else "")


def _prefix(gm, upto) -> torch.fx.GraphModule:
    """`gm` cut after node `upto`, returning its value (inputs written so far show after the call)."""
    graph = torch.fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        env[node] = graph.node_copy(node, env.__getitem__)
        if node is upto:
            break
    graph.output((env[upto],))
    return torch.fx.GraphModule(gm, graph)


def _first_wrong_prefix(gm, inputs, aot_eager, config, tolerance, sources, state: KeptState) -> Optional[dict]:
    """The first call node k such that the graph cut after k is right through AOTAutograd up to
    k - 1 and wrong at k (binary search over prefixes, at most MAX_PROBES traces), as a dict."""
    from tdbg.minifier.runs.instrument import op_name
    calls = [n for n in gm.graph.nodes if n.op.startswith("call_")]

    def wrong(k: int) -> bool:
        part = _prefix(gm, calls[k])
        try:
            eager = _seen(part, inputs, state, part)
            mine = _run_backend(aot_eager, part, inputs, config, state)
        except Exception:   # a prefix AOTAutograd cannot trace: not evidence either way
            return False
        return len(mine) != len(eager) or any(r and r["diverges"] for r in _differs(mine, eager, None, tolerance))
    lo, hi, probes = 0, len(calls) - 1, 0
    if not calls or not wrong(hi):
        return None
    while lo < hi and probes < MAX_PROBES:
        mid = (lo + hi) // 2
        probes += 1
        if wrong(mid):
            hi = mid
        else:
            lo = mid + 1
    node = calls[hi]
    return {"name": node.name, "op": op_name(node), "source": sources.get(node.name), "index": hi}


class StageRecorder:
    """Wraps a Dynamo backend (the run's own, savers and all): each graph's first call is preceded
    by compare_stages on copies of its inputs, and `path` is rewritten with every result so far
    (a JSON list of StageComparison dicts). A failure of the check itself is recorded as
    `unjudged` with its first line; the user's call always runs as it would have."""

    def __init__(self, backend, config, path: str, tolerance: Optional[float] = None):
        self.backend, self.config, self.path, self.tolerance = backend, config, path, tolerance
        self.rows: list = []

    def wrap(self, backend_fn, backend=None):
        """`backend_fn` checked at each graph's first call; `backend` (default: the recorder's) is
        the resolved Backend it runs, whose AOT stage the check uses."""
        def dynamo_backend(gm, example_inputs):
            from tdbg.minifier.diagnose.checks import snapshot
            from tdbg.minifier.diagnose.divergence import node_sources
            snap, index = snapshot(gm), len(self.rows)
            self.rows.append(None)
            sources = node_sources(snap)
            compiled = backend_fn(gm, example_inputs)
            first = [True]

            def run(*args):
                if first[0]:
                    first[0] = False
                    self._check(index, snap, args, sources, backend or self.backend)
                return compiled(*args)
            return run
        return dynamo_backend

    def _check(self, index: int, snap, args, sources, backend) -> None:
        import json
        name = f"g{index}_dynamo_c1"
        rng = torch.get_rng_state()
        try:
            row = compare_stages(snap, _fresh(args), backend, config=self.config, sources=sources,
                                 name=name, tolerance=self.tolerance).to_dict()
        except Exception as e:   # the check must not change the user's run; it says it could not judge
            row = StageComparison(name, getattr(backend, "name", str(backend)), "unjudged",
                                  f"its stages could not be judged ({type(e).__name__}: "
                                  f"{(str(e).splitlines() or [''])[0]})").to_dict()
        finally:
            torch.set_rng_state(rng)
        self.rows[index] = row
        with open(self.path, "w") as f:
            json.dump([r for r in self.rows if r is not None], f)
