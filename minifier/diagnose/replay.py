"""Rerun one saved graph (a `tdbg run --save-io` folder) alone and judge it against the saved
eager outputs: what `tdbg replay` runs.

`replay(graph, backend=None)` compiles the saved graph the way the run did (the replay spec saved
with it: an aten graph goes to the backend's own per-graph compiler, as `--after aot` repro files
and the minifier's queries do, through repro_templates/runtime.py compile_graph; a Dynamo graph to
the backend whole), or with another backend (`eager` runs the graph uncompiled), runs it on the
saved inputs and compares with the saved eager outputs (diagnose/accuracy.py: float64 reference,
per-dtype tolerances). The result is a verdict like `tdbg run`'s: status, stage (the compiler
stage that failed, `accuracy`, `backend`), error {type, message, fx_node, source}. The call
starts from the saved call's RNG state, so a graph with random ops replays the same draws in
eager (a compiler's own random streams may still differ from eager's).

The saved run's thread count is used while replaying (reductions may round differently with
another), so `--backend eager` reproduces the saved eager outputs bit for bit; `max_abs_error`
is reported even when the outputs pass, so that is visible.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from tdbg.minifier.artifacts.saved_io import SavedGraph, SavedIOError, read_manifest
from tdbg.minifier.runs.names import backend_label


@dataclass
class Replay:
    """The verdict of one replayed graph (JSON-safe through `to_dict`)."""
    graph: str
    kind: str
    backend: str
    status: str = "ok"                 # ok | failed
    stage: Optional[str] = None        # a stage of console.EXIT_CODES when failed
    outputs: int = 0
    in_place: int = 0                  # inputs the saved eager run changed in place, compared too
    max_abs_error: Optional[float] = None   # over float outputs vs the saved eager outputs
    mismatches: list = field(default_factory=list)
    error: Optional[dict] = None
    seconds: float = 0.0
    config: dict = field(default_factory=dict)   # tdbg Config fields the compile used that differ from defaults

    def to_dict(self) -> dict:
        return asdict(self)


def recorded_backend(graph: SavedGraph) -> str:
    """The backend name the run used for this graph (the manifest's `backend`)."""
    backend = (graph.replay_spec.get("backend") or {})
    return backend.get("name") or _manifest(graph).get("backend") or "inductor"


def replay(graph: SavedGraph, backend: Optional[str] = None) -> Replay:
    """Compile and run `graph` with `backend` (None: the recorded one; "eager": uncompiled) on its
    saved inputs; judge the outputs against the saved eager ones. With the recorded backend the
    recorded tdbg config differences are used too (an injected bug or a switched-off pass
    replays as it ran; `config` says which). Never raises for the graph's own
    failures (they are the verdict); raises SavedIOError when the backend cannot be loaded."""
    import torch
    name = backend or recorded_backend(graph)
    result = Replay(graph.name, graph.kind, name)
    threads = _manifest(graph).get("threads")
    saved_threads = torch.get_num_threads()
    if isinstance(threads, int) and threads > 0:
        torch.set_num_threads(threads)
    start = time.perf_counter()
    try:
        _replay(graph, name, backend is None, result)
    finally:
        torch.set_num_threads(saved_threads)
        result.seconds = round(time.perf_counter() - start, 3)
    return result


def _replay(graph: SavedGraph, name: str, recorded: bool, result: Replay) -> None:
    import torch
    inputs = graph.inputs
    rng = torch.get_rng_state()
    try:
        _run(graph, name, recorded, result, inputs)
    finally:
        torch.set_rng_state(rng)


def _run(graph: SavedGraph, name: str, recorded: bool, result: Replay, inputs: list) -> None:
    import torch

    from tdbg.minifier.diagnose.accuracy import compare, flatten, fp64_reference
    from tdbg.repro_templates import runtime
    with torch.no_grad():
        if name == "eager":
            compiled = graph.gm
        else:
            spec = graph.replay_spec if recorded else spec_for(name, graph)
            result.config = dict(spec.get("config") or {})
            with runtime._config_scope(spec):
                try:
                    compiled = runtime.compile_graph(graph.gm, inputs, spec, _folder(spec))
                except runtime.CannotRun as e:
                    raise SavedIOError(f"graph {graph.name} cannot be compiled with backend {backend_label(name)} here: {e}") from None
                except Exception as e:  # the compiler's failure is the verdict
                    return _failed(result, graph, _stage(e, name), e, "compile")
        if graph.rng_state is not None:   # the saved call's RNG state: random ops draw what they drew
            torch.set_rng_state(graph.rng_state)
        ran_on = graph.inputs   # after the call: what the backend changed in place
        try:
            actual = [v for _, v in flatten(compiled(*ran_on))]
        except Exception as e:
            return _failed(result, graph, _stage(e, name), e, "run")
    result.outputs, result.in_place = len(graph.expected), len(graph.in_place)
    result.max_abs_error = _max_error(graph.expected, actual)
    found = compare(graph.expected, actual)
    from tdbg.minifier.diagnose.same_draws import draws_random
    random_ops = sorted({str(n.target) for n in graph.gm.graph.nodes if draws_random(n)})
    if found and not random_ops:
        # a float64 run of a graph that draws random numbers draws other ones: no reference then
        found = compare(graph.expected, actual, fp64_reference(graph.gm, graph.inputs))
    found += _in_place_mismatches(graph, ran_on, not random_ops)
    if found:
        result.status, result.stage = "failed", "accuracy"
        result.mismatches = [m.to_dict() for m in found]
        nodes = _output_nodes(graph)
        fx = [nodes.get(m.output) for m in found if nodes.get(m.output)]
        result.error = {"type": "AccuracyError", "during": "run",
                        "message": f"graph {graph.name}: {_differ(found)}:\n" +
                                   "\n".join(f"  {m.output} ({m.dtype}{list(m.shape)}): {m.message}" for m in found),
                        "fx_node": ", ".join(dict.fromkeys(fx)) or None,
                        "source": next((graph.node_sources.get(n) for n in fx if graph.node_sources.get(n)), None)}
        if random_ops:
            result.error["message"] += (f"\nthe graph draws random numbers ({', '.join(random_ops)}): a backend's own "
                                        "random streams may differ from eager's, so this mismatch need not be a bug")


def _differ(found: list) -> str:
    from tdbg.minifier.diagnose.checks import IN_PLACE
    return ("inputs it changes in place differ from the saved eager values"
            if all(m.output.endswith(IN_PLACE) for m in found) else "outputs differ from the saved eager outputs")


def _in_place_mismatches(graph: SavedGraph, ran_on: list, referenced: bool) -> list:
    """The inputs the saved eager run or this replay changed in place, eager's saved values
    after the call against the replay's (checks.changed_in_place; float64 reference when
    `referenced`)."""
    import torch

    from tdbg.minifier.diagnose.checks import changed_in_place
    rng = torch.get_rng_state() if referenced else None
    return changed_in_place(graph.gm, graph.inputs, graph.inputs_after(), ran_on, rng)


# recorded config fields another backend replays with too: random ops drew eager's numbers in the
# saved run (its outputs are eager's draws), so any backend that can is told to draw them again
CARRIED_CONFIG = ("fallback_random",)


def spec_for(name: str, graph: SavedGraph) -> dict:
    """The runtime.py spec compiling `graph` with backend `name` (default tdbg config but
    CARRIED_CONFIG): an aten
    graph through the backend's own AOT stage when it is of the family that made the graph
    (its decompositions are the ones that backend expects), else given to the backend whole
    (which then runs its own AOTAutograd and decompositions on it). The saved spec's `dynamic`
    (the inputs' symbolic sizes) is kept: the graph compiles with the symbols it was saved with,
    whatever the backend (replay, and compare's --backend, use this spec)."""
    from tdbg.compiler import config as tdbg_config
    from tdbg.minifier.runs import aot_capture
    from tdbg.minifier.runs.backends import BackendError, resolve
    try:
        resolved = resolve(name, tdbg_config.from_env())
    except BackendError as e:
        raise SavedIOError(str(e)) from None
    recorded = graph.replay_spec.get("config") or {}
    spec = {"backend": {"kind": "named", "name": name},
            "config": {k: recorded[k] for k in CARRIED_CONFIG if k in recorded}}
    if graph.replay_spec.get("dynamic"):
        spec["dynamic"] = graph.replay_spec["dynamic"]
    family = aot_capture.family_of(resolved)
    made_by = (graph.replay_spec.get("aot") or {}).get("family")
    if graph.kind != "dynamo" and family is not None and family == made_by:
        return dict(spec, after="aot", aot={"family": family, "graph": graph.kind})
    return dict(spec, after="dynamo")


def _folder(spec: dict) -> str:
    return (spec.get("backend") or {}).get("root") or os.getcwd()


def _stage(e: BaseException, backend: str) -> str:
    from tdbg.minifier.runs.instrument import typed_error
    typed = typed_error(e)
    return typed.stage if typed is not None and typed.stage != "internal" else "backend"


def _failed(result: Replay, graph: SavedGraph, stage: str, e: BaseException, during: str) -> None:
    """The verdict of a compile or run failure: the typed error's evidence (FX nodes, kernel) and
    the user line of its first node the run saved."""
    from tdbg.minifier.runs.instrument import typed_error
    typed = typed_error(e)
    evidence = typed.evidence() if typed is not None else {}
    lines = str(evidence.get("message") or e).strip().splitlines()
    nodes = [evidence["fx_node"]] if evidence.get("fx_node") else list(evidence.get("fx_nodes") or [])
    result.status, result.stage = "failed", stage
    result.error = {"type": type(typed or e).__name__, "during": during,
                    "message": "\n".join(lines[:12] + ([f"... ({len(lines) - 12} more lines)"] if len(lines) > 12 else [])),
                    "fx_node": ", ".join(map(str, nodes)) or None, "kernel": evidence.get("kernel") or None,
                    "source": next((graph.node_sources[n] for n in nodes if graph.node_sources.get(n)), None)}


def _max_error(expected: list, actual: list) -> Optional[float]:
    import torch
    worst = None
    for e, a in zip(expected, actual):
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor) and e.is_floating_point() \
                and e.shape == a.shape and a.dtype == e.dtype and e.numel():
            err = float((a.double() - e.double()).abs().nan_to_num(nan=float("inf")).max())
            same_nan = torch.equal(e.isnan(), a.isnan())
            err = err if same_nan else float("inf")
            worst = err if worst is None else max(worst, err)
    return worst


def _output_nodes(graph: SavedGraph) -> dict:
    """"out[i]" -> the name of the node producing output i."""
    from tdbg.minifier.diagnose.accuracy import flatten
    output = next(n for n in graph.gm.graph.nodes if n.op == "output")
    return {path: node.name for path, node in flatten(output.args[0]) if hasattr(node, "name")}


def _manifest(graph: SavedGraph) -> dict:
    try:
        return read_manifest(os.path.dirname(graph.path))
    except SavedIOError:
        return {}
