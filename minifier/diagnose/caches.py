"""Why a compile cache hit, missed or was bypassed: `tdbg explain --caches`.

Three cache layers are recorded, each by the structured-trace (TORCH_TRACE) artifact its owner
emits once per lookup (LAYERS): Inductor's FX graph cache (`fx_graph_cache_{hit,miss,bypass}`),
the AOTAutograd cache (`aotautograd_cache_*`) and tdbg's own build cache of g++ libraries
(`tdbg_build_cache_*`, compiler/build.py). Each artifact carries the lookup's key and its key
components, one `[hash] name: value` line each (Inductor's FxGraphHashDetails debug lines).

Contract:
- In the run's child, `CacheRecorder(path).install()` appends one JSON line per lookup to `path`:
  {"layer", "state", "compile_id", "frame", "part", "key", "bypass_reason", "components":
  [[name, hash, value]]}, plus one {"dirs": {...}} line with the cache directories. The recorder
  changes no cache key: it adds a handler to torch's trace logger and makes AOTAutograd compute
  its debug lines (it does only when its logger is at DEBUG; records below the logger's former
  level are still dropped, so nothing new is printed).
- `compare(events, earlier)` is pure data: for each lookup of `events` (the second run), its state
  and, for a miss, the earlier lookup of the same layer and part whose key is nearest (fewest
  differing components; the same compile id wins a tie) and every component that differs, each
  named in plain words (COMPONENTS: config key, input metadata field, graph code line, torch
  version, ...). A miss whose key equals an earlier lookup's says so: the entry was not in the cache.
"""
from __future__ import annotations

import difflib
import json
import logging
import os
import re
from typing import Optional

# artifact name prefix -> (layer id, the layer in words)
LAYERS = {
    "fx_graph_cache_": ("inductor_fx_graph", "Inductor FX graph cache"),
    "aotautograd_cache_": ("aot_autograd", "AOTAutograd cache"),
    "tdbg_build_cache_": ("tdbg_build", "tdbg build cache (g++ libraries)"),
}
STATES = ("hit", "miss", "bypass")
DIR_OF = {"inductor_fx_graph": "inductor", "aot_autograd": "inductor", "tdbg_build": "tdbg_build"}   # layer -> its dir

# (pattern on a key component's name, kind of component, how the component is named); first match wins
COMPONENTS = (
    (r"inductor_config\[(.+)\]$", "config", "torch._inductor.config.{0}"),
    (r"inductor_config_comms\[(.+)\]$", "config", "torch._inductor.config (comms) {0}"),
    (r"autograd_config$", "config", "torch._functorch.config (AOTAutograd's config; a pickled blob)"),
    (r"aot_config$", "compile options", "AOTAutograd's options (aot_config)"),
    (r"fx_kwargs\[(.+)\]$", "compile options", "compile_fx option {0}"),
    (r"example_inputs\[(\d+)\]$", "input metadata", "input {0}"),
    (r"gm$", "graph code", "the graph's code"),
    (r"torch_version$", "torch version", "torch's version and source hash"),
    (r"system_info\[(.+)\]$", "system", "system info ({0}: device, compiler, CUDA/ROCm)"),
    (r"toolchain\[(.+)\]$", "toolchain", "g++ toolchain: {0}"),
    (r"unit\[(.+)\]$", "kernel source", "C++ source of {0}"),
    (r"(deterministic_algorithms\w*|cuda_matmul_settings|default_dtype|grad_enabled|disable_amp)$",
     "global torch setting", "{0}"),
    (r"(\w*(?:pass|passes|partitioner_fn|estimator)\w*)(\[.+\])?$", "custom passes", "{0}{1}"),
    (r"(.+)$", "other", "{0}"),
)
_LINE = re.compile(r"\[(\w+)\] (\S+?): (.*)", re.S)
_VALUE_CAP = 4000      # a component value kept for the report (the graph's code: 40000); its hash decides
_FIELD = re.compile(r"(\w+)=")


def _cap(name: str, value: str) -> str:
    cap = 40000 if name == "gm" else _VALUE_CAP
    return value if len(value) <= cap else value[:cap] + "..."


def parse_components(lines) -> list:
    """Inductor-style debug lines -> [[name, hash, value]] (a line of another shape is kept whole as
    its own name with an empty hash)."""
    out = []
    for line in lines or []:
        m = _LINE.match(line)
        if m:
            out.append([m.group(2), m.group(1), _cap(m.group(2), m.group(3))])
        else:
            out.append([line[:200], "", ""])
    return out


def compile_id_text(frame_id, frame_compile_id, attempt=0) -> Optional[str]:
    """Dynamo's compile id as tlparse writes it: `0/1`, `0/1_2` for a later attempt."""
    if frame_id is None:
        return None
    return f"{frame_id}/{frame_compile_id}" + (f"_{attempt}" if attempt else "")


# -- recording, in the child ------------------------------------------------------------------------
class CacheRecorder(logging.Handler):
    """A handler on torch's structured-trace logger writing each cache lookup to a JSON-lines file."""

    def __init__(self, path: str):
        super().__init__(logging.DEBUG)
        self.path, self.strings, self.frames, self.dirs = path, {}, {}, None
        self.settings = None

    def install(self) -> "CacheRecorder":
        from tdbg.compiler.torch_compat import trace_log
        from tdbg.minifier.runs.inductor_hooks import ENTRIES as INDUCTOR
        trace_log.addHandler(self)
        trace_log.setLevel(logging.DEBUG)
        # by name: the module (which imports Inductor) loads only when a backend uses it
        aot_cache_log = logging.getLogger(INDUCTOR.entries["autograd_cache_log"].module)
        floor = aot_cache_log.getEffectiveLevel()
        # AOTAutograd computes its key's debug lines only for a DEBUG logger; drop what it then logs
        # below the level it had, so the run prints what it printed before
        aot_cache_log.setLevel(logging.DEBUG)
        aot_cache_log.addFilter(lambda record: record.levelno >= floor)
        return self

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._record(getattr(record, "metadata", None) or {}, getattr(record, "payload", None))
        except Exception:   # noqa: BLE001 - a record tdbg cannot read must never break the user's compile
            pass

    def _record(self, md: dict, payload) -> None:
        if "str" in md:                               # tlparse's interned file names
            text, index = md["str"]
            self.strings[index] = text
            return
        cid = compile_id_text(md.get("frame_id"), md.get("frame_compile_id"), md.get("attempt") or 0)
        if "dynamo_start" in md:
            stack = md["dynamo_start"].get("stack") or []
            if stack:
                top = stack[-1]
                path = self.strings.get(top.get("filename"), "?")
                self.frames[cid] = f"{top.get('name')} ({_rel(path)}:{top.get('line')})"
            return
        if "compilation_metrics" in md:    # a frame's compile ended: were its caches on?
            settings = cache_settings()
            if settings != self.settings:
                self.settings = settings
                self._write({"settings": settings})
            return
        name = (md.get("artifact") or {}).get("name", "")
        layer = next((v[0] for prefix, v in LAYERS.items() if name.startswith(prefix)), None)
        state = name.rsplit("_", 1)[-1]
        if layer is None or state not in STATES or not payload:
            return
        info = json.loads(payload)
        if self.dirs is None:     # at the first lookup: the layer's module is loaded by now
            self.dirs = _cache_dirs()
            self._write({"dirs": self.dirs})
        components = parse_components(info.get("components"))
        self._write({"layer": layer, "state": state, "compile_id": cid, "frame": self.frames.get(cid),
                     "part": _part(layer, info, components), "key": info.get("key"),
                     "bypass_reason": info.get("cache_bypass_reason"), "components": components})

    def _write(self, event: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")


def _part(layer: str, info: dict, components: list) -> Optional[str]:
    """forward, backward or inference for an Inductor graph (its compile_fx options say); None for
    AOTAutograd (one lookup per Dynamo graph) and for tdbg's builds (build.py does not know the part:
    a graph's builds come in compile order, forward first)."""
    if layer != "inductor_fx_graph":
        return None
    opts = {n: v for n, _, v in components}
    if opts.get("fx_kwargs[is_backward]") == "True":
        return "backward"
    if opts.get("fx_kwargs[is_inference]") == "True":
        return "inference"
    return "forward" if opts else None


def _rel(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _cache_dirs() -> dict:
    """The cache directories this run reads and writes (Inductor's, tdbg's build cache)."""
    from tdbg.compiler import config as tdbg_config
    import sys

    from tdbg.minifier.runs.inductor_hooks import ENTRIES as INDUCTOR
    dirs = {"tdbg_build": tdbg_config.current().cache_dir, "inductor": None}
    if INDUCTOR.entries["inductor_cache_dir"].module in sys.modules:   # never load Inductor for this
        dirs["inductor"] = INDUCTOR.resolve("inductor_cache_dir")()
    return dirs


# A cache turned off makes no lookup at all, so no artifact says so: its setting is read when each
# frame's compile ends (the script may change it). (setting, layers it turns off, how it is set)
SWITCHES = (
    ("torch._inductor.config.force_disable_caches", ("inductor_fx_graph", "aot_autograd"),
     "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 or torch.compiler.config.force_disable_caches"),
    ("torch._inductor.config.fx_graph_cache", ("inductor_fx_graph",), "TORCHINDUCTOR_FX_GRAPH_CACHE=0"),
    ("torch._functorch.config.enable_autograd_cache", ("aot_autograd",), "TORCHINDUCTOR_AUTOGRAD_CACHE=0"),
)


def cache_settings() -> dict:
    """{setting: value} of SWITCHES whose module is loaded (none is imported for this), and
    `inductor_loaded`: whether Inductor's compile ran in this process (its caches matter)."""
    import importlib
    import sys
    out = {}
    for name, _, _ in SWITCHES:
        module, attr = name.rsplit(".", 1)
        if module in sys.modules:
            out[name] = getattr(importlib.import_module(module), attr, None)
    out["inductor_loaded"] = "torch._inductor.compile_fx" in sys.modules
    return out


def turned_off(settings: Optional[dict]) -> list:
    """[{layer, layer_words, setting, how, words}] for each cache layer a setting turned off (the
    first switch that turns a layer off names it), only when Inductor compiled in the run."""
    if not settings or not settings.get("inductor_loaded"):
        return []
    words = {lid: w for lid, w in LAYERS.values()}
    off: dict = {}
    for name, layers, how in SWITCHES:
        value = settings.get(name)
        # force_disable_caches turns caches off when True; the others when False
        disabled = bool(value) if name.endswith("force_disable_caches") else value is False
        for layer in layers if disabled else ():
            off.setdefault(layer, {"layer": layer, "layer_words": words[layer], "setting": f"{name} = {value}",
                                   "how": how, "words": f"{words[layer]}: OFF ({name} = {value}; {how} sets it): "
                                   "no lookup was made, every graph was compiled afresh"})
    return list(off.values())


def read_settings(path: str) -> Optional[dict]:
    """The last cache settings a CacheRecorder wrote to `path` (None when no compile ended)."""
    from tdbg.minifier.runs.runner import read_jsonl
    found = [e["settings"] for e in read_jsonl(path) if "settings" in e]
    return found[-1] if found else None


def read_events(path: str) -> tuple:
    """(lookups, cache dirs) a CacheRecorder wrote to `path` ([] and {} when none)."""
    from tdbg.minifier.runs.runner import read_jsonl
    lines = read_jsonl(path)
    dirs = next((e["dirs"] for e in lines if "dirs" in e), {})
    return [e for e in lines if "layer" in e], dirs


# -- comparing, in the parent ---------------------------------------------------------------------
def component_words(name: str) -> tuple:
    """(kind, plain name) of a key component (COMPONENTS)."""
    for pattern, kind, template in COMPONENTS:
        m = re.match(pattern, name)
        if m:
            return kind, template.format(*(g or "" for g in m.groups()))
    return "other", name    # unreachable: the last row matches every name


def differences(before: list, after: list) -> list:
    """The key components whose hash differs between two lookups (or that only one has), each
    {component, kind, what, before, after, detail}: `detail` says what changed in plain words."""
    b = {n: (h, v) for n, h, v in before}
    a = {n: (h, v) for n, h, v in after}
    out = []
    for name in list(a) + [n for n in b if n not in a]:
        old, new = b.get(name), a.get(name)
        if old and new and old[0] == new[0]:
            continue
        kind, what = component_words(name)
        ov, nv = (old or (None, None))[1], (new or (None, None))[1]
        out.append({"component": name, "kind": kind, "what": what, "before": _shown(ov), "after": _shown(nv),
                    "detail": _detail(kind, what, ov, nv)})
    return out


def _shown(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    if any(not c.isprintable() and c not in "\n\t" for c in value):
        return "(binary)"
    return value if len(value) <= 200 else value[:200] + "..."


def _detail(kind: str, what: str, old: Optional[str], new: Optional[str]) -> str:
    if old is None or new is None:
        return f"{what} {'appeared' if old is None else 'disappeared'}"
    if _shown(old) == "(binary)" or _shown(new) == "(binary)":
        return f"{what} changed"
    if kind == "graph code":
        return _code_change(old, new)
    if kind == "kernel source":     # "N kernel(s), sha256 X (cached)": the digests say it
        digests = [m.group(1) if m else v for v, m in ((v, re.search(r"sha256 (\w+)", v)) for v in (old, new))]
        return f"{what} changed (sha256 {digests[0]} -> {digests[1]})"
    if kind == "input metadata":
        changed = _field_changes(old, new)
        if changed:
            return f"{what}: " + "; ".join(changed)
    return f"{what} changed {_shown(old)} -> {_shown(new)}"


def _code_change(old: str, new: str) -> str:
    a, b = old.splitlines(), new.splitlines()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            was = a[i1].strip() if i1 < i2 else "(nothing)"
            now = b[j1].strip() if j1 < j2 else "(removed)"
            return f"graph code changed at line {j1 + 1}: `{was}` -> `{now}`"
    return "graph code changed (same text, other hash: a constant or an attribute of the graph module)"


def _fields(value: str) -> dict:
    """TensorMetadata(dtype=..., shape=torch.Size([8, 16]), ...) -> {field: text} (top level only)."""
    inner = value[value.find("(") + 1: value.rfind(")")] if "(" in value else value
    out, depth, start = {}, 0, 0
    for i, c in enumerate(inner + ","):
        depth += c in "([{"
        depth -= c in ")]}"
        if c == "," and depth == 0:
            part = inner[start:i].strip()
            m = _FIELD.match(part)
            if m:
                out[m.group(1)] = part[m.end():].replace("torch.Size(", "").rstrip(")") \
                    if m.group(1) == "shape" else part[m.end():]
            start = i + 1
    return out


def _field_changes(old: str, new: str) -> list:
    a, b = _fields(old), _fields(new)
    return [f"{k} {a.get(k)} -> {b.get(k)}" for k in list(b) + [k for k in a if k not in b] if a.get(k) != b.get(k)]


def _nearest(event: dict, earlier: list) -> tuple:
    """(the earlier lookup nearest to `event`'s key, its differences) among those of the same layer
    and part that have components; (None, []) when there is none."""
    same = [e for e in earlier if e["layer"] == event["layer"] and e.get("part") == event.get("part")
            and e.get("components")]
    if not same:
        return None, []
    scored = [(len(differences(e["components"], event["components"])), e.get("compile_id") != event.get("compile_id"),
               i, e) for i, e in enumerate(same)]
    best = min(scored, key=lambda s: s[:3])[3]
    return best, differences(best["components"], event["components"])


def explain_lookup(event: dict, earlier: list) -> dict:
    """One lookup of the compared run: its state, what it was compared with and why it missed."""
    row = {k: event.get(k) for k in ("layer", "part", "state", "key", "compile_id", "frame", "bypass_reason")}
    row.update(layer_words=next(w for lid, w in LAYERS.values() if lid == event["layer"]),
               compared_with=None, differences=[], why=None)
    if event["state"] == "bypass":
        row["why"] = f"bypassed: {event.get('bypass_reason') or 'no reason given'}"
        return row
    if event["state"] == "hit":
        return row
    same_key = next((e for e in earlier if e["layer"] == event["layer"] and e.get("key") and
                     e.get("key") == event.get("key")), None)
    if same_key is not None:
        row["compared_with"] = same_key.get("compile_id")
        row["why"] = (f"the key equals the earlier lookup's ({same_key.get('compile_id')}, {same_key['state']}), but "
                      "no usable entry was found: the earlier run did not save it (it failed or bypassed a layer "
                      "below), the cache directory differs or was cleared, or the entry's shape guards failed")
        return row
    if not event.get("components"):
        row["why"] = "no key components were recorded for this lookup"
        return row
    nearest, diffs = _nearest(event, earlier)
    if nearest is None:
        row["why"] = "no earlier lookup of this layer and part to compare with (a new graph)"
        return row
    row["compared_with"] = nearest.get("compile_id")
    row["differences"] = diffs
    row["why"] = "; ".join(d["detail"] for d in diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
    return row


def compare(events: list, earlier: list, against: str) -> dict:
    """The `caches` section of explain's report: the compared run's lookups grouped by compile id
    (in the order Dynamo compiled them), each explained against `earlier` (named by `against`)."""
    graphs: dict = {}
    for i, e in enumerate(events):
        g = graphs.setdefault(e.get("compile_id"), {"compile_id": e.get("compile_id"), "frame": e.get("frame"),
                                                   "lookups": []})
        g["frame"] = g["frame"] or e.get("frame")
        # "earlier" is the other run and this run's lookups before this one (a recompile's nearest
        # entry may be a graph of the same run)
        g["lookups"].append(explain_lookup(e, list(earlier) + events[:i]))
    totals = {layer: {s: 0 for s in STATES} for layer, _ in LAYERS.values()}
    for e in events:
        totals[e["layer"]][e["state"]] += 1
    return {"against": against, "graphs": list(graphs.values()),
            "totals": {k: v for k, v in totals.items() if any(v.values())}}


# -- the runs -----------------------------------------------------------------------------------------
def load_saved(path: str) -> list:
    """The lookups of an earlier `tdbg explain --caches --json` document (its compared run).
    Raises ValueError with a one-paragraph message when `path` is not such a document."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise ValueError(f"cannot read --against {path!r}: {e.strerror or e}.") from None
    except ValueError as e:
        raise ValueError(f"--against {path!r} is not JSON ({e}); give the --json document of an earlier "
                         "`tdbg explain --caches` run.") from None
    lookups = ((doc.get("caches") or {}).get("lookups") if isinstance(doc, dict) else None)
    if not isinstance(doc, dict) or doc.get("schema") != "tdbg.explain" or not isinstance(lookups, list):
        raise ValueError(f"--against {path!r} is not the --json document of a `tdbg explain --caches` run "
                         "(schema tdbg.explain with a caches.lookups list).")
    return lookups


def explain_caches(request, against: Optional[str] = None) -> tuple:
    """Run `request` (a runner.RunRequest) with every cache lookup recorded and explain each one
    against the lookups of an earlier run: the saved document `against` (load_saved), else a first
    run of the same request just before, in its own fresh process with the same cache directories.
    Returns (the compared run's verdict, the `caches` section: compare()'s fields plus `first_run`
    {status, stage, duration_s} (None with `against`), `cache_dirs` and `lookups`, every lookup of
    the compared run with its key components, which a later --against reads)."""
    import dataclasses
    import tempfile

    from tdbg.minifier.runs.runner import run_script
    earlier = load_saved(against) if against else None
    with tempfile.TemporaryDirectory(prefix="tdbg-caches-") as tmp:
        first = None
        if earlier is None:
            path = os.path.join(tmp, "first.jsonl")
            verdict = run_script(dataclasses.replace(request, cache_events=path))
            first = {k: verdict.get(k) for k in ("status", "stage", "duration_s")}
            earlier = read_events(path)[0]
        path = os.path.join(tmp, "second.jsonl")
        verdict = run_script(dataclasses.replace(request, cache_events=path))
        events, dirs = read_events(path)
        settings = read_settings(path)
    section = compare(events, earlier, against or "the first run of this command")
    section.update(settings=settings, turned_off=turned_off(settings))
    used = {DIR_OF[e["layer"]] for e in events}    # a directory no lookup read would only mislead
    section.update(first_run=first, cache_dirs={k: v for k, v in dirs.items() if k in used}, lookups=events)
    return verdict, section


def summary_words(section: dict) -> list:
    """One phrase per cache layer that was looked up: `AOTAutograd cache: 1 miss`."""
    words = {lid: w for lid, w in LAYERS.values()}
    return [f"{words[layer]}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
            for layer, counts in section["totals"].items()]
