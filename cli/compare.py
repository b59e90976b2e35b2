"""`tdbg compare`: where each compiled graph's numerics first diverge from eager, node by node."""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional

import click

from tdbg.cli import common
from tdbg.cli.console import doing, exit_code, exit_codes_help, fail, now_doing, out, report_to_stderr, write_json

JSON_SCHEMA, JSON_VERSION = "tdbg.compare", 1
WINDOW = 4          # table rows shown before and after the first divergence
CURVE_ROWS = 12     # most rows of a drift curve (sampled evenly, the crossing always kept)
# verdict -> (label, rich style)
LABELS = {
    "ok": ("OK", "green"),
    "culprit": ("DIVERGES", "bold red"),
    "drift": ("DRIFT", "bold yellow"),
    "fused": ("DIVERGES WHEN FUSED", "bold red"),
    "outputs_differ": ("OUTPUTS DIFFER", "bold red"),
    "outputs_match": ("OUTPUTS MATCH (only outputs observable)", "yellow"),
    "error": ("COULD NOT COMPARE", "bold red"),
}
# stage verdict (diagnose/stages.py) -> (label, rich style) and its words in the summary line
STAGE_LABELS = {
    "ok": ("OK", "green"),
    "aot": ("ATEN GRAPH DIFFERS (AOTAutograd)", "bold red"),
    "compiled": ("COMPILED GRAPH DIFFERS", "bold red"),
    "unjudged": ("STAGES NOT JUDGED", "yellow"),
}
STAGE_SUMMARY = {"aot": "AOTAutograd's aten graph already differs from the Dynamo graph",
                 "compiled": "the compiled graph differs from the Dynamo graph"}
# verdict -> how the summary line counts graphs with it
SUMMARY_WORDS = {"ok": "ok", "culprit": "with a diverging op", "drift": "drifting", "fused": "diverging only when fused",
                 "outputs_differ": "with differing outputs", "outputs_match": "matching (outputs only)",
                 "error": "not compared", "aten_wrong": "matching only an aten graph that is itself wrong"}


@click.command(epilog=exit_codes_help())
@click.argument("target", type=click.Path())
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS]...")
@common.backend_option("For a --save-io folder, own is the backend each graph was saved with.")
@click.option("--graph", "graphs", multiple=True, metavar="NAME",
              help="Compare only this saved graph (e.g. g0_forward_c1); repeatable.")
@click.option("--tolerance", type=click.FloatRange(0, min_open=True), metavar="X",
              help="rtol and atol for every float dtype instead of the per-dtype table.")
@common.timeout_option(None)
@common.json_option
def compare(target, args, backend, graphs, tolerance, timeout, json_path):
    """Find the first FX node whose compiled value diverges from eager, per compiled graph.

    TARGET is a script (ARGS after --), run once with every compiled graph's real inputs saved
    (as `tdbg run --save-io`), or a folder written by `tdbg run --save-io` (or one DIR/GRAPH).
    Each graph (forward and backward) runs eager, in float64 and compiled with every node
    realized; per node: errors against float64 and eager, and the first node beyond the
    dtype's tolerance with its source line and kernel; an op whose result flips on inputs within
    tolerance (a comparison or mask boundary) is a culprit too. Error that grows over many ops is
    shown as drift, not blamed on one op. On a script, each Dynamo graph's stages are judged as
    well (Dynamo graph vs aten graph vs compiled, outputs and inputs written in place), so an
    AOTAutograd bug is named; a script that fails after its compiled graphs is still compared.
    """
    common.check_output_file(json_path, "--json")
    if json_path == "-":
        report_to_stderr()
    common.check_backend(backend)
    if os.path.isdir(target):
        if args:
            fail(f"{target} is a --save-io folder; script arguments (after --) go with a script.", "usage")
        doc = _compare_folder(target, None if backend == common.OWN else backend, graphs, tolerance)
    else:
        common.require_script(target)
        doc = _compare_script(target, list(args), backend, graphs, tolerance, timeout, json_path)
    render(doc)
    write_json(json_path, doc, JSON_SCHEMA, JSON_VERSION)
    raise SystemExit(doc["exit_code"])


def _compare_script(script, args, backend, graphs, tolerance, timeout, json_path) -> dict:
    """The script run once as `tdbg run --save-io` runs it, each Dynamo graph's stages (Dynamo
    graph vs aten graph vs compiled: outputs and inputs written) judged at its first call; then
    every saved aten graph compared node by node. The run is not stopped at a wrong result (as
    --check-accuracy would stop it): later graphs, the backward among them, are compared too."""
    from tdbg.minifier.runs.runner import RunRequest, run_script
    tmp = tempfile.mkdtemp(prefix="tdbg-compare-")
    try:
        folder, stages = os.path.join(tmp, "io"), os.path.join(tmp, "stages.json")
        with doing(f"the run of {script} with backend {common.backend_label(backend)}, judging each graph's stages "
                   "and saving its inputs"):
            verdict = run_script(RunRequest(script=script, argv=args, backend=backend, timeout=timeout,
                                            save_io=folder, stage_check={"path": stages, "tolerance": tolerance},
                                            stdout_to_stderr=json_path == "-"))
        problem = _run_problem(verdict, script, backend)
        if problem:
            message, code = problem
            return {"target": script, "argv": args, "backend": backend, "status": "failed", "exit_code": code,
                    "run": {k: verdict.get(k) for k in ("status", "stage", "error")}, "graphs": [],
                    "message": message, "compile_backends": verdict.get("compile_backends"),
                    "replaced": common.replaced_lines(verdict, backend)}
        # each graph recompiles as the run compiled it (its replay spec: backend and config)
        doc = _compare_folder(folder, None, graphs, tolerance, named=(backend, script))
        doc.update(target=script, argv=args, backend=backend, compile_backends=verdict.get("compile_backends"),
                   replaced=common.replaced_lines(verdict, backend))
        doc["stages"] = _read_stages(stages)
        doc["script_run"] = _script_run(verdict)
        _conclude(doc)
        return doc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run_problem(verdict: dict, script: str, backend: str = common.OWN):
    """(message, exit code) when the run gives nothing to compare, else None. A run that fails
    on accuracy still saved its graphs: comparing them is the point; so did a script that failed
    on its own after its compiled graphs ran (an assert on their wrong result)."""
    nothing = common.nothing_to_check(verdict, script)
    if nothing:
        return nothing, exit_code("bad_input")
    if verdict["status"] == "ok" or verdict.get("stage") == "accuracy":
        return None
    if verdict.get("stage") == "script" and (verdict.get("save_io") or {}).get("graphs"):
        return None
    err = verdict.get("error") or {}
    words = common.STAGE_WORDS.get(verdict.get("stage"), verdict.get("stage"))
    where = f" at {err['source']}" if err.get("source") else ""
    first = (str(err.get("message") or "").strip().splitlines() or [""])[0]
    return (f"the run of {script} failed before there was anything to compare: {words}{where}: "
            f"{first} (`{common.command_line(['tdbg', 'run', script] + _named(backend))}` reports it in full).",
            common.stage_exit_code(verdict))


def _named(backend: str) -> list:
    return [] if backend == common.OWN else ["--backend", backend]


def _script_run(verdict: dict) -> dict:
    """How the script's run ended: {status, stage, message (the error's first line), source}."""
    err = verdict.get("error") or {}
    first = (str(err.get("message") or "").strip().splitlines() or [""])[0]
    return {"status": verdict["status"], "stage": verdict.get("stage"), "message": first or None,
            "source": err.get("source"), "exit_code": common.stage_exit_code(verdict)}


def _read_stages(path: str) -> list:
    """The run's stage checks (diagnose/stages.py), one dict per Dynamo graph; [] when none ran."""
    import json
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return []


def _conclude(doc: dict) -> None:
    """Fold the stage verdicts into the exit code and summary (a wrong stage is 16, whatever the
    per-node comparison found) and say how the script's run ended when it failed after its graphs."""
    stages, run = doc.get("stages") or [], doc.get("script_run") or {}
    wrong = [s for s in stages if s["diverged"]]
    aot = [s["name"] for s in stages if s["verdict"] == "aot"]
    for g in doc["graphs"] if aot else []:
        if g["verdict"] == "ok":   # compiled == its aten graph run eagerly: no proof the aten graph is right
            g.setdefault("notes", []).append(
                f"this compares the compiled code with its aten graph run eagerly; the aten graph itself differs "
                f"from the Dynamo graph ({', '.join(aot)} above), so OK here is not a correct result")
    doc["message"] = _summary(doc["graphs"])   # counted again: such a graph is no longer "ok"
    if wrong:
        doc["message"] += "; " + ", ".join(f"{s['name']}: {STAGE_SUMMARY[s['verdict']]}" for s in wrong)
    if wrong:
        doc.update(exit_code=exit_code("accuracy"), status="failed")
    unjudged = [s for s in stages if s["verdict"] == "unjudged"]
    if unjudged:   # an unjudged stage is never silently a pass
        doc["message"] += f"; {unjudged[0]['name']}'s stages not judged: {unjudged[0]['message']}" + (
            f" (and {len(unjudged) - 1} more graph(s))" if len(unjudged) > 1 else "")
    if run.get("stage") == "script":
        doc["message"] += (f"; the script failed after its compiled graphs ran"
                           + (f" at {_relative(run['source'])}" if run.get("source") else "") + f": {run['message']}")


def _compare_folder(folder, backend, graphs, tolerance, named=None) -> dict:
    from tdbg.compiler.errors import TdbgError
    from tdbg.minifier.artifacts.saved_io import read_manifest, split_path
    directory, one = split_path(folder)
    try:
        manifest = read_manifest(directory)
        names = [one] if one else [row.get("name", "") for row in manifest["graphs"]]
        kinds = {row.get("name", ""): row.get("kind", "") for row in manifest["graphs"]}
        unknown = [g for g in graphs if g not in names]
        if unknown:
            fail(f"{directory} has no saved graph {', '.join(unknown)}; it has: {', '.join(names) or 'none'}.",
                 "bad_input")
        names = [n for n in names if not graphs or n in graphs]
        if not names:
            skipped = "; ".join(str(s.get("reason", s)) for s in manifest.get("skipped", []) if isinstance(s, dict))
            fail(f"{directory} holds no saved graph to compare" + (f" ({skipped})" if skipped else "") + ".",
                 "bad_input")
        saved = [_load(directory, n, kinds.get(n), named) for n in names]
    except TdbgError as e:   # SavedIOError: a damaged or tampered folder is bad input, never a verdict
        fail(str(e), getattr(e, "stage", "bad_input"))
    rows = [g if isinstance(g, dict) else _compare_one(g, directory, backend, tolerance, named) for g in saved]
    code = _exit_code(rows)
    return {"target": folder, "backend": backend or manifest.get("backend"), "status": "ok" if code == 0 else "failed",
            "exit_code": code, "graphs": rows,
            "message": _summary(rows)}


def _load(directory, name, kind, named):
    """A saved graph; for a script's run (`named`), a graph tdbg saved but cannot load back is an
    `error` row of its own (stage internal: tdbg's limit, not the user's input) and the others
    are still compared; a folder the user gave must load whole."""
    from tdbg.compiler.errors import TdbgError
    from tdbg.minifier.artifacts.saved_io import load_graph
    try:
        return load_graph(directory, name)
    except TdbgError as e:
        if not named:
            raise
        first = (str(e).splitlines() or [""])[0]
        return {"name": name, "kind": kind or "graph", "verdict": "error", "stage": "internal", "diverged": None,
                "message": f"tdbg could not load the graph it saved back: {first.replace(directory + os.sep, '')}"}


def _compare_one(g, directory, backend, tolerance, named=None) -> dict:
    """One saved graph's comparison as a JSON-ready dict. `named` = (--backend, script) of a
    script run: used when the run could not record how to rebuild its backend."""
    from tdbg.minifier.diagnose.divergence import Replay, compare_graph
    chosen = backend or Replay(g.replay_spec, directory)
    if not backend and (g.replay_spec.get("backend") or {}).get("kind") == "unavailable" and named:
        name, script = named
        head = name.rpartition(":")[0]
        if head.endswith(".py") and os.path.realpath(head) == os.path.realpath(script):
            return {"name": g.name, "kind": g.kind, "verdict": "error", "stage": "bad_input", "diverged": None,
                    "message": f"the backend {name} is defined in the script being run, and the run could not save "
                               "it; compare recompiles graphs outside the run, so give the backend as "
                               "module:function (e.g. with PYTHONPATH set to its folder) or move it to another file"}
        chosen = name
    if backend and g.symbolic_text:
        # a graph saved with symbolic sizes compiles symbolic with --backend too (replay's spec
        # for that backend, through runtime.compile_graph); given to the backend directly it
        # would compile at the saved sizes, where a size-generic bug does not show
        from tdbg.minifier.diagnose.replay import spec_for
        try:
            chosen = Replay(spec_for(backend, g), os.getcwd())
        except Exception as e:
            return {"name": g.name, "kind": g.kind, "verdict": "error", "stage": getattr(e, "stage", "backend"),
                    "diverged": None, "message": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    now_doing(f"comparing graph {g.name} node by node")
    try:
        result = compare_graph(g.gm, g.inputs, chosen, name=g.name, kind=g.kind, tolerance=tolerance,
                               sources=g.node_sources)
    except Exception as e:  # a compile or run failure of this graph: its own stage, not a verdict
        stage = getattr(e, "stage", None)
        stage = stage if stage in ("lowering", "scheduling", "cpp_build", "kernel_runtime", "bad_input") else "backend"
        return {"name": g.name, "kind": g.kind, "verdict": "error", "stage": stage, "diverged": None,
                "message": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    return result.to_dict()


def _exit_code(rows: list) -> int:
    if any(r.get("diverged") for r in rows):
        return exit_code("accuracy")
    errors = [r for r in rows if r["verdict"] == "error"]
    return exit_code(errors[0]["stage"]) if errors else exit_code("ok")


def _aten_wrong(g: dict) -> bool:
    """An "ok" graph whose aten graph (AOTAutograd's) already differs from the Dynamo graph: the
    compiled graph matches a wrong reference, which is never an OK to count."""
    return g["verdict"] == "ok" and bool(g.get("notes")) and "aten graph itself differs" in g["notes"][-1]


def _summary(rows: list) -> str:
    counts: dict = {}
    for r in rows:
        verdict = "aten_wrong" if _aten_wrong(r) else r["verdict"]
        counts[verdict] = counts.get(verdict, 0) + 1
    return f"{len(rows)} graph(s): " + ", ".join(f"{n} {SUMMARY_WORDS[v]}" for v, n in counts.items())


# -- rendering ----------------------------------------------------------------------------------
def render(doc: dict) -> None:
    from rich.markup import escape
    c = out()
    for line in doc.get("replaced") or []:
        c.print(f"[bold yellow]replaced:[/] {escape(line)}")
    if doc.get("run"):
        c.print(f"[bold red]error:[/] {escape(doc['message'])}")
        return
    for s in doc.get("stages") or []:
        _render_stages(c, s)
    bisect = common.command_line(["tdbg", "bisect", doc["target"]] + _named(doc.get("backend") or common.OWN)
                                 + (["--", *doc["argv"]] if doc.get("argv") else [])) if doc.get("argv") is not None else None
    for g in doc["graphs"]:
        _render_graph(c, g, bisect)
    c.print(f"\n[bold]{escape(doc['message'])}[/]")


def _render_stages(c, s: dict) -> None:
    from rich.markup import escape
    from rich.table import Table
    label, style = STAGE_LABELS[s["verdict"]]
    if s["verdict"] == "aot" and s["backend"] == "torch:inductor":   # its AOT stage runs its own passes too
        label = "ATEN GRAPH DIFFERS (AOTAutograd or Inductor's joint-graph passes)"
    c.print(f"\n[bold]{escape(s['name'])}[/] (Dynamo graph vs aten graph vs compiled, backend "
            f"{escape(common.backend_label(s['backend']))}): [{style}]{label}[/]")
    c.print(f"  {escape(s['message'])}")
    if s.get("culprit"):
        k = s["culprit"]
        c.print(f"  [bold]source:[/] {escape(_relative(k.get('source')) or 'unknown (the node has no user line)')}")
        c.print(f"  [bold]FX node:[/] {escape(k['name'])} = {escape(k['op'])}(...) (Dynamo graph node {k['index']})")
    if s["diverged"]:
        t = Table(box=None, pad_edge=False, show_edge=False)
        for col in ("value", "aten vs eager", "compiled vs eager"):
            t.add_column(col, justify="left" if col == "value" else "right", no_wrap=True)
        for v in s["values"]:
            cells = [_err(v[k]) + (" x" if v[k]["diverges"] else "") if v.get(k) else "-"
                     for k in ("aot", "compiled")]
            t.add_row(escape(v["path"]), *cells, style="red" if any(c.endswith(" x") for c in cells) else None)
        from rich.padding import Padding
        c.print(Padding(t, (0, 0, 0, 2), expand=False))   # a piped console is 1000 columns wide
    for note in s.get("notes", []):
        c.print(f"  [dim]note: {escape(note)}[/]")


def _render_graph(c, g: dict, bisect: Optional[str] = None) -> None:
    from rich.markup import escape
    label, style = LABELS[g["verdict"]]
    if _aten_wrong(g):
        label, style = "OK AGAINST ITS ATEN GRAPH (which is wrong)", "yellow"
    if g["verdict"] == "error":
        c.print(f"\n[bold]{escape(g['name'])}[/] ({g['kind']}): [{style}]{label}[/] "
                f"({escape(common.STAGE_WORDS.get(g['stage'], g['stage']))}): {escape(g['message'])}")
        return
    what = f"{len(g['nodes'])} nodes, {len(g['outputs'])} outputs" if g["mode"] == "nodes" else \
        f"{len(g['outputs'])} outputs"
    backend = common.backend_label(g["backend"])
    c.print(f"\n[bold]{escape(g['name'])}[/] ({g['kind']}, {what}, backend {escape(backend)}): [{style}]{label}[/]")
    c.print(f"  {escape(g['message'])}")
    culprit = g.get("culprit") or (g["first_divergence"] if g["verdict"] in ("fused", "outputs_differ") else None)
    if culprit:
        c.print(f"  [bold]source:[/] {escape(_relative(culprit.get('source')) or 'unknown (the node has no user line)')}")
        c.print(f"  [bold]FX node:[/] {escape(culprit['name'])} = {escape(culprit['op'])}(...), {culprit['dtype']} "
                f"{tuple(culprit['shape'])}")
        if culprit.get("kernel"):
            c.print(f"  [bold]kernel:[/] {escape(culprit['kernel'])}")
    if g["verdict"] == "culprit":
        _table(c, g["nodes"], _window(g["nodes"], g["culprit"]["index"]), g["culprit"]["index"])
    elif g["verdict"] == "drift":
        step = max(1, len(g["nodes"]) // CURVE_ROWS)
        c.print(f"  error curve (every {step}th node, the last, and where tolerance is first exceeded; "
                "--json has every node):" if step > 1 else "  error curve:")
        _table(c, g["nodes"], _curve_rows(g["nodes"], g["first_divergence"]["index"]), g["first_divergence"]["index"],
               gaps=False, first="<- exceeds")
    elif g["verdict"] in ("fused", "outputs_differ"):
        _table(c, g["outputs"], range(len(g["outputs"])), None)
        if g["verdict"] == "fused":
            if bisect:   # a script's run: its own bisect command (a saved folder has no script to bisect)
                c.print(f"  next: {escape(bisect)} (finds the fusion that breaks it)")
    for note in g.get("notes", []):
        c.print(f"  [dim]note: {escape(note)}[/]")


def _relative(source):
    """'file:line in fn: code' with the file relative to the working directory when it is below it
    (--json keeps the path as recorded)."""
    if not source or not source.startswith(os.sep):
        return source
    path, sep, rest = source.partition(":")
    rel = os.path.relpath(path)
    return (rel if not rel.startswith("..") else path) + sep + rest


def _window(nodes: list, at: int) -> range:
    return range(max(0, at - WINDOW), min(len(nodes), at + WINDOW + 1))


def _curve_rows(nodes: list, crossing: int) -> list:
    step = max(1, len(nodes) // CURVE_ROWS)
    return sorted(set(range(0, len(nodes), step)) | {crossing, len(nodes) - 1})


def _table(c, rows: list, indices, mark, *, gaps: bool = True, first: str = "<- first") -> None:
    from rich.markup import escape
    from rich.table import Table
    t = Table(box=None, pad_edge=False, show_edge=False)
    for col in ("#", "node", "op", "err vs fp64", "eager vs fp64", "err vs eager", ""):
        t.add_column(col, justify="right" if col.startswith(("#", "err", "eager")) else "left", no_wrap=True)
    previous = None
    for i in indices:
        if gaps and previous is not None and i > previous + 1:
            t.add_row("...", "", "", "", "", "", "")
        previous = i
        r = rows[i]
        status = first if i == mark else ("x" if r["diverges"] else "")
        style = "bold red" if i == mark else ("red" if r["diverges"] else None)
        t.add_row(str(r["index"]), escape(r.get("path") or r["name"]), escape(r["op"]), _num(r["abs_ref"]),
                  _num(r["eager_abs_ref"]), _err(r), status, style=style)
    c.print(t)


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}"


def _err(row: dict) -> str:
    """A value's error vs eager, or what makes it incomparable ("dtype differs", "shape differs")."""
    return row["mismatch"].split(":")[0] if row.get("mismatch") else _num(row["abs_eager"])
