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
@common.timeout_option(None)
@common.json_option
def explain(script, args, backend, max_graph_breaks, max_recompiles, timeout, json_path):
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
    problem = common.script_or_backend_problem(script, backend)
    if problem:
        write_json(json_path, {"script": script, "argv": list(args), "backend": backend, "thresholds": thresholds,
                               "exceeded": [], "exit_code": exit_code("bad_input"), "status": "failed",
                               "stage": "bad_input", "error": {"stage": "bad_input", "type": "bad_input",
                                                               "message": problem, "source": None}},
                   JSON_SCHEMA, JSON_VERSION)
        fail(problem, "bad_input")
    from tdbg.minifier.diagnose.explain import build_report, exceeded
    from tdbg.minifier.runs.runner import RunRequest, run_script
    with doing(f"the run of {script} with backend {backend}"):
        verdict = run_script(RunRequest(script=script, argv=list(args), backend=backend,
                                        timeout=timeout, stdout_to_stderr=json_path == "-"))
    report = build_report(verdict)
    problems = exceeded(report, max_graph_breaks, max_recompiles)
    code = _exit(verdict, problems, script)
    render(report, verdict, problems, script, backend)
    write_json(json_path, {"script": script, "argv": list(args), "backend": backend,
                           "compile_backends": verdict.get("compile_backends"), "thresholds": thresholds,
                           "exceeded": problems, "exit_code": code, "status": verdict["status"],
                           "stage": verdict.get("stage"), "error": _short_error(verdict), **report},
               JSON_SCHEMA, JSON_VERSION)
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
    c.print(f"[bold]{escape(script)}[/]{under}: {t['functions']} compiled function(s), {t['graphs']} graph(s), "
            f"{t['graph_breaks']} graph break(s), {t['recompiles']} recompile(s)")
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
            c.print(f"[bold red]Shape specialized:[/] {escape(violation['source'])} was marked dynamic, but "
                    f"{escape(violation['at'])}  {escape(violation['code'])}  made it the constant "
                    f"{escape(violation['value'])}")
            c.print(f"      fix: {escape(violation['fix'])}")
        c.print(f"[bold red]The script failed[/] ({escape(common.STAGE_WORDS.get(verdict['stage'], ''))}): "
                f"{escape(str(err.get('message', '')))}")
    for problem in problems:
        c.print(f"[bold red]THRESHOLD EXCEEDED:[/] {escape(problem)}")


def _render_function(c, fn: dict) -> None:
    from rich.markup import escape
    extra = fn["compiled_graphs"] - fn["graph_count"]
    compiled = f" ({fn['compiled_graphs']} compiled: {extra} more for recompiles or other branch outcomes)" \
        if extra else ""
    c.print(f"\n[bold cyan]{escape(fn['function'])}[/]: {fn['graph_count']} graph(s){compiled}, "
            f"{fn['graph_breaks']} graph break(s), {fn['recompile_count']} recompile(s)")
    for g in fn["graphs"]:
        ops = ", ".join(f"{k}" + (f" x{n}" if n > 1 else "") for k, n in g["ops"].items())
        c.print(f"  graph {g['index']} ({escape(g['frame'])}): {g['op_count']} op(s): {escape(ops)}")
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
        c.print(f"  [bold magenta]recompile[/] of {escape(r['frame'])}{escape(where)}: {escape(r['changed'])}")
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
        c.print(f"  [bold red]recompile storm:[/] {escape(storm['source'])} never stabilized: "
                f"{storm['recompiles']} recompiles over sizes {escape(sizes)}")
        c.print(f"      fix: {escape(storm['fix'])}")


def _dim_words(d: dict) -> str:
    at = f" at {d['specialized_at']}" if d.get("specialized_at") else ""
    return f"dim {d['dim']} = {d['size']} {d['state']}{at}"


def _dim_counts(counts: dict) -> str:
    return ", ".join(f"{counts[k]} {k}" for k in ("static", "dynamic", "specialized") if counts.get(k)) + \
        " input dim(s) over all compiles"
