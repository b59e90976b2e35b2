"""The report's sections, one builder each (SECTIONS, in page order). A builder takes the report
context and returns its HTML, or None when the document has nothing for it.

The context (built by report.build): command, command_line, document (the command's --json
document), headline (the verdict line the CLI printed), transcript {stdout, stderr},
graphs (artifacts.load_graphs of the debug folders), focus {graph, fx_node, kernel} (the culprit,
highlighted in every pane) and verdict (the run verdict with graphs, breaks and errors: the
document's own, or the one of the run that collected the artifacts).
"""
from __future__ import annotations

import json
import os

from tdbg.minifier.runs.names import backend_label, frame_label

from .measure import memory_section, profile_section
from .page import code_lines, fields, h, line_chart, pre, table

# document schema -> its verdict fields (stage, source, graph, fx node, kernel, message) and next commands


def _run_verdict(doc: dict) -> dict:
    v = doc.get("verdict") or {}
    err = v.get("error") or {}
    return {"ok": v.get("status") == "ok", "stage": v.get("stage"), "source": err.get("source"),
            "graph": _graph_words(err), "fx_node": err.get("fx_node"), "kernel": err.get("kernel"),
            "message": err.get("message"), "next": doc.get("next_commands") or [],
            "debug_dir": v.get("debug_dir"), "symbolic_sizes": err.get("symbolic_sizes")}


def _graph_words(err: dict):
    if err.get("graph") is None:
        return None
    part = f" ({err['part']})" if err.get("part") else ""
    return f"{err['graph']}{part}" + (f", frame {frame_label(err['frame'])}" if err.get("frame") else "")


def _bisect_verdict(doc: dict) -> dict:
    verdict = doc.get("verdict") or {}
    culprit = next((c for c in doc.get("culprits") or [] if "fx_node" in c), {})
    failing = next((b for b in doc.get("backends") or [] if b.get("status") != "ok"), None)
    err = (failing or {}).get("error") or ((doc.get("reference") or {}).get("error")) or {}
    nexts = []
    repro = doc.get("reproduce")
    if repro:
        env = " ".join(f"{k}={_quote(v)}" for k, v in (repro.get("env") or {}).items())
        nexts.append(((env + " ") if env else "") + " ".join(_quote(a) for a in repro.get("argv") or []))
    if doc.get("minify_command"):
        nexts.append(doc["minify_command"])
    # the culprit op's own line when bisect found one (doc["source"]), as the terminal shows it
    return {"ok": verdict.get("level") == "none", "stage": verdict.get("stage"),
            "source": doc.get("source") or culprit.get("source") or err.get("source"),
            "graph": culprit.get("graph") or _graph_words(err), "fx_node": culprit.get("fx_node") or err.get("fx_node"),
            "kernel": culprit.get("kernel") or err.get("kernel"), "message": err.get("message"), "next": nexts,
            "summary": verdict.get("summary")}


def _quote(word) -> str:
    import shlex
    return shlex.quote(str(word))


def _minify_verdict(doc: dict) -> dict:
    final = doc.get("final") or doc.get("first") or {}
    repro = os.path.join(doc.get("out_dir") or "", "repro.py")
    stage = final.get("stage") or (doc.get("capture") or {}).get("stage")
    return {"ok": doc.get("status") == "minified", "stage": stage,
            "message": final.get("message") or doc.get("error"),
            "next": [f"python {repro}"] if doc.get("status") == "minified" else []}


def _explain_verdict(doc: dict) -> dict:
    err = doc.get("error") or {}
    return {"ok": doc.get("status") == "ok" and not doc.get("exceeded"), "stage": doc.get("stage"),
            "source": err.get("source"), "message": err.get("message") or "; ".join(doc.get("exceeded") or [])}


def _profile_verdict(doc: dict) -> dict:
    return {"ok": doc.get("status", "ok") != "error", "message": doc.get("error")}


def _compare_verdict(doc: dict) -> dict:
    diverged = [g for g in doc.get("graphs") or [] if g.get("diverged")]
    stages = [s for s in doc.get("stages") or [] if s.get("diverged")]
    # an aten graph already wrong (AOTAutograd) comes before anything its compiled code does
    if stages and (stages[0].get("verdict") == "aot" or not diverged):
        s, node = stages[0], stages[0].get("culprit") or {}
        return {"ok": False, "stage": "accuracy", "graph": s.get("name"), "fx_node": node.get("name"),
                "kernel": None, "source": node.get("source"), "message": s.get("message"),
                "summary": doc.get("message")}
    g = diverged[0] if diverged else {}
    node = g.get("culprit") or g.get("first_divergence") or {}
    return {"ok": doc.get("exit_code") == 0, "stage": "accuracy" if diverged else None, "graph": g.get("name"),
            "fx_node": node.get("name"), "kernel": node.get("kernel"), "source": node.get("source"),
            "message": g.get("message") or doc.get("message"), "summary": doc.get("message")}


def _replay_verdict(doc: dict) -> dict:
    failed = next((g for g in doc.get("graphs") or [] if g.get("status") != "ok"), None) or {}
    err = failed.get("error") or {}
    return {"ok": doc.get("exit_code") == 0, "stage": failed.get("stage"), "graph": failed.get("graph"),
            "symbolic_sizes": failed.get("symbolic_sizes"), "fx_node": err.get("fx_node"),
            "source": err.get("source"), "message": err.get("message")}


VERDICTS = {"tdbg.replay": _replay_verdict, "tdbg.compare": _compare_verdict, "tdbg.run": _run_verdict, "tdbg.bisect": _bisect_verdict,
            "tdbg.minify": _minify_verdict,
            "tdbg.explain": _explain_verdict, "tdbg.profile": _profile_verdict,
            "tdbg.memory": lambda doc: {"ok": doc.get("exit_code") == 0, "message": doc.get("error")}}


def verdict_fields(doc: dict) -> dict:
    """The verdict of any tdbg document (an error document of any command included)."""
    if doc.get("status") == "error" and doc.get("schema") not in ("tdbg.minify",):
        return {"ok": False, "stage": doc.get("cause"), "message": doc.get("error")}
    return VERDICTS.get(doc.get("schema"), lambda d: {"ok": d.get("exit_code") == 0})(doc)


def verdict_section(ctx: dict) -> str:
    doc = ctx["document"]
    v = verdict_fields(doc)
    focus = ctx.get("focus") or {}
    code = doc.get("exit_code")
    rows = [("stage", v.get("stage"), "v-stage"),
            ("user source line", v.get("source") or focus.get("source"), "v-source"),
            ("graph", v.get("graph"), "v-graph"), ("symbolic sizes", v.get("symbolic_sizes"), "v-symbolic-sizes"),
            ("FX node", v.get("fx_node"), "v-fx-node"),
            ("kernel", v.get("kernel"), "v-kernel"), ("exit code", code, "v-exit-code"),
            ("error", v.get("message"), "v-message")]
    if focus.get("fx_node") and focus.get("source") and focus["source"] != v.get("source"):
        rows.insert(2, (f"line of {focus['fx_node']}", focus["source"], "v-culprit-source"))
    nexts = "".join(f"<pre class=\"next\">{h(c)}</pre>" for c in v.get("next") or [])
    css = "verdict ok" if v.get("ok") else "verdict"
    headline = ctx.get("headline") or v.get("summary") or ""
    return (f'<div class="{css}"><div class="headline" id="verdict-headline">{h(headline)}</div>'
            f"{fields(rows)}" + (f"<h3>Next</h3>{nexts}" if nexts else "") + "</div>")


def errors_section(ctx: dict):
    """Per-output errors of an accuracy check (and per-node rows when the document has them)."""
    doc, verdict = ctx["document"], ctx.get("verdict") or {}
    mismatches = _mismatches(doc) or _mismatches(verdict)
    parts = []
    if mismatches:
        rows = [(m.get("output"), m.get("dtype"), "x".join(map(str, m.get("shape") or [])) or "scalar",
                 _num(m.get("max_abs_error")), _num(m.get("eager_error")), m.get("message")) for m in mismatches]
        parts.append(table(["output", "dtype", "shape", "max abs error", "eager's error vs float64", "detail"],
                           rows, numeric=(3, 4), ident="output-errors"))
    for g in doc.get("graphs") or [] if doc.get("schema") == "tdbg.compare" else []:
        if g.get("nodes"):
            parts.append(f"<h3>Per node: {h(g['name'])} <span class=\"dim\">{h(g.get('message'))}</span></h3>"
                         + _node_table(g))
    return "".join(parts) or None


NODE_COLUMNS = (("node", "name"), ("op", "op"), ("dtype", "dtype"), ("abs err vs float64", "abs_ref"),
                ("rel err vs float64", "rel_ref"), ("abs err vs eager", "abs_eager"),
                ("eager's abs err vs float64", "eager_abs_ref"), ("diverges", "diverges"),
                ("wrong on its own inputs", "local_wrong"), ("kernel", "kernel"), ("user line", "source"))


def _node_table(g: dict) -> str:
    """`tdbg compare`'s per-node errors in graph order; the culprit's row is marked."""
    culprit = (g.get("culprit") or {}).get("name")
    rows = [[("html", f'<span class="culprit">{h(n["name"])}</span>') if n["name"] == culprit else n["name"]]
            + [_cell(n.get(key)) for _title, key in NODE_COLUMNS[1:]] for n in g["nodes"]]
    return table([title for title, _key in NODE_COLUMNS], rows, numeric=(3, 4, 5, 6), ident=f"nodes-{g['name']}")


def _mismatches(doc: dict) -> list:
    for path in (("final",), ("first",), ("error", "evidence"), ("verdict", "error", "evidence")):
        node = doc
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get("mismatches"):
            return node["mismatches"]
    return []


def _num(x):
    return "" if x is None else f"{x:.6g}" if isinstance(x, float) else str(x)


def _cell(x):
    return _num(x) if isinstance(x, float) else json.dumps(x) if isinstance(x, (dict, list)) else x


def bisect_section(ctx: dict):
    doc = ctx["document"]
    if doc.get("schema") != "tdbg.bisect" or not doc.get("backends"):
        return None
    ran = {b["backend"]: b for b in doc["backends"]}
    rows = []
    for backend in doc.get("chain") or list(ran):
        b = ran.get(backend)
        result = "not run" if b is None else "pass" if b["status"] == "ok" else f"FAIL ({b.get('stage')})"
        rows.append((backend_label(backend), (b or {}).get("adds", ""), result, _seconds((b or {}).get("duration_s"))))
    parts = ["<h3>Backends chain</h3>", table(["backend", "adds", "result", "time"], rows, numeric=(3,), ident="chain")]
    if doc.get("subsystems"):
        parts += ["<h3>Compiler subsystems (switched off one at a time)</h3>",
                  table(["subsystem", "change", "result"],
                        [(s["name"], ", ".join(f"{k}={v}" for k, v in s["change"].items()), s["result"])
                         for s in doc["subsystems"]])]
    for c in doc.get("culprits") or []:
        parts.append("<h3>Culprit</h3>" + fields([(k.replace("_", " "), c.get(k)) for k in
                                                   ("kind", "index", "knob", "count", "passes_with", "fx_node",
                                                    "target", "kernel", "graph", "source", "subsystem", "applied",
                                                    "note")]))
    if (doc.get("workaround") or {}).get("passes"):
        env = " ".join(f"{k}={v}" for k, v in doc["workaround"]["env"].items())
        parts.append(f"<h3>Workaround</h3><pre>{h(env)}</pre><p class=\"note\">the program passes with this</p>")
    return "".join(parts)


def _seconds(x) -> str:
    return "" if x is None else f"{x:.1f} s"


def graphs_section(ctx: dict):
    """Every Dynamo graph with its user lines, breaks and recompiles (from a run verdict, or from
    explain's report, also inside profile's document)."""
    doc = ctx["document"]
    report = doc if doc.get("functions") is not None else \
        doc.get("explain") if isinstance(doc.get("explain"), dict) else None
    if report and report.get("functions") is not None:
        return _explain_graphs(report)
    verdict = ctx.get("verdict") or {}
    graphs = verdict.get("graphs") or []
    if not graphs:
        return None
    parts = []
    for g in graphs:
        lines = "".join(f"<div class=\"mono\">{h(os.path.basename(str(ln.get('file'))))}:{h(ln.get('line'))}  "
                        f"{h(ln.get('code'))} <span class=\"dim\">-&gt; {h(', '.join(ln.get('ops') or []))}"
                        "</span></div>"
                        for ln in g.get("lines") or [])
        brk = (f"<div class=\"bad\">graph break: {h(g.get('reason'))} at "
               f"{h(_frame_line((g.get('stack') or [{}])[-1]))}</div>") if g.get("graph_break") else ""
        checked = f", accuracy checked on {g.get('checked_calls', 0)} call(s)" if g.get("checked") else ""
        frame = frame_label(g.get("frame"))
        parts.append(f"<h3>graph {h(g.get('index'))} (frame {h(frame)}): {len(g.get('ops') or [])} op(s)"
                     f"{h(checked)}</h3>{lines}{brk}")
    for r in verdict.get("recompiles") or []:
        r = r if isinstance(r, dict) else {"reason": r}
        where = f" at {os.path.basename(str(r['file']))}:{r.get('line')}" if r.get("file") else ""
        parts.append(f"<div class=\"bad\">recompile of {h(frame_label(r.get('frame')))}{h(where)}: "
                     f"{h(r.get('reason'))}</div>")
    return "".join(parts)


def _frame_line(frame: dict) -> str:
    return f"{frame.get('file')}:{frame.get('line')} {frame.get('code') or ''}".strip()


def _explain_graphs(report: dict) -> str:
    t = report.get("totals") or {}
    parts = [f"<p>{h(t.get('functions'))} compiled function(s), {h(t.get('graphs'))} graph(s), "
             f"{h(t.get('graph_breaks'))} graph break(s), {h(t.get('recompiles'))} recompile(s)</p>"]
    for fn in report["functions"]:
        parts.append(f"<h3>{h(fn['function'])}</h3>")
        for g in fn.get("graphs") or []:
            lines = "".join(f"<div class=\"mono\">line {h(ln['line'])}: {h(ln['code'])} "
                            f"<span class=\"dim\">-&gt; {h(', '.join(ln['ops']))}</span></div>" for ln in g["lines"])
            parts.append(f"<div><b>graph {h(g['index'])}</b> ({h(frame_label(g['frame']))}): "
                         f"{h(g['op_count'])} op(s){lines}</div>")
        for b in fn.get("breaks") or []:
            parts.append(f"<div class=\"bad\">graph break at {h(b['line'])}</div>"
                         f"<div class=\"note\">why: {h(b['reason'])}</div>")
        for r in fn.get("recompiles") or []:
            where = f" at {h(r['line'])}" if r.get("line") else ""
            head = "recompile" if r.get("compiled", True) else \
                "guard failure (NOT recompiled: Dynamo's recompile limit)"
            parts.append(f"<div class=\"bad\">{h(head)} of {h(frame_label(r['frame']))}{where}: "
                         f"{h(r['changed'])}</div>" + (f"<div class=\"note\">fix: {h(r['suggestion'])}</div>"
                                                      if r.get("suggestion") else ""))
        limit = fn.get("recompile_limit")
        if limit:   # Dynamo stopped compiling the frame: later calls ran eager
            last = f"; last guard failure: {limit['reason']}" if limit.get("reason") else ""
            parts.append(f"<div class=\"bad recompile-limit\">recompile limit: {h(limit['words'])}</div>"
                         f"<div class=\"note\">at {h(limit.get('at') or 'no user line recorded')}{h(last)}; "
                         f"fix: {h(limit['fix'])}</div>")
    return "".join(parts)


def caches_section(ctx: dict):
    """explain --caches: per graph of the compared run, each cache lookup, its state and why it missed."""
    c = ctx["document"].get("caches")
    if not isinstance(c, dict):
        return None
    first = c.get("first_run")
    rows = [(str(g.get("compile_id")), g.get("frame") or "", r["layer_words"] + (f" ({r['part']})" if r.get("part") else ""),
             ("html", f'<span class="{"good" if r["state"] == "hit" else "bad"}">{h(r["state"])}</span>'),
             r.get("why") or "", r.get("compared_with") or "")
            for g in c.get("graphs") or [] for r in g["lookups"]]
    head = fields([("compared with", c.get("against")), ("first run", first and f"{first['status']}, {first['duration_s']} s"),
                   *((f"{k} cache dir", v) for k, v in (c.get("cache_dirs") or {}).items())])
    # a cache turned off looks nothing up: without its line it would go unmentioned
    off = "".join(f'<div class="bad cache-off">{h(r["words"])}</div>' for r in c.get("turned_off") or [])
    body = table(["graph", "frame", "cache", "state", "why", "vs"], rows, ident="caches-table") if rows else \
        '<p class="note">' + ("no other compile-cache lookup" if off else
                              "no compile-cache lookup (nothing was compiled by a backend with a cache)") + "</p>"
    return head + off + body


def shapes_section(ctx: dict):
    """explain's shapes: per compile of each function, its input dims (static, dynamic, specialized)
    and shape guards with the user line and cause; size recompiles with the guard that failed and the
    line that made it; storms and a mark_dynamic violation."""
    doc = ctx["document"]
    report = doc if doc.get("functions") is not None else \
        doc.get("explain") if isinstance(doc.get("explain"), dict) else None
    if not report:
        return None
    parts = []
    violation = report.get("shape_violation")
    if violation:
        parts.append(f"<div class=\"bad\">{h(violation['source'])} was marked dynamic, but {h(violation['at'])} "
                     f"<span class=\"mono\">{h(violation['code'])}</span> made it the constant {h(violation['value'])}"
                     f"</div><div class=\"note\">fix: {h(violation['fix'])}</div>")
    for fn in report.get("functions") or []:
        sh = fn.get("shapes") or {}
        if not sh.get("frames"):
            continue
        parts.append(f"<h3>{h(fn['function'])}</h3>")
        rows = []
        for frame in sh["frames"]:
            dims = "; ".join(f"{i['name']}: " + ", ".join(
                f"dim {d['dim']} = {d['size']} {d['state']}" + (f" at {d['specialized_at']}" if d.get("specialized_at")
                                                                 else "") for d in i["dims"]) for i in frame["inputs"])
            made = [(f"guard {g['expr']}", g) for g in frame["guards"]] + \
                [(f"specialized {s['source']} = {s['value']}", s) for s in frame["specializations"]]
            why = "".join(f"<div><span class=\"mono\">{h(what)}</span> at {h(g['at'] or 'no user line recorded')} "
                          f"<span class=\"mono\">{h(g['code'])}</span><div class=\"note\">{h(g['cause'])}"
                          + (f"; fix: {h(g['fix'])}" if g["fix"] else "") + "</div></div>" for what, g in made)
            rows.append((frame["compile_id"], dims, ("html", why)))
        parts.append(table(["compile", "input dims", "shape guards and specializations"], rows))
        for r in fn.get("recompiles") or []:
            size = r.get("size")
            if size:
                made = f"{size['created_at']} {size['code']}" if size["created_at"] else "no user line"
                parts.append(f"<div class=\"bad\">recompile: guard <span class=\"mono\">{h(size['failed_guard'])}"
                             f"</span> of compile {h(size['compile_id'])} failed; made at {h(made)}</div>"
                             f"<div class=\"note\">why: {h(size['cause'])}</div>")
        for storm in sh.get("storms") or []:
            cut = f", cut short by {storm['cut_by']}" if storm.get("cut_by") else ""
            parts.append(f"<div class=\"bad\">recompile storm: {h(storm['source'])} never stabilized: "
                         f"{h(storm['recompiles'])} recompiles over sizes {h(', '.join(map(str, storm['sizes'])))}"
                         f"{h(cut)}</div><div class=\"note\">fix: {h(storm['fix'])}</div>")
    return "".join(parts) or None


PANES = (("fx", "FX graph"), ("ir", "loop IR"), ("cpp", "C++"))


def code_section(ctx: dict):
    graphs = ctx.get("graphs") or []
    if not graphs:
        return None
    focus = ctx.get("focus") or {}
    parts = ['<p class="legend note">Click a line: its FX node\'s lines highlight in every pane and in the '
             'user\'s source. <span class="culprit">culprit</span><span class="hl">selected</span></p>']
    for g in graphs:
        parts.append(_graph_code(g, focus))
    return "".join(parts)


def _graph_code(g: dict, focus: dict) -> str:
    nodes = g["nodes"]
    culprit = focus.get("fx_node") if focus.get("graph") in (None, g["name"]) else None
    line_nodes = {pane: {} for pane, _ in PANES}
    for name, entry in nodes.items():
        for pane, _ in PANES:
            for n in entry.get(f"{pane}_lines") or []:
                line_nodes[pane].setdefault(n, set()).add(name)
    panes = []
    for pane, title in PANES:
        info = g["panes"][pane]
        marked = set((nodes.get(culprit) or {}).get(f"{pane}_lines") or []) if culprit else set()
        body = code_lines(info["lines"], line_nodes[pane], marked) if info["lines"] else \
            '<div class="note">(not written for this graph)</div>'
        panes.append(f'<div class="pane-box"><h4>{h(title)} <span class="dim">{h(info["file"] or "")}</span></h4>'
                     f'<div class="pane" data-pane="{pane}">{body}</div></div>')
    sources = {}
    for name, entry in nodes.items():
        if entry.get("source"):
            sources.setdefault(entry["source"], set()).add(name)
    src = "".join(f'<div class="src{" culprit" if culprit in names else ""}" data-nodes="{h(" ".join(sorted(names)))}">'
                  f"{h(text)}</div>" for text, names in sorted(sources.items(), key=lambda kv: _source_key(kv[0])))
    derived = (' <span class="note">(line links rebuilt from the files: this folder has no provenance.json)</span>'
               if g.get("derived") else "")
    kernels = f' <span class="dim">kernels: {h(", ".join(g.get("kernels") or []))}</span>' if g.get("kernels") else ""
    return (f'<div class="graph-code" data-graph="{h(g["name"])}"><h3>{h(g["name"])} '
            f'<span class="dim">({h(g["kind"])})</span>{kernels}{derived}</h3>'
            f'<div class="src-lines">{src}</div>'
            f'<div class="selected">selected: <span class="selected-node">{h(culprit or "")}</span></div>'
            f'<div class="panes">{"".join(panes)}</div></div>')


def _source_key(text: str):
    file, _, rest = text.partition(":")
    line = rest.split(" ", 1)[0]
    return (file, int(line) if line.isdigit() else 0)


def timings_section(ctx: dict):
    graphs = [g for g in ctx.get("graphs") or [] if g["stages"]]
    # columns in compile order: the graph that got furthest lists the most stages, in order
    stages = list(dict.fromkeys(name for g in sorted(graphs, key=lambda g: -len(g["stages"]))
                                for name, _s, _f in g["stages"]))
    parts = []
    if graphs:     # one row per compiled graph, one column per compiler stage (ms; a failed stage says so)
        rows = []
        for g in graphs:
            cells = {name: f"{seconds * 1e3:.2f}" + (f" failed: {failed}" if failed else "")
                     for name, seconds, failed in g["stages"]}
            rows.append([g["name"], *(cells.get(name, "") for name in stages),
                         f"{sum(sec for _n, sec, _f in g['stages']) * 1e3:.2f}"])
        parts.append("<p class=\"note\">milliseconds per compiler stage (debug.log)</p>" + table(
            ["graph", *stages, "total"], rows, numeric=range(1, len(stages) + 2), ident="stage-times"))
    doc = ctx["document"]
    if isinstance(doc.get("stages"), dict) and doc["stages"]:
        parts.append("<h3>Compile stages summed over graphs (profile)</h3>" + table(
            ["stage", "s"], [(k, f"{v:.3f}") for k, v in sorted(doc["stages"].items(), key=lambda kv: -kv[1])],
            numeric=(1,)))
    runs = doc.get("runs") if doc.get("schema") == "tdbg.bisect" else None
    if runs:
        parts.append("<h3>Runs</h3>" + table(["run", "result", "time"], [
            (r["label"], "pass" if r["status"] == "ok" else f"fail ({r.get('stage')})", _seconds(r.get("duration_s")))
            for r in runs], numeric=(2,)))
    return "".join(parts) or None


def shrink_history(doc: dict) -> list:
    """[(query, nodes, inputs)]: the original graph at query 0, then every query whose candidate
    kept the failure (the minifier adopts those), from minify.jsonl in the output folder."""
    original = doc.get("original") or {}
    steps = [(0, original["nodes"], original["inputs"])] if original else []
    path = os.path.join(doc.get("out_dir") or "", "minify.jsonl")
    try:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        records = []
    for r in records:
        if r.get("purpose") == "candidate" and r.get("same_failure") and steps and \
                (r["nodes"], r["inputs"]) <= (steps[-1][1], steps[-1][2]):
            steps.append((r["query"], r["nodes"], r["inputs"]))
    return steps


def minify_section(ctx: dict):
    doc = ctx["document"]
    if doc.get("schema") != "tdbg.minify" or not doc.get("original"):
        return None
    steps = shrink_history(doc)
    chart = line_chart({"nodes": ("#0b57d0", [s[1] for s in steps]), "inputs": ("#b3261e", [s[2] for s in steps])},
                       [s[0] for s in steps], x_label="query", ident="shrink-chart")
    rows = table(["query", "nodes", "inputs"], steps, numeric=(0, 1, 2), ident="shrink-steps")
    stats = doc.get("stats") or {}
    code = (doc.get("minimized") or {}).get("code")
    dynamic = (doc.get("minimized") or {}).get("dynamic") or {}
    symbolic = ("<p id=\"minified-symbolic\">compiled with symbolic sizes: " + h("; ".join(
        f"{name}: [{', '.join(str(d) if d else 'static' for d in dims)}]" for name, dims in dynamic.items()))
        + "</p>") if dynamic else ""
    return (symbolic + f"<p>{h(doc['original']['nodes'])} -&gt; {h((doc.get('minimized') or {}).get('nodes'))} nodes, "
            f"{h(doc['original']['inputs'])} -&gt; {h((doc.get('minimized') or {}).get('inputs'))} inputs in "
            f"{h(stats.get('queries'))} queries</p>{chart}{rows}"
            + (f"<h3>Minimized graph</h3>{pre(code)}" if code else ""))


def saved_io_section(ctx: dict):
    """A `run --save-io` folder: each saved graph, its inputs and its source."""
    doc = ctx["document"]
    if doc.get("schema") != "tdbg.saved_io":
        return None
    rows = [(g.get("name"), g.get("kind"), g.get("graph"), g.get("call"), g.get("nodes"),
             "; ".join(_saved_input(i, (g.get("dynamic") or {}).get(i.get("name")) or ()) for i in g["inputs"]),
             g.get("compiled_error") or "") for g in doc["saved_graphs"]]
    parts = [table(["graph", "kind", "Dynamo graph", "call", "nodes", "inputs", "compile error"], rows,
                   numeric=(2, 3, 4), ident="saved-graphs")]
    parts += [f"<details><summary>{h(g.get('name'))}: graph.py</summary>{pre(g['code'])}</details>"
              for g in doc["saved_graphs"] if g.get("code")]
    return "".join(parts)


def _saved_input(i: dict, symbols) -> str:
    """`x: float32[s77=100, 8]` (a symbolic dim as symbol=size), `n = 100 (s77)` for an int input."""
    if "shape" not in i:
        return f"{i.get('name')} = {i.get('value')!r}" + (f" ({symbols[0]})" if symbols and symbols[0] else "")
    symbols = list(symbols) + [None] * len(i.get("shape") or [])
    dims = ", ".join(f"{sym}={d}" if sym else str(d) for d, sym in zip(i.get("shape") or [], symbols))
    return f"{i.get('name')}: {i.get('dtype')}[{dims}]"


def replay_section(ctx: dict):
    """`tdbg replay`: each saved graph's verdict, with the symbolic sizes it compiled with."""
    doc = ctx["document"]
    if doc.get("schema") != "tdbg.replay" or not doc.get("graphs"):
        return None
    rows = [(g.get("graph"), g.get("kind"), backend_label(g.get("backend")),
             "OK" if g.get("status") == "ok" else f"FAILED ({g.get('stage')})", _num(g.get("max_abs_error")),
             g.get("symbolic_sizes") or "static", (g.get("error") or {}).get("message") or "")
            for g in doc["graphs"]]
    return table(["graph", "kind", "backend", "verdict", "max abs error", "symbolic sizes", "error"], rows,
                 numeric=(4,), ident="replay-graphs")


def determinism_section(ctx: dict):
    """`run --check-determinism`: per graph, the verdict of two compiled and two eager runs, the
    values that differ between runs and the first FX node (kernel, user line) whose value differs."""
    doc = ctx["document"]
    graphs = [g for g in (doc.get("verdict") or {}).get("graphs") or [] if g.get("determinism")]
    if doc.get("schema") != "tdbg.run" or not graphs:
        return None
    rows = []
    for g in graphs:
        d, node = g["determinism"], g["determinism"].get("first_node") or {}
        rows.append((g["index"], g.get("frame"), ", ".join(map(str, g.get("determinism_calls") or [d.get("call")])),
                     d["verdict"],
                     "; ".join(f"{v['path']}: {v['message']}" for v in d["compiled"]) or "same bits",
                     "; ".join(f"{v['path']}: {v['message']}" for v in d["eager"]) or "same bits",
                     node.get("node"), node.get("kernel"), node.get("source"), d.get("reason") or ""))
    return table(["graph", "frame", "calls checked", "verdict", "compiled run 1 vs 2", "eager run 1 vs 2", "first differing node",
                  "kernel", "source", "reason"], rows, numeric=(0,), ident="determinism-graphs")


def transcript_section(ctx: dict):
    t = ctx.get("transcript") or {}
    parts = [f"<h3>{h(name)}</h3>{pre(t[name])}" for name in ("stdout", "stderr") if (t.get(name) or "").strip()]
    return f"<details><summary>what the command printed</summary>{''.join(parts)}</details>" if parts else None


# (id, title, builder) in page order
def dynamo_code_section(ctx: dict):
    """explain --code: per frame, four panes side by side: the original source, the code Dynamo
    runs in its place, that code's guards in words, and the graphs it calls."""
    code = (ctx["document"] or {}).get("code") or {}
    frames = code.get("frames") or []
    if not frames:
        return None
    parts = [f'<p class="note">--code {h(code.get("asked"))}: frames compiled in this run: '
             f'{h(code.get("available"))}</p>']
    for f in frames:
        resumed = f", resumed after line {f['resume_line']}" if f.get("resume_line") else ""
        src = f["source"]
        source = "".join(f'<div class="ln{" culprit" if n == f.get("resume_line") else ""}" data-n="{n}">'
                         f"{h(text)}</div>" for n, text in enumerate(src["text"].splitlines(), src["first_line"]))
        runs, guards = [], []
        for comp in f["compiles"]:
            how = f"decompiled by {comp['decompiler']}" if comp["decompiler"] != "dis" else "disassembled"
            calls = [f"calls graph {g['graph']} as {g['name']}" for g in comp["graphs"]] + \
                    [f"then continues in {r['frame']} ({r['name']})" for r in comp["resumes"]]
            runs.append(f'<h4>compile {h(comp["compile_id"])} <span class="dim">({h(how)})</span></h4>'
                        + (f'<div class="note">{h(comp["note"])}</div>' if comp.get("note") else "")
                        + pre(comp["code"]) + "".join(f'<div class="dim">{h(c)}</div>' for c in calls))
            guards.append(f'<h4>compile {h(comp["compile_id"])}</h4><ul class="guards">'
                          + "".join(f'<li title="{h(chr(10).join(g["code"]))}">{h(g["words"])}'
                                    + (f' <span class="dim">({len(g["code"])} checks)</span>' if len(g["code"]) > 1
                                       else "") + "</li>" for g in comp["guards"]) + "</ul>")
        graphs = "".join(f"<h4>graph {h(g['index'])}</h4>{pre(g['code'])}" for g in f["graph_code"])
        panes = (("original source", f'<div class="pane">{source}</div>'),
                 ("the code Dynamo runs", "".join(runs)), ("guards, in words", "".join(guards)),
                 ("graph code", graphs or '<div class="note">(no graph)</div>'))
        parts.append(f'<div class="frame-code" data-frame="{h(f["frame"])}"><h3>{h(f["function"])} '
                     f'<span class="dim">(frame {h(f["frame"])}, {h(f["file"])}:{h(f["first_line"])}'
                     f'{h(resumed)})</span></h3><div class="panes4">'
                     + "".join(f'<div class="pane-box"><h4>{h(title)}</h4>{body}</div>' for title, body in panes)
                     + "</div></div>")
    return "".join(parts)


SECTIONS = (
    ("verdict", "Verdict", verdict_section),
    ("errors", "Errors per output and node", errors_section),
    ("bisect", "Bisection", bisect_section),
    ("graphs", "Graphs, breaks and recompiles", graphs_section),
    ("caches", "Compile caches: hits, misses and why", caches_section),
    ("shapes", "Shapes: dims, guards and specializations", shapes_section),
    ("code", "FX code, loop IR and C++", code_section),
    ("dynamo_code", "What Dynamo made of the code", dynamo_code_section),
    ("timings", "Stage timings", timings_section),
    ("profile", "Profile: eager vs compiled", profile_section),
    ("memory", "Memory: eager vs compiled", memory_section),
    ("minify", "Shrink history", minify_section),
    ("saved", "Saved graphs (run --save-io)", saved_io_section),
    ("replay", "Replayed graphs", replay_section),
    ("determinism", "Determinism (run --check-determinism)", determinism_section),
    ("transcript", "Terminal output", transcript_section),
)
