"""`tdbg explain`: graph breaks, recompiles and guards of every compiled function in a script."""
from __future__ import annotations

import click

from tdbg.cli import common
from tdbg.cli.console import doing, exit_code, exit_codes_help, fail, out, report_to_stderr, write_json

JSON_SCHEMA, JSON_VERSION = "tdbg.explain", 2


@click.command(epilog=exit_codes_help())
@common.script_arguments
@common.backend_option("Backends add guards of their own, so recompiles are counted under the one "
                       "that runs; `eager` is Dynamo's capture only, fastest.")
@click.option("--max-graph-breaks", type=click.IntRange(0), metavar="N",
              help="Exit with the `threshold` code when there are more than N graph-break sites.")
@click.option("--max-recompiles", type=click.IntRange(0), metavar="N",
              help="Exit with the `threshold` code when the script recompiles more than N times.")
@click.option("--code", "code_frame", metavar="FRAME",
              help="Show what Dynamo made of FRAME (a function name, FILE:LINE, a graph index, or `all`): "
                   "original source, the code Dynamo runs (decompiled), its guards in words, its graphs' code.")
@click.option("--break-at", metavar="FILE:LINE",
              help="Stop in pdb inside each graph's Python code at the ops of that user line "
                   "(--backend eager or aot_eager).")
@click.option("--caches", is_flag=True,
              help="Run the script twice (fresh processes, same cache directories) and say, per graph of the "
                   "second run, whether Inductor's FX graph cache, the AOTAutograd cache and tdbg's build cache "
                   "hit, missed or were bypassed, and for a miss which key component changed.")
@click.option("--against", "against", type=click.Path(dir_okay=False), metavar="SAVED.json",
              help="With --caches (implied): run once and compare its cache lookups with those of an earlier "
                   "`tdbg explain --caches --json SAVED.json` run instead of a first run.")
@common.timeout_option(None)
@common.json_option
def explain(script, args, backend, max_graph_breaks, max_recompiles, code_frame, break_at, caches, against, timeout,
            json_path):
    """Run SCRIPT (ARGS after --) under --backend and explain what Dynamo did with it.

    Per compiled function: graph count, ops per graph and the user lines they come from, graph
    breaks with the reason in plain words and the line, a guard summary, and each recompile with
    the guard that failed in user terms and what to do about it. With fullgraph=True a graph
    break stops the script: the break that stopped it is reported.
    """
    common.check_output_file(json_path, "--json")
    if json_path == "-":
        report_to_stderr()
    thresholds = {"max_graph_breaks": max_graph_breaks, "max_recompiles": max_recompiles}
    from tdbg.cli import code_view
    problem = common.script_or_backend_problem(script, backend) or code_view.break_at_problem(break_at, script,
                                                                                               backend)
    if problem:
        write_json(json_path, {"script": script, "argv": list(args), "backend": backend, "thresholds": thresholds,
                               "exceeded": [], "exit_code": exit_code("bad_input"), "status": "failed",
                               "stage": "bad_input", "error": {"stage": "bad_input", "type": "bad_input",
                                                               "message": problem, "source": None}},
                   JSON_SCHEMA, JSON_VERSION)
        fail(problem, "bad_input")
    from tdbg.minifier.diagnose.explain import build_report, exceeded
    from tdbg.cli.report import traces_for_page_only
    from tdbg.minifier.runs.runner import RunRequest, run_script
    request = RunRequest(script=script, argv=list(args), backend=backend, timeout=timeout,
                         stdout_to_stderr=json_path == "-", quiet_compiler_log=traces_for_page_only(),
                         code_view=code_frame is not None, break_at=break_at)
    cache_report = None
    if caches or against:
        from tdbg.minifier.diagnose.caches import explain_caches
        with doing(f"the cache runs of {script} with backend {common.backend_label(backend)}"):
            try:
                verdict, cache_report = explain_caches(request, against)
            except ValueError as e:
                fail(str(e), "bad_input")
    else:
        with doing(f"the run of {script} with backend {common.backend_label(backend)}"):
            verdict = run_script(request)
    report = build_report(verdict)
    if cache_report is not None:
        report["caches"] = cache_report
    problems = exceeded(report, max_graph_breaks, max_recompiles)
    code = _exit(verdict, problems, script)
    render(report, verdict, problems, script, backend)
    code_doc = code_view.document(verdict, code_frame)
    if code_doc:
        code_view.render(out(), code_doc)
    code_problem = code_view.problem(code_doc, verdict, break_at)
    if code_problem:
        code = exit_code("bad_input")
    write_json(json_path, {"script": script, "argv": list(args), "backend": backend,
                           "compile_backends": verdict.get("compile_backends"), "thresholds": thresholds,
                           "exceeded": problems, "exit_code": code, "status": verdict["status"],
                           "stage": verdict.get("stage"), "error": _short_error(verdict), **report,
                           "code": code_doc, "break_at": verdict.get("break_at")},
               JSON_SCHEMA, JSON_VERSION)
    if code_problem:
        fail(code_problem, "bad_input")
    raise SystemExit(code)


def _exit(verdict: dict, problems: list, script: str) -> int:
    if verdict["status"] == "ok" and verdict.get("compile_calls") == 0:
        verdict.update(status="failed", stage="bad_input",
                       error={"type": "bad_input", "message": common.never_compiled_message(script)})
    if verdict["status"] != "ok":
        return common.stage_exit_code(verdict)
    return exit_code("threshold") if problems else exit_code("ok")


def _short_error(verdict: dict):
    err = verdict.get("error")
    return None if not err else {k: err.get(k) for k in ("stage", "type", "message", "source")}


def render(report: dict, verdict: dict, problems: list, script: str, backend: str = "") -> None:
    from rich.markup import escape
    c = out()
    t = report["totals"]
    under = f" under {escape(common.ran_words(verdict, backend))}" if backend else ""
    c.print(f"[bold]{escape(script)}[/]{under}: {t['functions']} compiled function(s), "
            f"{_graphs(t['compiled_graphs'], t['graphs'])}, {t['graph_breaks']} graph break(s), "
            f"{t['recompiles']} recompile(s)")
    for line in common.replaced_lines(verdict, backend):
        c.print(f"  [bold yellow]replaced:[/] {escape(line)}")
    for fn in report["functions"]:
        _render_function(c, fn)
    stopped = report.get("stopped_by")
    if stopped:
        c.print("[bold red]Stopped:[/] with fullgraph=True a graph break is an error, so the script stopped at "
                "this one (nothing after it was captured)")
        c.print(f"      line: {escape(stopped['line'])}")
        c.print(f"      why: {escape(stopped['reason'])}")
        c.print("      fix: remove the break (see why), or drop fullgraph=True to let Dynamo split the graph")
    elif verdict["status"] != "ok":
        err = verdict.get("error") or {}
        violation = report.get("shape_violation")
        if violation:
            # a shape finding, not the script's own failure: Dynamo refused the frame's guards
            c.print(f"[bold red]Shape specialized:[/] {escape(violation['source'])} was marked dynamic, but "
                    f"{escape(violation['at'])}  {escape(violation['code'])}  made it the constant "
                    f"{escape(violation['value'])}")
            c.print(f"      guard: {escape(violation['source'])} == {escape(violation['value'])} "
                    "(the graph would hold only for that size)")
            c.print(f"      why: {escape(violation['cause'])}; Dynamo refuses to compile the frame "
                    "(ConstraintViolationError), so the run stopped there")
            c.print(f"      fix: {escape(violation['fix'])}")
        else:
            c.print(f"[bold red]The script failed[/] ({escape(common.STAGE_WORDS.get(verdict['stage'], ''))}): "
                    f"{escape(str(err.get('message', '')))}")
    if report.get("caches") is not None:
        render_caches(c, report["caches"])
    for problem in problems:
        c.print(f"[bold red]THRESHOLD EXCEEDED:[/] {escape(problem)}")


def _graphs(compiled: int, pieces: int) -> str:
    """'4 graph(s) for 3 piece(s)': every graph listed is counted; a piece is the function up to
    its first graph break or a resume point after one, and gets more than one graph when it is
    recompiled or reached another way (explain.build_report's `again`)."""
    return f"{compiled} graph(s)" + (f" for {pieces} piece(s)" if compiled != pieces else "")


# build_report's `again` -> what a graph compiled for a piece that already had one is
AGAIN_WORDS = {"recompile": "recompile of graph {0}'s piece: a guard failed",
               "other_path": "graph {0}'s piece again, reached another way, e.g. the other side of a branch"}


def _render_function(c, fn: dict) -> None:
    from rich.markup import escape
    c.print(f"\n[bold cyan]{escape(fn['function'])}[/]: {_graphs(fn['compiled_graphs'], fn['graph_count'])}, "
            f"{fn['graph_breaks']} graph break(s), {fn['recompile_count']} recompile(s)")
    for g in fn["graphs"]:
        ops = ", ".join(f"{k}" + (f" x{n}" if n > 1 else "") for k, n in g["ops"].items())
        again = f"; {AGAIN_WORDS[g['again']].format(g['again_of'])}" if g.get("again") else ""
        c.print(f"  graph {g['index']} ({escape(common.frame_label(g['frame']))}{again}): {g['op_count']} op(s): {escape(ops)}")
        for line in g["lines"]:
            c.print(f"      line {line['line']}: {escape(line['code'])}  [dim]-> {escape(', '.join(line['ops']))}[/]")
    for i, b in enumerate(fn["breaks"], 1):
        times = f" (x{b['count']})" if b["count"] > 1 else ""
        stop = " [red](stopped compilation: fullgraph=True)[/]" if b.get("stopped_compilation") else ""
        c.print(f"  [bold yellow]break {i}[/]{times}: {escape(b['line'])}{stop}")
        c.print(f"      why: {escape(b['reason'])}")
    guards = fn["guards"]
    if guards["total"]:
        kinds = ", ".join(f"{k} {n}" for k, n in guards["by_kind"].items())
        tensors = ", ".join(guards["tensors"]) or "none"
        c.print(f"  guards: {guards['total']} ({escape(kinds)}); tensors checked: {escape(tensors)}")
    told: set = set()   # a size recompile's why and fix, said once per function
    for r in fn["recompiles"]:
        where = f" at {r['line']}" if r.get("line") else ""
        head = "recompile" if r.get("compiled", True) else "guard failure (NOT recompiled: Dynamo's recompile limit)"
        c.print(f"  [bold magenta]{head}[/] of {escape(common.frame_label(r['frame']))}{escape(where)}: "
                f"{escape(r['changed'])}")
        for other in r["also"]:
            c.print(f"      also: {escape(other)}")
        size = r.get("size")
        if size:
            made = f"made at {size['created_at']}  {size['code']}" if size["created_at"] else "made at no user line"
            c.print(f"      failed guard: {escape(size['failed_guard'])} (compile {escape(size['compile_id'])}), "
                    f"{escape(made)}")
        if size and (size["cause"], r["suggestion"]) in told:
            continue
        if size:
            told.add((size["cause"], r["suggestion"]))
            c.print(f"      why: {escape(size['cause'])}")
        if r["suggestion"]:
            c.print(f"      fix: {escape(r['suggestion'])}")
    _render_shapes(c, fn, told)


_STATE_STYLE = {"hit": "green", "miss": "bold yellow", "bypass": "bold red"}


def render_caches(c, section: dict) -> None:
    """explain --caches: per graph of the compared run, each cache lookup and why it missed."""
    from rich.markup import escape

    from tdbg.minifier.diagnose.caches import summary_words
    first = section.get("first_run")
    against = section["against"] + (f" ({first['status']}, {first['duration_s']} s)" if first else "")
    c.print(f"\n[bold]Caches[/] of this run, compared with {escape(against)}:")
    for key, words in (("inductor", "Inductor cache dir"), ("tdbg_build", "tdbg build cache dir")):
        if (section.get("cache_dirs") or {}).get(key):
            c.print(f"  {words}: {escape(section['cache_dirs'][key])}")
    off = section.get("turned_off") or []
    for row in off:   # a cache turned off looks nothing up: without this line it would go unmentioned
        c.print(f"  [bold red]{escape(row['words'])}[/]")
    c.print("  " + escape("; ".join(summary_words(section)) or (
        "no other compile-cache lookup" if off else "no compile-cache lookup (nothing was compiled by a backend "
                                                   "with a cache)")))
    for g in section["graphs"]:
        c.print(f"  graph {escape(str(g['compile_id']))}" + (f" {escape(g['frame'])}" if g.get("frame") else "") + ":")
        for row in g["lookups"]:
            part = f" ({row['part']})" if row.get("part") else ""
            style = _STATE_STYLE[row["state"]]
            c.print(f"    {escape(row['layer_words'] + part)}: [{style}]{row['state']}[/]")
            if row.get("why"):
                vs = f" [dim](vs {escape(str(row['compared_with']))})[/]" if row.get("compared_with") else ""
                c.print(f"      why: {escape(row['why'])}{vs}")


def _render_shapes(c, fn: dict, told: set) -> None:
    """explain's shapes section of one function: per compile, its input dims and shape guards with
    the line and op that made each; then recompile storms. A (cause, fix) in `told` (said by a
    recompile above) is not said again."""
    from rich.markup import escape
    shapes = fn.get("shapes") or {}
    telling = any(f["guards"] or f["specializations"] or f.get("error") or any(d["state"] != "static" for i in f["inputs"]
                                                             for d in i["dims"]) for f in shapes.get("frames") or [])
    if not (telling or any(r.get("size") for r in fn["recompiles"])):
        return   # every dim static, no shape guard, no size recompile: nothing to say (the JSON has the dims)
    c.print(f"  [bold]shapes[/] ({escape(_dim_counts(shapes['dims']))}):")
    resized = {r["size"]["name"] for r in fn["recompiles"] if r.get("size")}
    for frame in shapes["frames"]:
        # inputs all static and never resized (parameters, mostly) are counted, not listed
        shown = [i for i in frame["inputs"] if i["name"] in resized or any(d["state"] != "static" for d in i["dims"])]
        dims = "; ".join(f"{i['name']}: " + ", ".join(_dim_words(d) for d in i["dims"]) for i in shown)
        rest = len(frame["inputs"]) - len(shown)
        if rest:
            dims += f"{'; ' if dims else ''}{rest} {'more ' if dims else ''}input(s) all static"
        dims = f"shapes unreadable ({frame['error']})" if frame.get("error") else dims or "no tensor inputs"
        c.print(f"    compile {escape(frame['compile_id'])} ({escape(frame['frame'])}): {escape(dims)}")
        for kind, items in (("guard", frame["guards"]), ("specialized", frame["specializations"])):
            for g in items:
                what = g["expr"] if kind == "guard" else f"{g['source']} = {g['value']}"
                where = f"{g['at']}  {g['code']}" if g["at"] else "no user line recorded"
                c.print(f"      {kind} {escape(what)} at {escape(where)}")
                if (g["cause"], g["fix"]) not in told:
                    told.add((g["cause"], g["fix"]))
                    c.print(f"          by: {escape(g['cause'])}")
                    if g["fix"]:
                        c.print(f"          fix: {escape(g['fix'])}")
    for storm in shapes.get("storms") or []:
        sizes = ", ".join(map(str, storm["sizes"]))
        cut = f", cut short by {storm['cut_by']}" if storm.get("cut_by") else ""
        c.print(f"  [bold red]recompile storm:[/] {escape(storm['source'])} never stabilized: "
                f"{storm['recompiles']} recompiles over sizes {escape(sizes)}{escape(cut)}")
        c.print(f"      fix: {escape(storm['fix'])}")
    limit = fn.get("recompile_limit")
    if limit:
        c.print(f"  [bold red]recompile limit:[/] {escape(limit['words'])}")
        if limit.get("reason"):
            c.print(f"      last guard failure: {escape(limit['reason'])}")
        c.print(f"      fix: {escape(limit['fix'])}")


def _dim_words(d: dict) -> str:
    at = f" at {d['specialized_at']}" if d.get("specialized_at") else ""
    return f"dim {d['dim']} = {d['size']} {d['state']}{at}"


def _dim_counts(counts: dict) -> str:
    return ", ".join(f"{counts[k]} {k}" for k in ("static", "dynamic", "specialized") if counts.get(k)) + \
        " input dim(s) over all compiles"
