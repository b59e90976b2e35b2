"""Run-to-run diff of two `tdbg run --save-io` folders: what `tdbg diff A B` reports.

Graphs are matched by their saved name (`g<k>_<kind>_c<n>`: the same script compiles its graphs
in the same order). For each pair:

  structure   the graph source's SHA-256, node count and op multiset (call_function targets);
              any difference in the source is a structural change
  outputs     when A's and B's saved inputs are identical (same SHA-256 per input), B's compiled
              outputs against A's (float64 reference of A's graph, per-dtype tolerances:
              diagnose/accuracy.compare with A in eager's place); always, each run's compiled
              outputs against its own eager outputs. With different inputs (an upstream graph
              changed what it hands on) A and B are not compared directly, and the diff says so.
              The inputs a call changed in place (saved after it) are compared the same ways,
              named `NAME (changed in place)`.
  timing      when both folders have timings (`--save-io DIR --profile`): the median compiled
              call time of each and a verdict (diagnose/timing.compare_times): `slower` or
              `faster` only when the medians are `slower_ratio` apart, the middle halves of the
              samples do not overlap and neither side is NOISY (a busy machine, widely spread
              samples, too few of them, or an older folder's samples with warm-up in them);
              `noisy` otherwise says the timings are too noisy to compare. Reported, never a
              change. The same per kernel when both runs saved kernel times (tdbg's compiler
              with `--profile`: kernels present in both, matched by name)

A graph is `changed` when its structure changed, its outputs differ from A's beyond tolerance, or
B's compiled outputs fail against B's eager outputs where A's passed; graphs only in one folder
are changed too. `RunDiff.changed` is what `tdbg diff`'s exit code says.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Optional

from tdbg.minifier.artifacts.saved_io import SavedGraph, load_saved
from tdbg.minifier.runs.names import backend_label

DEFAULT_SLOWER_RATIO = 1.25


@dataclass
class GraphDiff:
    name: str
    kind: str
    status: str = "same"              # same | changed | only_in_a | only_in_b
    reasons: list = field(default_factory=list)
    nodes: tuple = (None, None)
    ops_added: dict = field(default_factory=dict)     # op -> how many more in B
    ops_removed: dict = field(default_factory=dict)   # op -> how many fewer in B
    inputs_match: Optional[bool] = None
    a_vs_b: Optional[list] = None     # mismatches of B's compiled outputs vs A's (None: not compared)
    a_vs_eager: Optional[list] = None
    b_vs_eager: Optional[list] = None
    # {"a_s", "b_s", "a_samples", "b_samples", "ratio", "verdict" (slower|faster|same|noisy), "why",
    #  "slower", "kernels": [{"kernel", "a_s", "b_s", "ratio", "verdict", "slower"}] | None}
    timing: Optional[dict] = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RunDiff:
    a: str
    b: str
    graphs: list
    timings: str                      # "both" | "a only" | "b only" | "none"
    notes: list = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any(g.status != "same" for g in self.graphs)

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "changed": self.changed, "timings": self.timings, "notes": self.notes,
                "graphs": [g.to_dict() for g in self.graphs]}


def diff_saved(dir_a: str, dir_b: str, *, slower_ratio: float = DEFAULT_SLOWER_RATIO) -> RunDiff:
    """Diff two --save-io folders (both loaded and verified first: SavedIOError if unusable)."""
    run_a, run_b = load_saved(dir_a), load_saved(dir_b)
    a = {g.name: g for g in run_a.graphs}
    b = {g.name: g for g in run_b.graphs}
    names = list(a) + [n for n in b if n not in a]
    graphs = []
    for name in names:
        if name not in b:
            graphs.append(GraphDiff(name, a[name].kind, "only_in_a", [f"only {dir_a} has this graph"]))
        elif name not in a:
            graphs.append(GraphDiff(name, b[name].kind, "only_in_b", [f"only {dir_b} has this graph"]))
        else:
            graphs.append(diff_graph(a[name], b[name], slower_ratio))
    with_timings = [bool(r.manifest.get("timings")) for r in (run_a, run_b)]
    timings = {(True, True): "both", (True, False): "a only", (False, True): "b only"}.get(tuple(with_timings), "none")
    shown = {"backend": backend_label}   # tdbg's compiler never a bare "inductor" (PyTorch's reads torch:inductor)
    notes = [f"{key}: {shown.get(key, str)(run_a.manifest.get(key))} vs {shown.get(key, str)(run_b.manifest.get(key))}"
             for key in ("torch", "tdbg", "backend", "threads") if run_a.manifest.get(key) != run_b.manifest.get(key)]
    return RunDiff(dir_a, dir_b, graphs, timings, notes)


def diff_graph(a: SavedGraph, b: SavedGraph, slower_ratio: float = DEFAULT_SLOWER_RATIO) -> GraphDiff:
    d = GraphDiff(a.name, a.kind)
    ops_a, ops_b = op_counts(a), op_counts(b)
    d.nodes = (len(a.gm.graph.nodes), len(b.gm.graph.nodes))
    d.ops_added = dict(sorted((ops_b - ops_a).items()))
    d.ops_removed = dict(sorted((ops_a - ops_b).items()))
    if a.source_sha256 != b.source_sha256:
        what = (f"{d.nodes[0]} -> {d.nodes[1]} nodes" if d.nodes[0] != d.nodes[1] else
                "the same op counts, different graph" if not (d.ops_added or d.ops_removed) else "other ops")
        d.reasons.append(f"structure changed ({what})")
    d.a_vs_eager, d.b_vs_eager = (_judge(g.expected, g.compiled, g, _in_place_vs_eager(g)) for g in (a, b))
    if d.b_vs_eager and not d.a_vs_eager:
        d.reasons.append("B's compiled outputs differ from B's eager outputs (A's matched): "
                         + ", ".join(m["output"] for m in d.b_vs_eager))
    d.inputs_match = a.input_shas == b.input_shas
    if d.inputs_match and a.compiled is not None and b.compiled is not None:
        d.a_vs_b = _judge(a.compiled, b.compiled, a, _in_place_a_vs_b(a, b))
        if d.a_vs_b:
            d.reasons.append("compiled outputs changed beyond tolerance on the same inputs: "
                             + ", ".join(m["output"] for m in d.a_vs_b))
    elif (a.compiled is None) != (b.compiled is None):
        failed = "A" if a.compiled is None else "B"
        d.reasons.append(f"the compiled call failed in {failed} only")
    d.timing = _timing(a, b, slower_ratio)
    d.status = "changed" if d.reasons else "same"
    return d


def op_counts(graph: SavedGraph) -> Counter:
    """call_function targets -> count (e.g. aten.mm.default: 3)."""
    return Counter(str(n.target) for n in graph.gm.graph.nodes if n.op == "call_function")


def _judge(expected: list, actual: Optional[list], graph: SavedGraph, in_place: list = ()) -> Optional[list]:
    """Mismatches (dicts) of `actual` against `expected`, a float64 run of `graph` as reference,
    then the `in_place` ones; None when there is no `actual` (the compiled call failed)."""
    from tdbg.minifier.diagnose.accuracy import compare, fp64_reference
    if actual is None:
        return None
    from tdbg.minifier.diagnose.same_draws import draws_random
    found = compare(expected, actual)
    if found and not any(draws_random(n) for n in graph.gm.graph.nodes):
        # a float64 run of a graph that draws random numbers draws other ones: no reference then
        found = compare(expected, actual, fp64_reference(graph.gm, graph.inputs))
    return [m.to_dict() for m in [*found, *in_place]]


def _in_place_vs_eager(graph: SavedGraph) -> list:
    """Mismatches of the inputs the compiled call left otherwise than eager (checks.changed_in_place)."""
    import torch

    from tdbg.minifier.diagnose.checks import changed_in_place
    if graph.compiled is None or not graph.in_place:
        return []
    return changed_in_place(graph.gm, graph.inputs, graph.inputs_after(), graph.inputs_after(compiled=True),
                            torch.get_rng_state())


def _in_place_a_vs_b(a: SavedGraph, b: SavedGraph) -> list:
    """Mismatches of B's inputs after the compiled call against A's (same inputs given)."""
    from tdbg.minifier.diagnose.accuracy import compare
    from tdbg.minifier.diagnose.checks import IN_PLACE, input_names
    changed = sorted({i for i, _, _ in (*a.in_place, *b.in_place)})
    if not changed:
        return []
    names = input_names(a.gm, len(a.meta.get("inputs") or ()))
    after_a, after_b = a.inputs_after(compiled=True), b.inputs_after(compiled=True)
    return compare([after_a[i] for i in changed], [after_b[i] for i in changed],
                   names=[names[i] + IN_PLACE for i in changed])


def _timing(a: SavedGraph, b: SavedGraph, slower_ratio: float) -> Optional[dict]:
    from tdbg.minifier.diagnose.timing import compare_times, from_saved
    ta, tb = (g.meta.get("timing") or {} for g in (a, b))
    timing_a, timing_b = from_saved(ta), from_saved(tb)
    if timing_a is None or timing_b is None or not timing_a.median_s:
        if not ta.get("median_s") or not tb.get("median_s"):
            return None
        # a folder from before samples were saved: a median alone cannot be judged
        return {"a_s": ta["median_s"], "b_s": tb["median_s"], "a_samples": ta.get("samples"),
                "b_samples": tb.get("samples"), "ratio": tb["median_s"] / ta["median_s"], "verdict": "noisy",
                "why": "a folder saved its median without the samples, so its spread is unknown", "slower": False,
                "kernels": None}
    verdict = compare_times(timing_a, timing_b, slower_ratio)
    kernels_a, kernels_b = ta.get("per_kernel") or {}, tb.get("per_kernel") or {}
    kernels = []
    for kernel in [k for k in kernels_a if k in kernels_b]:
        ka, kb = from_saved(kernels_a[kernel]), from_saved(kernels_b[kernel])
        a_s, b_s = kernels_a[kernel].get("median_s"), kernels_b[kernel].get("median_s")
        if not a_s or b_s is None:
            continue
        # a kernel is timed in its graph's run: a busy machine or a graph too noisy to compare is
        # too noisy for its kernels too; an older folder kept no kernel samples to judge
        k = {"verdict": "noisy", "ratio": b_s / a_s} if ka is None or kb is None or verdict["verdict"] == "noisy" \
            else compare_times(ka, kb, slower_ratio)
        kernels.append({"kernel": kernel, "a_s": a_s, "b_s": b_s, "ratio": k["ratio"], "verdict": k["verdict"],
                        "slower": k["verdict"] == "slower"})
    return {"a_s": timing_a.median_s, "b_s": timing_b.median_s, "a_samples": timing_a.samples,
            "b_samples": timing_b.samples, "ratio": verdict["ratio"], "verdict": verdict["verdict"],
            "why": verdict["why"], "slower": verdict["verdict"] == "slower",
            "kernels": kernels if kernels_a and kernels_b else None}
