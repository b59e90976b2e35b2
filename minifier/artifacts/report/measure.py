"""The report's sections for measuring commands: `tdbg profile` (time per callable, kernel tables,
the Chrome trace) and `tdbg memory` (peaks per graph and call, live bytes over each call, the
buffers alive at each peak). Builders as in sections.py (SECTIONS lists them)."""
from __future__ import annotations

import os

from .page import h, line_chart, table


def _num(x):
    return "" if x is None else f"{x:.6g}" if isinstance(x, float) else str(x)


def profile_section(ctx: dict):
    doc = ctx["document"]
    if doc.get("schema") != "tdbg.profile" or doc.get("status") == "error":
        return None
    parts = [table(["callable", "calls in script", "eager ms", "compiled ms", "speedup", "first call s"],
                   [(c["label"], c["calls_in_script"], _ms(c.get("eager_s")), _ms(c.get("compiled_s")),
                     "-" if c.get("speedup") is None else f"{c['speedup']:.2f}x", f"{c['first_call_s']:.3f}")
                    for c in doc.get("callables") or []], numeric=(1, 2, 3, 4, 5), ident="callables")]
    for key, title in (("profiler_rows", "Compiled run: self CPU time per kernel/op"),
                       ("eager_profiler_rows", "Eager run: self CPU time per op")):
        rows = doc.get(key) or []
        if rows:
            parts.append(f"<h3>{h(title)}</h3>" + table(
                ["name", "calls", "self CPU us", "total CPU us", "self %"],
                [(r["name"], r.get("calls"), _num(r.get("self_cpu_us")), _num(r.get("cpu_total_us")),
                  _num(r.get("self_cpu_pct"))) for r in rows[:20]], numeric=(1, 2, 3, 4),
                ident="kernels-compiled" if key == "profiler_rows" else "kernels-eager"))
    if doc.get("trace_path"):
        path = os.path.abspath(doc["trace_path"])
        parts.append(f'<p>Chrome trace: <a id="trace-link" href="file://{h(path)}">{h(path)}</a> '
                     '<span class="note">(open it in chrome://tracing or ui.perfetto.dev)</span></p>')
    for f in doc.get("flags") or []:
        parts.append(f"<div class=\"bad\">{h(f['kind'])}: {h(f['message'])}</div>")
    return "".join(parts)


MEMORY_CHARTS = 12   # live-bytes charts drawn at most (one per measured call, in call order)


def memory_section(ctx: dict):
    """tdbg memory: peaks per graph and call, then live bytes over each call, eager vs compiled."""
    doc = ctx["document"]
    if doc.get("schema") != "tdbg.memory" or doc.get("status") == "error":
        return None
    calls = [c for g in doc.get("graphs") or [] for c in g.get("calls") or []]
    parts = [table(["graph", "kind", "call", "eager peak MiB", "compiled peak MiB", "ratio", "eager saved MiB",
                    "compiled saved MiB"],
                   [(c["graph"], c["kind"], c["call"], _mib(c.get("eager_peak_bytes")), _mib(c["compiled_peak_bytes"]),
                     "-" if c.get("ratio") is None else f"{c['ratio']:.2f}x", _mib(c.get("eager_saved_bytes")),
                     _mib(c.get("compiled_saved_bytes"))) for c in calls], numeric=(2, 3, 4, 5, 6, 7),
                   ident="memory-calls")]
    for c in calls[:MEMORY_CHARTS]:
        series = {"compiled": ("#c0392b", [v // 1024 for v in c.get("compiled_curve") or []])}
        if c.get("eager_curve"):
            series["eager"] = ("#2471a3", [v // 1024 for v in c["eager_curve"]])
        points = max(len(v) for _, v in series.values())
        xs = [round(100 * k / max(points - 1, 1)) for k in range(points)]
        parts.append(f"<h3>graph {h(c['graph'])} {h(c['kind'])}, call {h(c['call'])}: live KiB over the call</h3>"
                     + line_chart(series, xs, x_label="% of the call's duration",
                                  ident=f"memory-{c['graph']}-{c['kind']}-{c['call']}"))
        rows = [(side, _mib(b["bytes"]), b.get("name") or "-", b.get("op") or "-", ", ".join(b.get("made_by") or []),
                 b.get("source") or "") for side in ("compiled", "eager") for b in c.get(f"{side}_peak_buffers") or []
                if b["bytes"] >= 1024]
        if rows:
            parts.append(table(["alive at the peak of", "MiB", "name", "allocated by", "made by", "user line"], rows,
                               numeric=(1,), ident=f"memory-buffers-{c['graph']}-{c['kind']}-{c['call']}"))
    for note in doc.get("notes") or []:
        parts.append(f"<p class=\"note\">{h(note)}</p>")
    if doc.get("method"):
        parts.append(f"<p class=\"note\">{h(doc['method'])}</p>")
    return "".join(parts)


def _mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"
