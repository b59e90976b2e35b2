"""The `--save-io` folder: each compiled graph's real inputs, eager and compiled outputs, and source.

Written by `tdbg run --save-io DIR` (runs/instrument.py IOSaver calls `Writer`), read back by
`tdbg replay`, `tdbg diff`, `tdbg compare` and the kernel tests (`load_saved`, `load_graph`).

    DIR/manifest.json     {"format": FORMAT, "tdbg", "torch", "backend", "script", "created",
                           "threads", "after" ("aot" | "dynamo"), "graphs": [{"name", "kind",
                           "graph", "call", "signature", "nodes", "source_sha256"}], "skipped": [...],
                           "timings": bool}
    DIR/<GRAPH>/graph.py  the graph as standalone source (graph_io.case_source): the aten graph the
                          backend compiles after AOTAutograd (kind forward|backward|inference), or
                          the Dynamo graph (kind "dynamo") for a backend with no AOT stage
    DIR/<GRAPH>/meta.json {"name", "kind", "graph", "call", "inputs": [record], "expected":
                           [record], "compiled": [record] | null, "compiled_error": str | null,
                           "node_sources": {FX node: "file:line in fn: code"}, "replay": the
                           runtime.py spec that recompiles the graph as the run did (with
                           "dynamic", the inputs' symbolic sizes, for a graph that had them),
                           "tolerances",
                           "rng_state": record of torch's CPU RNG state before the call,
                           "in_place": [{"input": index, "expected": record, "compiled": record |
                           null}] for each tensor input eager or the backend changed in place
                           (values after the call; absent in folders of older tdbg versions),
                           "timing": a diagnose/timing.Timing record {"median_s", "min_s", "q1_s",
                           "q3_s", "samples", "times_s" (after warm-up), "warmup_calls",
                           "calls_per_sample", "busy_share", "noisy" (why it cannot be compared, or
                           null), "per_kernel": {kernel: the same record} | null} | null
    DIR/<GRAPH>/tensors/<sha256>.bin   raw bytes of one tensor (contiguous), named by their SHA-256,
                          so `sha256sum` verifies them; tensors with equal bytes share a file

A record is {"name", "sha", "shape", "stride", "dtype", "requires_grad"} for a tensor (the
graph_io.InputSpec fields) or {"name", "value"} for a plain value (int, float, bool, None).
GRAPH is `g<k>_<kind>_c<n>`: the k-th graph compiled in the run (from 0), saved at its call n
(from 1), the first call with that input signature. Outputs are the graph's outputs flattened in
order (`accuracy.flatten`). Nothing inside a folder is an absolute path needed to load it: a
folder (or one GRAPH folder with the manifest beside it) can be moved or sent.

Loading verifies every tensor file against its SHA-256 name; a missing, unreadable or changed
file, a malformed manifest or meta.json raise `SavedIOError` (stage bad_input), never a verdict.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from tdbg.compiler.errors import TdbgError

FORMAT = "tdbg-saved-io/1"
MANIFEST, META, GRAPH_SOURCE, TENSORS = "manifest.json", "meta.json", "graph.py", "tensors"
GRAPH_KINDS = ("forward", "backward", "inference", "dynamo")


class SavedIOError(TdbgError):
    """A saved folder cannot be used: the message names the file and what is wrong with it."""
    stage = "bad_input"


# ---------------------------------------------------------------- tensors <-> records

def _tensor_file(folder: str, sha: str) -> str:
    return os.path.join(folder, TENSORS, f"{sha}.bin")


def write_value(folder: str, name: str, value: Any) -> dict:
    """The record of one value; a tensor's bytes go to tensors/<sha256>.bin (kept if present)."""
    import torch

    from tdbg.minifier.artifacts.graph_io import tensor_bytes
    if isinstance(value, torch.SymInt):
        value = value.node.hint   # int() would guard (specialize) the graph being compiled
    if not isinstance(value, torch.Tensor):
        if value is not None and not isinstance(value, (bool, int, float)):
            raise TypeError(f"{name} is a {type(value).__name__}; only tensors, ints, floats, bools and None "
                            "are saved")
        return {"name": name, "value": value}
    data = tensor_bytes(value)
    sha = hashlib.sha256(data).hexdigest()
    path = _tensor_file(folder, sha)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return {"name": name, "sha": sha, "shape": list(value.shape), "stride": list(value.stride()),
            "dtype": str(value.dtype).replace("torch.", ""), "requires_grad": bool(value.requires_grad)}


def read_value(folder: str, record: dict, where: str) -> Any:
    """The value of a record, its tensor file checked against its SHA-256 (SavedIOError if not)."""
    from tdbg.minifier.artifacts.graph_io import InputSpec, tensor_from_bytes
    if "sha" not in record:
        return record.get("value")
    path = _tensor_file(folder, str(record["sha"]))
    label = f"{where} {record.get('name', '?')}"
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SavedIOError(f"{label}: its tensor file {path} cannot be read ({e.strerror or e}); the saved "
                           "folder is incomplete. Save it again with `tdbg run --save-io`.") from None
    if hashlib.sha256(data).hexdigest() != record["sha"]:
        raise SavedIOError(f"{label}: {path} does not match its SHA-256 name (the file was changed after it "
                           "was saved); its values cannot be trusted. Save the folder again with "
                           "`tdbg run --save-io`.")
    try:
        spec = InputSpec(record["name"], record["sha"], tuple(record["shape"]), tuple(record["stride"]),
                         f"torch.{record['dtype']}", bool(record.get("requires_grad")))
        return tensor_from_bytes(data, spec)
    except (KeyError, ValueError, RuntimeError, TypeError) as e:
        raise SavedIOError(f"{label}: the record in {where.split(' ')[0]} does not describe {path} ({e}).") from None


def fresh(values: list) -> list:
    """Copies of saved values (tensors cloned, requires_grad kept), so no run sees another's edits
    (the repro runtime's own `fresh`: repro.py, the minifier and replay copy inputs alike)."""
    from tdbg.repro_templates.runtime import fresh as copies
    return copies(values)


# ---------------------------------------------------------------- reading

@dataclass
class SavedGraph:
    """One saved graph call. `inputs` gives fresh copies on every access; `expected` are eager's
    outputs and `compiled` the backend's (None when the compiled call failed: `meta
    ["compiled_error"]` says how), both flattened lists."""
    name: str
    kind: str
    path: str
    gm: Any
    expected: list
    compiled: Optional[list]
    node_sources: dict
    meta: dict
    source: str = ""
    rng_state: Any = None      # torch's CPU RNG state the saved call started from (random ops replay alike)
    _inputs: list = field(default_factory=list, repr=False)
    # [(input index, eager's value after its run, the compiled call's or None)] for the inputs
    # either side changed in place (a BatchNorm's running statistics)
    in_place: list = field(default_factory=list)

    @property
    def inputs(self) -> list:
        return fresh(self._inputs)

    def inputs_after(self, compiled: bool = False) -> list:
        """The inputs as the saved eager run (or the compiled call) left them: fresh copies, with
        the values recorded after the call for those changed in place."""
        out = self.inputs
        for i, eager, comp in self.in_place:
            out[i] = comp if compiled else eager
        return out

    @property
    def replay_spec(self) -> dict:
        return dict(self.meta.get("replay") or {})

    @property
    def symbolic_text(self) -> str:
        """The inputs whose sizes were symbolic, as graph_io.symbolic_text writes them ("" if none):
        a replay compiles them symbolic again."""
        from tdbg.minifier.artifacts.graph_io import InputSpec, symbolic_text
        dynamic = self.replay_spec.get("dynamic") or {}
        specs = [InputSpec(r.get("name", "?"), shape=tuple(r.get("shape") or ()), dtype=r.get("dtype") or "",
                           value=r.get("value"), dynamic=tuple(dynamic.get(r.get("name")) or ()))
                 for r in self.meta.get("inputs") or []]
        return symbolic_text(specs)

    @property
    def source_sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def input_shas(self) -> list:
        return [r.get("sha") or repr(r.get("value")) for r in self.meta.get("inputs", [])]


@dataclass
class SavedRun:
    path: str
    manifest: dict
    graphs: list

    def graph(self, name: str) -> SavedGraph:
        for g in self.graphs:
            if g.name == name:
                return g
        raise SavedIOError(f"{self.path} has no saved graph {name!r}; it has: "
                           f"{', '.join(g.name for g in self.graphs) or 'none'}.")


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise SavedIOError(f"{path} is missing: this is not a folder written by `tdbg run --save-io` "
                           f"(or its {what} was removed).") from None
    except (OSError, ValueError) as e:
        raise SavedIOError(f"{path} cannot be read as JSON ({e}); the saved {what} is damaged.") from None
    if not isinstance(doc, dict):
        raise SavedIOError(f"{path} does not hold a JSON object; the saved {what} is damaged.")
    return doc


def read_manifest(directory: str) -> dict:
    if not os.path.isdir(directory):
        raise SavedIOError(f"{directory!r} is not a folder; give a folder written by `tdbg run --save-io`.")
    manifest = _read_json(os.path.join(directory, MANIFEST), "manifest")
    if manifest.get("format") != FORMAT:
        raise SavedIOError(f"{os.path.join(directory, MANIFEST)}: format {manifest.get('format')!r}, expected "
                           f"{FORMAT!r}; this tdbg cannot read it.")
    if not isinstance(manifest.get("graphs"), list):
        raise SavedIOError(f"{os.path.join(directory, MANIFEST)} has no list of graphs; the manifest is damaged.")
    return manifest


def load_saved(directory: str) -> SavedRun:
    """Every graph of a --save-io folder (manifest checked, every tensor file verified)."""
    manifest = read_manifest(directory)
    graphs = [load_graph(directory, row.get("name", "")) for row in manifest["graphs"]]
    return SavedRun(directory, manifest, graphs)


def split_path(path: str) -> tuple:
    """(saved folder, graph name or None) of `DIR` or `DIR/GRAPH`."""
    path = os.path.normpath(path)
    if os.path.isfile(os.path.join(path, MANIFEST)) or not os.path.isfile(os.path.join(path, META)):
        return path, None
    return os.path.dirname(path) or ".", os.path.basename(path)


def load_graph(path: str, name: Optional[str] = None) -> SavedGraph:
    """One saved graph: `DIR/GRAPH`, or `DIR` and the graph's name."""
    from tdbg.minifier.artifacts.graph_io import trace_source
    if name is None:
        directory, name = split_path(path)
        if name is None:
            raise SavedIOError(f"{path} is a saved folder, not one graph of it; give {path}/GRAPH.")
    else:
        directory = path
    if not name or os.sep in name or name.startswith("."):
        raise SavedIOError(f"{name!r} is not a saved graph's name.")
    folder = os.path.join(directory, name)
    meta_path = os.path.join(folder, META)
    meta = _read_json(meta_path, f"graph {name}")
    source_path = os.path.join(folder, GRAPH_SOURCE)
    try:
        with open(source_path) as f:
            source = f.read()
    except OSError as e:
        raise SavedIOError(f"{source_path} cannot be read ({e.strerror or e}); graph {name} is incomplete.") from None
    try:
        gm = trace_source(source, source_path)
    except Exception as e:  # any error in a damaged source file: the file is unusable, say which
        raise SavedIOError(f"{source_path} does not load as a graph ({type(e).__name__}: {e}).") from None
    _rename(gm, meta.get("nodes"))
    _mark_dynamic(gm, (meta.get("replay") or {}).get("dynamic"))
    where = f"{name}/{META}"
    try:
        inputs = [read_value(folder, r, f"{where} input") for r in meta["inputs"]]
        expected = [read_value(folder, r, f"{where} expected output") for r in meta["expected"]]
        compiled = (None if meta.get("compiled") is None else
                    [read_value(folder, r, f"{where} compiled output") for r in meta["compiled"]])
        rng_state = None if not meta.get("rng_state") else read_value(folder, meta["rng_state"], where)
        in_place = [(int(r["input"]), read_value(folder, r["expected"], f"{where} input changed in place"),
                     None if r.get("compiled") is None else read_value(folder, r["compiled"], where))
                    for r in meta.get("in_place") or ()]
    except (KeyError, TypeError) as e:
        raise SavedIOError(f"{meta_path} lacks {e}; the saved graph is damaged.") from None
    placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if placeholders != len(inputs):
        raise SavedIOError(f"{source_path} takes {placeholders} inputs but {meta_path} lists {len(inputs)}.")
    if any(not 0 <= i < len(inputs) for i, _, _ in in_place):
        raise SavedIOError(f"{meta_path} names an input changed in place that the graph does not take.")
    return SavedGraph(name, meta.get("kind", ""), folder, gm, expected, compiled,
                      dict(meta.get("node_sources") or {}), meta, source, rng_state, inputs, in_place)


def _mark_dynamic(gm, dynamic) -> None:
    """The graph's own record of its inputs' symbolic sizes (runtime.DYNAMIC_META on its
    placeholders): a graph replayed with another backend, or copied by compare, still compiles
    with symbolic sizes, whatever spec it is compiled by."""
    from tdbg.repro_templates.runtime import DYNAMIC_META
    if not isinstance(dynamic, dict):
        return
    for node in gm.graph.nodes:
        if node.op == "placeholder" and dynamic.get(node.target):
            node.meta[DYNAMIC_META] = tuple(dynamic[node.target])


def _rename(gm, names) -> None:
    """Give the traced graph's nodes the names they had when saved (node_sources, kernel names
    and reports use them); tracing the source names nodes after their ops instead."""
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    if not isinstance(names, list) or len(names) != len(nodes) or [n.name for n in nodes] == names:
        return   # (reading the source keeps its names: FX's renames would dodge the names still taken)
    for node in nodes:   # free the saved names first: one may be another node's current name
        node._rename(f"_tdbg_tmp_{node.name}")
    for node, name in zip(nodes, names):
        node._rename(str(name))
        if node.op == "placeholder":
            node.target = node.name
    gm.recompile()


# ---------------------------------------------------------------- writing

class Writer:
    """Writes one --save-io folder as a run goes: a graph folder per saved call, the manifest
    rewritten (atomically) after each, so a run that dies keeps what it saved."""

    def __init__(self, directory: str, header: dict):
        from importlib import metadata

        import torch
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        self.manifest = {"format": FORMAT, "tdbg": _version(metadata),
                         "torch": torch.__version__, "created": datetime.datetime.now().isoformat(timespec="seconds"),
                         "threads": torch.get_num_threads(), **header, "graphs": [], "skipped": [],
                         "timings": False}
        self.metas: dict = {}
        self._write_manifest()

    def add(self, *, kind: str, graph: int, call: int, gm, inputs: list, expected: Optional[list],
            compiled: Optional[list], compiled_error: Optional[str], node_sources: dict, replay: dict,
            signature: str, rng_state=None, in_place: tuple = ()) -> str:
        """Save one graph call (gm: the graph as compiled; inputs as given to it); its name."""
        from tdbg.minifier.artifacts.graph_io import TensorStore, case_source, dynamic_table, from_graph_module
        from tdbg.minifier.diagnose.accuracy import TOLERANCES
        name = f"g{graph}_{kind}_c{call}"
        folder = os.path.join(self.directory, name)
        case = from_graph_module(gm, inputs, TensorStore(), inline_constants=False)
        dynamic = dynamic_table(case.inputs)
        if dynamic:   # a graph with symbolic sizes replays with them (runtime.py's spec "dynamic")
            replay = dict(replay, dynamic={k: list(v) for k, v in dynamic.items()})
        source = case_source(case)
        values = list(inputs) + [_fetch(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"]
        os.makedirs(folder, exist_ok=True)
        meta = {"name": name, "kind": kind, "graph": graph, "call": call, "signature": signature,
                "inputs": [write_value(folder, s.name, v) for s, v in zip(case.inputs, values)],
                "expected": [write_value(folder, f"out[{i}]", v) for i, v in enumerate(expected or [])],
                "compiled": None if compiled is None else
                [write_value(folder, f"out[{i}]", v) for i, v in enumerate(compiled)],
                "compiled_error": compiled_error,
                "nodes": [n.name for n in case.gm.graph.nodes if n.op != "output"], "node_sources": node_sources, "replay": replay,
                "tolerances": {str(k).replace("torch.", ""): list(v) for k, v in TOLERANCES.items()},
                "timing": None,
                "rng_state": None if rng_state is None else write_value(folder, "rng_state", rng_state),
                "in_place": [{"input": i, "expected": write_value(folder, f"in[{i}]", e),
                              "compiled": None if c is None else write_value(folder, f"in[{i}]", c)}
                             for i, e, c in in_place]}
        with open(os.path.join(folder, GRAPH_SOURCE), "w") as f:
            f.write(source)
        self.metas[name] = meta
        self._write_meta(name)
        self.manifest["graphs"].append({"name": name, "kind": kind, "graph": graph, "call": call,
                                        "signature": signature, "nodes": case.num_nodes,
                                        "source_sha256": hashlib.sha256(source.encode()).hexdigest()})
        self._write_manifest()
        return name

    def skip(self, kind: str, graph: int, call: int, reason: str) -> None:
        """A call that should have been saved and was not: the manifest says so, and why."""
        # whole lines, the first few: a reason cut mid-line may lose the part that helps
        self.manifest["skipped"].append({"kind": kind, "graph": graph, "call": call,
                                         "reason": "\n".join(str(reason).splitlines()[:3])})
        self._write_manifest()

    def set_timing(self, name: str, timing: dict, per_kernel: Optional[dict] = None) -> None:
        """A graph's compiled call times (a Timing.to_dict() record), and per kernel when known
        ({kernel: record})."""
        if name in self.metas and timing and timing.get("times_s"):
            self.metas[name]["timing"] = dict(timing, per_kernel=per_kernel or None)
            self._write_meta(name)
            self.manifest["timings"] = True

    def finish(self) -> None:
        self._write_manifest()

    def _write_meta(self, name: str) -> None:
        _write_json(os.path.join(self.directory, name, META), self.metas[name])

    def _write_manifest(self) -> None:
        _write_json(os.path.join(self.directory, MANIFEST), self.manifest)


def _version(metadata) -> str:
    try:
        return metadata.version("tdbg")
    except metadata.PackageNotFoundError:
        return "unknown"


def _fetch(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _write_json(path: str, doc: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)
