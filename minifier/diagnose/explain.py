"""Turn what a run recorded (graphs, break reasons, guards, guard failures) into an explanation.

`build_report(verdict)` takes a runner verdict (run with the user's real backend: a backend adds
guards of its own, e.g. Inductor's on sizes, so only its run shows the real recompiles) and
returns, per compiled function: its graphs with ops and user lines, its graph breaks with a
reason in plain words (grouped by site), a guard summary in the user's names (`self.fc.weight`),
and its recompiles with the guard that failed in user terms and a suggestion. A run that Dynamo
stopped (fullgraph=True turns a graph break into an error) reports that break as `stopped_by`
and among its function's breaks. Pure data in, data out: no torch needed.

Counting, per function: `graph_count` is the number of pieces Dynamo split it into (distinct
frames: the function and its resume points), as `torch._dynamo.explain` reports for one call;
`compiled_graphs` counts every graph compiled (recompiles, and continuations compiled for both
outcomes of a branch, included): the graphs listed. A graph compiled for a piece that already
has one says which (`again_of`: that graph's index) and why (`again`: "recompile" when a guard
failed first, "other_path" when Dynamo reached the same resume point another way, e.g. the other
side of a data-dependent branch: a new code object with the same name). `graph_breaks` is the number of distinct break sites (line,
reason). `recompiles` counts recompilations: the guard failures Dynamo reports before one new
compile of a frame are one recompile (every cached graph's guard fails, one reason each).
"""
from __future__ import annotations

import os
import re
from collections import Counter
from typing import Optional

from tdbg.minifier.runs.names import function_of   # resume functions fold into their user function
from tdbg.minifier.diagnose import shapes

# (pattern on Dynamo's break reason, plain words). First match wins; {0}, {1}... are groups.
BREAK_REASONS = (
    (r"generic_jump|[Dd]ata-dependent (branching|jump)|[Dd]ynamic control flow",
     "data-dependent branch on a tensor value (a Python `if`/`while` on a tensor)"),
    (r"builtin operator `print`", "call to print(): Dynamo cannot put Python I/O in a graph"),
    (r"Tensor\.item\(\)|_local_scalar_dense",
     "reads a tensor value into a Python number (.item(), float(), int(), or .item() of a NumPy value "
     "computed from a tensor); torch._dynamo.config.capture_scalar_outputs = True keeps it in the graph"),
    (r"Tensor\.tolist\(\)", "converts a tensor to a Python list with .tolist()"),
    (r"graph_break\(\)", "an explicit torch._dynamo.graph_break()"),
    (r"marked as skipped|skipped function", "call into a function Dynamo does not trace (skipped)"),
    (r"builtin operator `(\w+)`", "call to the Python builtin {0}(), which Dynamo cannot trace"),
    (r"[Dd]ynamic shape operator.*?`?(aten\.[\w.]+)",
     "an op whose output shape depends on tensor values ({0}); "
     "torch._dynamo.config.capture_dynamic_output_shape_ops = True keeps it in the graph"),
    (r"[Dd]ata dependent operator.*?`?(aten\.[\w.]+)", "an op whose non-tensor result depends on tensor values ({0})"),
    (r"[Uu]nsupported context manager", "an unsupported context manager (`with ...`)"),
    (r"[Uu]nsupported method call|[Uu]nsupported function call", "a call Dynamo cannot trace"),
)

# (pattern on a guard failure, what changed, suggestion)
RECOMPILE_REASONS = (
    (r"tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. expected (?P<old>\S+), actual (?P<new>\S+)",
     "argument `{name}` changed size in dim {dim}: {old} -> {new}",
     "call torch._dynamo.mark_dynamic({name}, {dim}) before the first call (or torch.compile(..., "
     "dynamic=True)) so one graph serves every size"),
    (r"tensor '(?P<name>[^']+)' stride mismatch at index (?P<dim>\d+)\. expected (?P<old>\S+), actual (?P<new>\S+)",
     "argument `{name}` changed layout (stride of dim {dim}: {old} -> {new})",
     "pass `{name}` with one layout, e.g. {name}.contiguous()"),
    (r"tensor '(?P<name>[^']+)' dtype mismatch\. expected (?P<old>\w+), actual (?P<new>\w+)",
     "argument `{name}` changed dtype: {old} -> {new}",
     "each dtype needs its own graph; cast `{name}` to one dtype before the call if the recompiles hurt"),
    (r"tensor '(?P<name>[^']+)' requires_grad mismatch",
     "argument `{name}` changed requires_grad",
     "call with the same requires_grad every time (or detach() it)"),
    (r"tensor '(?P<name>[^']+)' (?P<what>[\w ]+) mismatch",
     "argument `{name}` changed {what}", "keep `{name}`'s {what} the same between calls"),
    (r"(?P<lo>\d+) <= (?P<name>[\w.]+)\.size\(\)\[(?P<dim>\d+)\] <= (?P<hi>\d+)",
     "argument `{name}` left the size range {lo}..{hi} in dim {dim} that the compiled graph assumed",
     "a guard on that size made the range (see the shapes section for the line that made it, when torch "
     "recorded one); sizes on both sides of it each need a graph"),
    (r"(?P<name>[\w.]+)\.size\(\)\[(?P<dim>\d+)\]",
     "a condition on the size of `{name}` in dim {dim} no longer holds",
     "the graph was compiled assuming it; keep `{name}`'s dim {dim} on one side of it if the recompiles hurt"),
    (r"^___stack\d+ == (?P<old>[^\s#]+)",
     "a Python number computed by the previous graph changed (was {old})",
     "keep the value in a tensor, or set torch._dynamo.config.capture_scalar_outputs = True"),
    (r"len\((?P<name>[^)]+)\) == (?P<old>\d+)",
     "the length of {name} changed (was {old})", "pass sequences of one length, or a stacked tensor"),
    (r"^(?:L\[')?(?P<name>\w+)(?:'\])? == (?P<old>[^\s#]+)",
     "Python value `{name}` changed (the graph was specialised to {old})",
     "pass it as a tensor, or torch.compile(..., dynamic=True) to treat numbers symbolically"),
    (r"GRAD_MODE|grad_mode", "grad mode changed (torch.no_grad() versus enabled)",
     "run every call under the same grad mode"),
    (r"___check_obj_id\((?P<name>[^,]+)", "{name} is a different object than when compiled",
     "keep the same object (module, function, global) between calls"),
    (r"___check_type_id\((?P<name>[^,]+)", "{name} changed type", "pass the same type every call"),
)


def plain_break_reason(reason: str) -> str:
    for pattern, words in BREAK_REASONS:
        m = re.search(pattern, reason, re.S)
        if m:
            return words.format(*m.groups())
    return _first_line(reason)


def plain_recompile(reason: str) -> dict:
    """{'changed', 'suggestion', 'guard', 'line'} for one guard-failure text from Dynamo."""
    guard = source_names(re.sub(r"^\d+/\d+:\s*", "", _first_line(reason)))
    code = re.search(r"#\s*(?P<code>.+?)\s*#\s*(?P<where>\S+:\d+)", guard)
    guard_expr = guard.split("#")[0].strip()
    # Dynamo's `# FILE:LINE` after a guard has torch's shortened path (a prefix cut off): only a
    # path that exists is kept; explain's shapes put a size guard at its full path
    where = code.group("where") if code else None
    line = _user_stack_line(reason) or (where if where and os.path.exists(where.rsplit(":", 1)[0]) else None)
    for pattern, changed, suggestion in RECOMPILE_REASONS:
        m = re.search(pattern, guard_expr)
        if m:
            fields = m.groupdict()
            return {"changed": changed.format(**fields), "suggestion": suggestion.format(**fields),
                    "guard": guard_expr, "line": line}
    return {"changed": f"guard failed: {guard_expr}", "suggestion": "", "guard": guard_expr, "line": line}


def source_names(text: str) -> str:
    """Dynamo's guard sources in the user's spelling: L['self']._modules['fc']._parameters['weight']
    -> self.fc.weight (locals L[...] and globals G[...] by name, module children by attribute)."""
    text = re.sub(r"\b[LG]\['([^'\]]+)'\]", r"\1", text)
    return re.sub(r"\._(?:modules|parameters|buffers)\['([^'\]]+)'\]", r".\1", text)


def _user_stack_line(reason: str) -> Optional[str]:
    m = re.search(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in \S+\n\s+(?P<code>.+)', reason)
    return f"{_rel(m['file'])}:{m['line']}  {m['code'].strip()}" if m else None


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")


def _rel(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _site(frame: dict) -> str:
    return f"{_rel(frame['file'])}:{frame['line']}  {frame['code']}"


def build_report(verdict: dict) -> dict:
    functions: dict = {}
    for graph in verdict.get("graphs") or []:
        fn = _function(functions, function_of(graph["frame"]))
        ops = Counter(graph["ops"])
        fn["graphs"].append({"index": graph["index"], "frame": graph["frame"], "op_count": len(graph["ops"]),
                             "ops": dict(ops.most_common()), "lines": graph.get("lines") or []})
        if graph.get("graph_break"):
            _add_break(fn, graph)
    for guards in verdict.get("guards") or []:
        fn = _function(functions, function_of(guards["frame"]))
        _merge_guards(fn["guards"], guards)
        if guards.get("shapes"):
            fn["shapes"]["frames"].append(shapes.frame_record(guards["frame"], guards["shapes"], _ops_at(fn)))
    for group in _recompile_groups(verdict.get("recompiles") or []):
        fn = _function(functions, function_of(group[0]["frame"]))
        first = plain_recompile(group[0]["reason"])
        size = _size_cause(first, group[0], fn)
        others = sorted({plain_recompile(r["reason"])["changed"] for r in group[1:]} - {first["changed"]})
        fn["recompiles"].append({"frame": group[0]["frame"], **first, "failed_guards": len(group),
                                 "also": others, "size": size, "compiled": True,
                                 "dynamo_reasons": [r["reason"] for r in group]})
    for limit in verdict.get("recompile_limits") or []:
        _limit_hit(_function(functions, function_of(limit["frame"])), limit)
    stopped = stopped_by(verdict)
    if stopped:
        fn = _function(functions, stopped["function"])
        fn["breaks"].append({k: stopped[k] for k in ("line", "reason", "dynamo_reason", "user_stack", "count")}
                            | {"stopped_compilation": True})
    recompiled = {(f["frame"], f.get("graphs_before")) for f in verdict.get("recompiles") or []}
    violation = shapes.constraint_violation(verdict.get("error") or {})
    for fn in functions.values():
        first_of: dict = {}
        for g in fn["graphs"]:
            earlier = first_of.setdefault(g["frame"], g["index"])
            g["again_of"] = None if earlier == g["index"] else earlier
            g["again"] = None if g["again_of"] is None else (
                "recompile" if (g["frame"], g["index"]) in recompiled else "other_path")
        sized = [dict(r["size"], compiled=r["compiled"]) for r in fn["recompiles"] if r["size"]]
        fn["shapes"]["storms"] = shapes.storms(fn["function"], sized)
        fn["shapes"]["dims"] = shapes.count_states(fn["shapes"]["frames"])
        fn["graph_count"] = len({g["frame"] for g in fn["graphs"]})
        fn["compiled_graphs"] = len(fn["graphs"])
        fn["graph_breaks"] = len(fn["breaks"])
        fn["recompile_count"] = sum(1 for r in fn["recompiles"] if r["compiled"])
        if fn.get("recompile_limit"):
            for storm in fn["shapes"]["storms"]:   # the storm did not end: Dynamo gave up on it
                storm["cut_by"] = fn["recompile_limit"]["limit"]
    totals = {"functions": len(functions),
              "graphs": sum(f["graph_count"] for f in functions.values()),
              "compiled_graphs": sum(f["compiled_graphs"] for f in functions.values()),
              "graph_breaks": sum(f["graph_breaks"] for f in functions.values()),
              "recompiles": sum(f["recompile_count"] for f in functions.values())}
    totals["recompile_storms"] = sum(len(f["shapes"]["storms"]) for f in functions.values())
    return {"totals": totals, "functions": list(functions.values()), "stopped_by": stopped,
            "shape_violation": violation}


def _ops_at(fn: dict) -> dict:
    """(file, line) -> the graph ops made from that user line, over the function's graphs so far."""
    ops: dict = {}
    for g in fn["graphs"]:
        for ln in g["lines"]:
            ops.setdefault((ln.get("file"), ln.get("line")), []).extend(ln.get("ops") or [])
    return ops


def _size_cause(plain: dict, failure: dict, fn: dict) -> Optional[dict]:
    """The size guard behind a recompile (shapes.link_recompile), also put into its plain words:
    the line that made the guard replaces the line Dynamo printed, its fix the generic one."""
    sized = shapes.link_recompile(failure["reason"], fn["shapes"]["frames"])
    if sized is None:
        return None
    if sized["created_at"]:
        plain["line"] = f"{sized['created_at']}  {sized['code']}"
    # a static size that changed keeps the plain fix (mark_dynamic) unless a line specialized it
    if sized["fix"] and (sized["created_at"] or sized["old"] is None):
        plain["suggestion"] = sized["fix"]
    return sized


def stopped_by(verdict: dict) -> Optional[dict]:
    """The graph break that stopped the run, when Dynamo raised it instead of breaking the graph
    (fullgraph=True): {function, line, reason, dynamo_reason, user_stack, count}; else None."""
    err = verdict.get("error") or {}
    if verdict.get("stage") != "dynamo" or err.get("type") != "Unsupported":
        return None
    m = re.match(r"(?P<loc>.+:\d+) in (?P<fn>[^:]+): (?P<code>.*)$", err.get("source") or "")
    line = f"{m['loc']}  {m['code']}" if m else "<unknown line>"
    message = re.sub(r"^Unsupported:\s*", "", str(err.get("message") or ""))
    return {"function": function_of(m["fn"]) if m else "<unknown>", "line": line,
            "reason": plain_break_reason(message), "dynamo_reason": _first_line(message),
            "user_stack": [line], "count": 1}


def _limit_hit(fn: dict, limit: dict) -> None:
    """Dynamo's recompile limit stopped compiling `fn`'s frame: the guard failure that would have
    recompiled it compiled nothing (its recompile is marked so, and not counted), and calls from
    then on that match none of the frame's graphs ran uncompiled."""
    reason = limit.get("reason") or ""
    hit = next((r for r in reversed(fn["recompiles"]) if r["compiled"] and reason and any(
        reason == d or reason.endswith(d) or d.endswith(reason) for d in r["dynamo_reasons"])), None)
    if hit is not None:
        hit["compiled"] = False
    at = f"{_rel(limit['file'])}:{limit['line']}" if limit.get("file") else None
    fn["recompile_limit"] = {
        "limit": limit["limit"], "value": limit["value"], "at": at, "reason": reason,
        "words": f"Dynamo stopped compiling {limit['frame']} at {limit['limit']} = {limit['value']}: the call that "
                 "would have recompiled it, and every later call matching none of its graphs, ran uncompiled "
                 "(eager)",
        "fix": f"remove the recompiles' cause (see them); raising {limit['limit']} only delays the stop"}


def _recompile_groups(failures: list) -> list:
    """Guard failures of one frame before the same next compile form one recompile."""
    groups: dict = {}
    for f in failures:
        groups.setdefault((f["frame"], f.get("graphs_before")), []).append(f)
    return list(groups.values())


def _function(functions: dict, name: str) -> dict:
    return functions.setdefault(name, {"function": name, "graphs": [], "breaks": [], "recompiles": [],
                                       "guards": {"total": 0, "by_kind": {}, "tensors": []},
                                       "shapes": {"frames": [], "storms": [], "dims": {}}})


def _add_break(fn: dict, graph: dict) -> None:
    site = _site(graph["stack"][-1]) if graph.get("stack") else "<unknown line>"
    plain = plain_break_reason(graph["reason"])
    for b in fn["breaks"]:
        if b["line"] == site and b["reason"] == plain:
            b["count"] += 1
            return
    fn["breaks"].append({"line": site, "reason": plain, "dynamo_reason": _first_line(graph["reason"]),
                         "user_stack": [_site(f) for f in graph.get("stack") or []], "count": 1})


def _merge_guards(summary: dict, guards: dict) -> None:
    summary["total"] += guards["total"]
    for kind, n in guards["by_kind"].items():
        summary["by_kind"][kind] = summary["by_kind"].get(kind, 0) + n
    for name in map(source_names, guards["tensors"]):
        if name not in summary["tensors"]:
            summary["tensors"].append(name)


def exceeded(report: dict, max_graph_breaks: Optional[int], max_recompiles: Optional[int]) -> list:
    """Threshold violations as sentences; empty when within limits."""
    totals, problems = report["totals"], []
    if max_graph_breaks is not None and totals["graph_breaks"] > max_graph_breaks:
        problems.append(f"{totals['graph_breaks']} graph break(s) > --max-graph-breaks {max_graph_breaks}")
    if max_recompiles is not None and totals["recompiles"] > max_recompiles:
        problems.append(f"{totals['recompiles']} recompile(s) > --max-recompiles {max_recompiles}")
    return problems
