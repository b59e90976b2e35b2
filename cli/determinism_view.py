"""`tdbg run --check-determinism`: the verdict's determinism records -> the run's outcome and lines.

The records are minifier/diagnose/determinism.py's, one per graph (`graphs[i].determinism`).
A graph whose compiled runs differ makes the run fail at stage `nondeterministic` (its own exit
code), with the graph, first differing FX node, kernel and user line in the error, as every
other failure of `tdbg run` has them. Eager's own nondeterminism never fails the run: it is
printed as a note (the backend is not to blame for it).
"""
from __future__ import annotations

from typing import Optional

WORDS = "a compiled graph gave different bits on two runs of the same inputs and RNG state"
MAX_VALUES = 4     # differing values named in the message (the rest are counted)


def _records(verdict: dict) -> list:
    return [g for g in verdict.get("graphs") or [] if g.get("determinism")]


def fail_if_nondeterministic(verdict: dict) -> None:
    """An OK verdict of a --check-determinism run whose compiled runs differed becomes a failure
    at stage nondeterministic, on the first such graph (the others stay in graphs[])."""
    if not verdict.get("check_determinism"):
        return
    bad = next((g for g in _records(verdict) if g["determinism"]["nondeterministic"]), None)
    if bad is None:
        return
    d = bad["determinism"]
    node = d.get("first_node") or {}
    part = "forward" if any(not v["path"].startswith("grad of ") for v in d["compiled"]) else "backward"
    verdict.update(status="failed", stage="nondeterministic",
                   error={"type": "nondeterministic", "message": _message(d), "graph": bad["index"],
                          "frame": bad.get("frame"), "call": d["call"],
                          "during": "backward" if part == "backward" else "run", "part": part,
                          "source": node.get("source"), "source_lines": [],
                          "fx_node": _node_text(node), "kernel": node.get("kernel"),
                          "evidence": d, "traceback": ""})


def _node_text(node: dict) -> Optional[str]:
    if not node.get("node"):
        return None
    level = {"aten": " in the aten graph", "aten backward": " in the backward aten graph"}.get(node.get("level"), "")
    return f"{node['node']} ({node['op']}{level})"


def _message(d: dict) -> str:
    values = d["compiled"]
    lines = [f"{v['path']} ({v['dtype']}{v['shape']}): {v['message']}" for v in values[:MAX_VALUES]]
    if len(values) > MAX_VALUES:
        lines.append(f"... and {len(values) - MAX_VALUES} more value(s)")
    lines.append(d["message"])
    if d.get("reason"):
        lines.append(f"reason: {d['reason']}")
    lines += d.get("notes") or []
    return (f"graph {d['graph']} call {d['call']}: {len(values)} value(s) differ between two compiled runs:\n"
            + "\n".join(lines))


def ok_text(verdict: dict) -> str:
    """What the OK line adds: on how many graphs and calls determinism was checked."""
    if not verdict.get("check_determinism"):
        return ""
    graphs = verdict.get("graphs") or []
    checked = [g for g in _records(verdict) if g["determinism"]["verdict"] != "unchecked"]
    grads = sum(1 for g in checked if g["determinism"].get("grads_checked"))
    calls = sum(len(g.get("determinism_calls") or [1]) for g in checked)
    # which calls: the same bits on call 1 says nothing of a later call with other input shapes
    return (f"; determinism checked on {len(checked)} of {len(graphs)} graph(s) at {calls} call(s) (each graph's "
            f"first call and each call with new input shapes): the same bits on two compiled runs "
            f"(gradients on {grads})")


def note_lines(verdict: dict) -> list:
    """(label, text) lines: graphs never called (so never checked), eager's own nondeterminism,
    and notes of the checks."""
    if not verdict.get("check_determinism"):
        return []
    lines = []
    for g in verdict.get("graphs") or []:
        d = g.get("determinism")
        if d is None:
            if not verdict.get("check_policy"):   # else the accuracy lines already say it was never called
                lines.append(("not checked", f"graph {g['index']}: never called, so its determinism was not checked"))
            continue
        if d["verdict"] == "unchecked":
            lines.append(("not checked", f"graph {g['index']}: " + "; ".join(d.get("notes") or [d["message"]])))
            continue
        if d["eager"]:
            names = ", ".join(v["path"] for v in d["eager"][:MAX_VALUES])
            lines.append(("eager nondeterministic", f"graph {g['index']}: eager itself gave different bits on two "
                          f"runs ({names}): eager is nondeterministic here, not the backend"))
        if d.get("draws_random") and verdict.get("check_policy"):
            # the accuracy check makes random ops draw eager's stream (runner._eager_random_numbers)
            lines.append(("note", f"graph {g['index']} draws random numbers: with the accuracy check on they came "
                          "from eager's generator, so the backend's own random-number code was not checked for "
                          "determinism (--no-check-accuracy checks it)"))
        if verdict.get("stage") != "nondeterministic" or verdict.get("error", {}).get("graph") != g["index"]:
            lines += [("note", f"graph {g['index']}: {n}") for n in d.get("notes") or []]
    return lines
