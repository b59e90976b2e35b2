"""Shapes: which input dims a compiled frame kept static, dynamic or specialized, where each shape
guard and specialization was made, and which size guard made a recompile.

Two halves, one per process:
- In the run's child (runs/instrument.py calls them): `capture(gm, example_inputs)` at the backend
  call, inside Dynamo's trace, holds the frame's ShapeEnv, compile id, tensor inputs and the files
  Dynamo traced; `describe(captured)` at guard export (after the backend, so guards a backend adds
  while compiling are there too) turns it into plain data. Where a guard was made comes from
  ShapeEnv itself: each ShapeGuard's SLoc (the user line Dynamo was running, and the framework
  function that asked: Dynamo evaluating a Python condition, or an op's shape rule), each
  specialization's `specialization_stacks` / `replacements_slocs`. torch shortens file names in an
  SLoc by cutting a prefix (`/work/x/f.py` can become `ork/x/f.py`), so the full path is recovered
  from the files Dynamo traced (the one ending in the short name whose line holds that code).
- In the parent (pure data, no torch): `frame_record` names each guard's cause and fix (CAUSES),
  `link_recompile` finds the guard that failed in the compile it belongs to (by compile id, then the
  line Dynamo wrote after it, then the size it names) and `storms` names dims that never stabilize.

Every location is reported as the file (relative to the current folder when inside it, else the
full path) and line; a cause that cannot be found is reported as unknown, never guessed.
"""
from __future__ import annotations

import linecache
import os
import re
from collections import Counter
from typing import Optional

# A dim of one frame recompiled for at least this many different sizes is a recompile storm.
STORM_SIZES = 4

SIZE_SOURCE = re.compile(r"(?P<name>[\w.\[\]']+)\.size\(\)\[(?P<dim>\d+)\]")
_USER_LOC = re.compile(r"^(?P<code>.*?)\s+#\s+(?P<file>[^#]+?):(?P<line>\d+) in (?P<function>\S+)$")
_SIZE_MISMATCH = re.compile(r"tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. "
                            r"expected (?P<old>\d+), actual (?P<new>\d+)")
_FAILURE = re.compile(r"^(?P<cid>\d+/\d+): (?P<guard>[^#\n]*?)\s*(?:#\s*(?P<code>.*?)\s*#\s*"
                      r"(?P<file>[^#\n]+?):(?P<line>\d+) in \S+.*)?$")
_CONSTRAINT = re.compile(r"You marked (?P<source>\S+) as dynamic but your code specialized it to be a constant "
                         r"\((?P<value>[^)]+)\).*?User stack:.*File \"(?P<file>[^\"]+)\", line (?P<line>\d+), "
                         r"in \S+\n\s*(?P<code>[^\n]+)", re.S)

# Who asked for a guard, by the framework function ShapeEnv recorded (its SLoc's framework_loc):
# (pattern on "torch-relative file:function", kind, cause in plain words, fix). First match wins.
CAUSES = (
    (r"^_dynamo/", "condition",
     "a Python condition on a size in your code (Dynamo evaluates it while tracing, keeps the side it took, "
     "and guards that the next call takes the same side)",
     "avoid branching on the size (compute both sides and torch.where, or torch.cond); if the condition always "
     "holds, torch._check({expr}) states it without a branch; else each side needs its own graph"),
    (r"^(_refs|_prims_common|_prims|_meta_registrations|_decomp|_subclasses|fx/experimental)/", "op",
     "the shape rule of {op} ({framework}: it needs this relation between sizes to compute its output shape)",
     ("a literal size in the op made the dim a constant: derive the op's sizes from the input (e.g. "
      "x.view(-1, n), not x.view(4, n)) to keep it dynamic",
      "nothing to change: one graph serves every call whose sizes keep this relation (a call breaking it is "
      "an error in eager too, or recompiles)")),
    (r"^_inductor/|^_functorch/_aot_autograd/aot_autograd_result\.py:_check_guards$", "backend",
     "the backend's compile: AOTAutograd/Inductor added it while compiling this graph, e.g. choosing kernels for a "
     "size range (asked by {framework}; a cached compile replays its guards), no line of yours",
     "sizes on both sides of the guard each need a graph; mark_dynamic does not remove a backend's guard"),
)
UNKNOWN_CAUSE = ("unknown", "unknown: ShapeEnv recorded no framework function for this guard", "")

# The fix for a dim compiled static whose size then changed; {name}/{dim} filled in.
STATIC_FIX = ("torch._dynamo.mark_dynamic({name}, {dim}) (must stay dynamic) or maybe_mark_dynamic({name}, {dim}) "
              "(may specialize) before the first call keeps one graph for every size")


# ---- in the run's child ------------------------------------------------------------------------

def capture(gm, example_inputs) -> Optional[dict]:
    """What `describe` needs, taken at the backend call (inside Dynamo's trace); None when the
    graph is not being traced by Dynamo (a backend called by hand) or has no ShapeEnv."""
    import torch

    from tdbg.compiler.torch_compat import CompileContext, ShapeEnv, TracingContext
    tc = TracingContext.try_get()
    env = getattr(getattr(tc, "fake_mode", None), "shape_env", None)
    if not isinstance(env, ShapeEnv):
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    inputs = []
    for node, real in zip(placeholders, example_inputs):
        arg = node.meta.get("grapharg")   # Dynamo's GraphArg: where the input came from
        source = getattr(arg, "source", None)
        if source is not None and isinstance(real, torch.Tensor):
            inputs.append((source.name, tuple(real.shape)))
    return {"env": env, "compile_id": str(CompileContext.current_compile_id()), "inputs": inputs,
            "files": sorted({c.co_filename for c in getattr(tc, "traced_code", None) or []})}


def describe(captured: Optional[dict]) -> Optional[dict]:
    """{compile_id, inputs: [{name, dims: [{dim, size, state, symbol}]}], guards: [{expr, sources,
    file, line, code, function, framework}], specializations: [{source, value, file, line, code,
    function, framework}]} in the user's names (x.size()[0]), or None. A ShapeEnv this code cannot
    read (another torch) gives empty lists and `error`: the run goes on, the report says so."""
    if captured is None:
        return None
    try:
        return _describe(captured)
    except Exception as e:   # a diagnostic must not fail the user's run; the error is reported
        return {"compile_id": captured["compile_id"], "inputs": [], "guards": [], "specializations": [],
                "error": f"{type(e).__name__}: {e}"}


def _describe(captured: dict) -> dict:
    from tdbg.compiler.torch_compat import ShapeGuard
    env, files = captured["env"], captured["files"]
    names = {str(sym): _user_name(sources[0].name) for sym, sources in env.var_to_sources.items() if sources}
    constants = {str(sym): str(value) for sym, value in env.replacements.items() if getattr(value, "is_number", False)}
    inputs = []
    for source, shape in captured["inputs"]:
        dims = []
        for d, size in enumerate(shape):
            sym = env.source_to_var.get(f"{source}.size()[{d}]")
            state = "static" if sym is None else "specialized" if str(sym) in constants else "dynamic"
            dims.append({"dim": d, "size": int(size), "state": state, "symbol": None if sym is None else str(sym)})
        inputs.append({"name": _user_name(source), "dims": dims})
    guards = []
    for g in env.guards:
        if not isinstance(g, ShapeGuard):
            continue
        expr = str(g.expr)
        guards.append({"expr": _rename(expr, names), "sources": _symbols_in(expr, names),
                       **_where(g.sloc, files)})
    specializations = []
    stacks = {_user_name(s.name): stack for s, stack in env.specialization_stacks.items()}
    for sym, value in constants.items():
        source = names.get(sym, sym)
        sloc = env.replacements_slocs.get(next(s for s in env.replacements if str(s) == sym))
        where = _where(sloc, files) if sloc is not None else _empty_where()
        stack = stacks.get(source)
        if stack:   # full paths: the user stack Dynamo had when it specialized
            last = stack[-1]
            where.update(file=last.filename, line=last.lineno, code=(last.line or "").strip(), function=last.name)
        specializations.append({"source": source, "value": value, **where})
    return {"compile_id": captured["compile_id"], "inputs": inputs, "guards": guards,
            "specializations": specializations}


def _user_name(source: str) -> str:
    """L['x'].size()[0] -> x.size()[0]; L['self']._modules['fc'] -> self.fc (as explain names guards)."""
    text = re.sub(r"\b[LG]\['([^'\]]+)'\]", r"\1", source)
    return re.sub(r"\._(?:modules|parameters|buffers)\['([^'\]]+)'\]", r".\1", text)


def _rename(expr: str, names: dict) -> str:
    return re.sub(r"\b[su]\d+\b", lambda m: names.get(m.group(0), m.group(0)), expr)


def _symbols_in(expr: str, names: dict) -> list:
    return sorted({names[s] for s in re.findall(r"\b[su]\d+\b", expr) if s in names})


def _empty_where() -> dict:
    return {"file": None, "line": None, "code": None, "function": None, "framework": None}


def _where(sloc, files: list) -> dict:
    """The user line (full path) and framework function of one SLoc."""
    where = _empty_where()
    floc = sloc.framework_loc
    if floc is not None and not isinstance(floc, str):
        where["framework"] = f"{_torch_relative(floc.filename)}:{floc.name}"
    elif isinstance(floc, str):
        where["framework"] = floc
    m = _USER_LOC.match(sloc.maybe_user_loc or "")
    if m:
        line = int(m["line"])
        where.update(line=line, code=m["code"].strip(), function=m["function"],
                     file=_full_path(m["file"], line, m["code"].strip(), files))
    return where


def _torch_relative(path: str) -> str:
    parts = path.replace(os.sep, "/").rsplit("/torch/", 1)
    return parts[1] if len(parts) == 2 else path


def _full_path(short: str, line: int, code: str, files: list) -> Optional[str]:
    """The traced file torch shortened to `short`: one ending in it whose `line` holds `code`."""
    if os.path.isabs(short) and os.path.exists(short):
        return short
    matches = [f for f in files if f.endswith(short) and linecache.getline(f, line).strip() == code]
    return matches[0] if len(matches) == 1 else None


# ---- in the parent: explanations ---------------------------------------------------------------

def rel(path: Optional[str]) -> Optional[str]:
    """A path as printed: relative to the current folder when inside it, else in full."""
    if not path:
        return path
    r = os.path.relpath(path)
    return path if r.startswith("..") else r


def location(item: dict) -> Optional[str]:
    """FILE:LINE of a guard or specialization, or None when torch did not record it."""
    return f"{rel(item['file'])}:{item['line']}" if item.get("file") and item.get("line") else None


def cause_of(guard: dict, ops_at: dict, specializes: bool = False) -> dict:
    """{kind, cause, fix} of one recorded guard or specialization: CAUSES by the framework function
    that asked for it; `ops_at` maps (file, line) -> the graph ops made from that line (to name the
    op); `specializes`: it made a dim a constant (an op's fix depends on that)."""
    framework = guard.get("framework") or ""
    ops = ops_at.get((guard.get("file"), guard.get("line"))) or []
    op = " or ".join(dict.fromkeys(ops)) or "an op on this line"
    for pattern, kind, cause, fix in CAUSES:
        if re.search(pattern, framework):
            fix = fix if isinstance(fix, str) else fix[0 if specializes else 1]
            return {"kind": kind, "cause": cause.format(op=op, framework=framework),
                    "fix": fix.format(expr=SIZE_SOURCE.sub(r"\g<name>.size(\g<dim>)", guard.get("expr", "")))}
    kind, cause, fix = UNKNOWN_CAUSE
    return {"kind": kind, "cause": cause, "fix": fix}


def frame_record(frame: str, shapes: dict, ops_at: dict) -> dict:
    """One compile of one frame for the report: dims with their state, guards and specializations
    with FILE:LINE, cause and fix."""
    inputs = [{"name": inp["name"], "dims": [dict(d) for d in inp["dims"]]} for inp in shapes["inputs"]]
    specs = [{**s, "at": location(s), **cause_of(s, ops_at, specializes=True)} for s in shapes["specializations"]]
    made_constant = {(s["at"], s["source"]) for s in specs}
    guards = [{**g, "at": location(g), **cause_of(g, ops_at, any((location(g), src) in made_constant
                                                                   for src in g["sources"]))}
              for g in shapes["guards"]]
    for inp in inputs:   # a specialized dim points at the line that specialized it
        for d in inp["dims"]:
            spec = next((s for s in specs if s["source"] == f"{inp['name']}.size()[{d['dim']}]"), None)
            d["specialized_at"] = spec["at"] if spec and d["state"] == "specialized" else None
    return {"frame": frame, "compile_id": shapes["compile_id"], "inputs": inputs,
            "guards": guards, "specializations": specs, "error": shapes.get("error")}


def link_recompile(reason: str, frames: list) -> Optional[dict]:
    """For one guard failure caused by a size: {compile_id, failed_guard, source, name, dim, old, new
    (the sizes of a static dim), created_at (FILE:LINE or None), code, kind (condition, op, backend,
    static, unknown), cause, fix[, guard_expr]}; None when the failure is not about a size.
    `frames` are frame_record()s; the failure's compile id picks the compile whose guard failed."""
    m = _FAILURE.match(reason.strip().splitlines()[0] if reason.strip() else "")
    if not m:
        return None
    guard, cid = m["guard"].strip(), m["cid"]
    record = next((f for f in frames if f["compile_id"] == cid), None)
    size = _SIZE_MISMATCH.search(guard)
    if size:
        return _static_size(size, cid, guard, record)
    source = SIZE_SOURCE.search(_user_name(guard))
    if not source:
        return None
    src = f"{source['name']}.size()[{source['dim']}]"
    made = _made_guard(record, src, m["line"] and int(m["line"]), m["code"])
    out = {"compile_id": cid, "failed_guard": _user_name(guard), "source": src, "name": source["name"],
           "dim": int(source["dim"]), "old": None, "new": None}
    if made is None:
        return {**out, "created_at": None, "code": None, "cause": "unknown: no recorded guard of compile "
                f"{cid} matches it", "fix": "", "kind": "unknown"}
    return {**out, "created_at": made["at"], "code": made["code"], "cause": made["cause"], "fix": made["fix"],
            "guard_expr": made["expr"], "kind": made["kind"]}


def _made_guard(record: Optional[dict], source: str, line: Optional[int], code: Optional[str]) -> Optional[dict]:
    """The recorded guard behind a failure: the one on the line Dynamo printed after the failed
    guard, else the only guard on that size."""
    if record is None:
        return None
    on_size = [g for g in record["guards"] if source in g["sources"]]
    if line:
        at_line = [g for g in on_size or record["guards"] if g["line"] == line
                   and (not code or (g["code"] or "").strip() == code.strip())]
        if at_line:
            return at_line[0]
    return on_size[0] if len(on_size) == 1 else None


def _static_size(m, cid: str, guard: str, record: Optional[dict]) -> dict:
    """A dim compiled as a constant got another size: either a line specialized it, or Dynamo
    compiled it static (the first compile of a frame assumes static sizes: automatic dynamic)."""
    name, dim = _user_name(m["name"]), int(m["dim"])
    src = f"{name}.size()[{dim}]"
    out = {"compile_id": cid, "failed_guard": _user_name(guard), "source": src, "name": name, "dim": dim,
           "old": int(m["old"]), "new": int(m["new"])}
    spec = next((s for s in (record or {}).get("specializations", []) if s["source"] == src), None)
    if spec is not None:
        return {**out, "created_at": spec["at"], "code": spec["code"], "kind": spec["kind"],
                "cause": f"{src} was specialized to {spec['value']} by {spec['cause']}", "fix": spec["fix"]}
    dims = {(i["name"], d["dim"]): d for i in (record or {}).get("inputs", []) for d in i["dims"]}
    state = (dims.get((name, dim)) or {}).get("state")
    if state == "static":
        return {**out, "created_at": None, "code": None, "kind": "static",
                "cause": f"{src} was compiled static, no line of yours made it so: Dynamo compiles a size it has "
                         "seen once as a constant and makes the dim dynamic when it changes (automatic dynamic "
                         "shapes; when they are off, every new size recompiles)", "fix": STATIC_FIX.format(name=name, dim=dim)}
    return {**out, "created_at": None, "code": None, "kind": "unknown",
            "cause": f"unknown: compile {cid} recorded no reason why {src} was a constant", "fix": ""}


def storms(frame: str, sized: list) -> list:
    """Dims of `frame` that recompiled for STORM_SIZES or more different sizes: [{frame, source,
    recompiles, sizes}]. `sized` are link_recompile() results of that frame's recompiles (one with
    `compiled` False, stopped by Dynamo's recompile limit, adds its size but no recompile)."""
    by_source: dict = {}
    for s in sized:
        entry = by_source.setdefault(s["source"], {"recompiles": 0, "sizes": [], "changes": 0})
        entry["recompiles"] += 1 if s.get("compiled", True) else 0
        entry["changes"] += 1
        for v in (s["old"], s["new"]):
            if v is not None and v not in entry["sizes"]:
                entry["sizes"].append(v)
    return [{"frame": frame, "source": src, "recompiles": e["recompiles"], "sizes": e["sizes"],
             "fix": "make the dim dynamic before the first call (torch._dynamo.mark_dynamic or maybe_mark_dynamic), "
                    "or torch.compile(..., dynamic=True); check that torch._dynamo.config.automatic_dynamic_shapes is "
                    "on and no line specializes the dim (see its recompiles)"}
            for src, e in by_source.items() if e["changes"] >= STORM_SIZES - 1 and len(e["sizes"]) >= STORM_SIZES]


def constraint_violation(error: dict) -> Optional[dict]:
    """mark_dynamic on a dim that a line then specialized stops the run with Dynamo's
    ConstraintViolationError: {source, value, at, code, cause, fix} from its message, else None."""
    m = _CONSTRAINT.search(str((error or {}).get("message") or ""))
    if not m:
        return None
    return {"source": _user_name(m["source"]), "value": m["value"], "at": f"{rel(m['file'])}:{m['line']}",
            "code": m["code"].strip(),
            "cause": "the dim was marked dynamic (torch._dynamo.mark_dynamic) but this line made it a constant",
            "fix": "remove the line's dependence on the exact size (no == with a constant, no literal sizes), or use "
                   "torch._dynamo.maybe_mark_dynamic to allow the specialization"}


def count_states(frames: list) -> dict:
    return dict(Counter(d["state"] for f in frames for i in f["inputs"] for d in i["dims"]))
