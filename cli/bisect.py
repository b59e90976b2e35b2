"""`tdbg bisect`: the first failing backend, then the culprit inside tdbg's compiler."""
from __future__ import annotations

import click

from tdbg.cli import common
from tdbg.cli.console import doing, err, exit_code, exit_codes_help, fail, now_doing, out, report_to_stderr, write_json

# version 2: runs' exit_code became script_exit_code (the script's own status, never tdbg's exit
# code); culprits and the document have `source` (the culprit op's own user line); next_commands
JSON_SCHEMA, JSON_VERSION = "tdbg.bisect", 2


@click.command(epilog=exit_codes_help() + "\n\n\bbisect exits with the failing stage's code when it finds a "
               "failure, `not_reproduced` when every backend passes, `bad_input` when a backend of the chain "
               "cannot be run, and the script's own code when the script fails uncompiled.")
@common.script_arguments
@common.backend_option("The chain walks up to it (own: the one backend the script's torch.compile calls "
                       "ask for).")
@common.timeout_option(300.0)
@click.option("--jobs", type=click.IntRange(1), default=2, show_default=True,
              help="Child processes run at once while probing compiler subsystems.")
@common.json_option
def bisect(script, args, backend, timeout, jobs, json_path):
    """Find where SCRIPT (ARGS after --) breaks under torch.compile with --backend.

    Runs it uncompiled, then along the backends chain up to --backend (inductor, tdbg's compiler:
    eager, aot_eager, inductor; torch:inductor: eager, torch:aot_eager, torch:aot_eager_decomp_partition,
    torch:inductor; any other: eager, then it), each in its own process with every compiled graph
    checked against eager. When tdbg's compiler is the first to fail it goes on by itself: which
    graph, which compiler subsystem, then which lowered op or fusion (FX node and kernel). When a
    layer of the real Inductor is, torch's compiler bisector switches its subsystems off one at a
    time and bisects the counted ones (lowerings, passes, decompositions) to the one application.
    Prints the command and environment that reproduce it.
    """
    common.check_output_file(json_path, "--json")
    if json_path == "-":
        report_to_stderr()
    problem = common.script_or_backend_problem(script, backend)
    if problem:
        write_json(json_path, {"script": script, "argv": list(args), "backend": backend,
                               "exit_code": exit_code("bad_input"), "runs": [],
                               "verdict": {"level": "bad_input", "stage": "bad_input", "summary": problem}},
                   JSON_SCHEMA, JSON_VERSION)
        fail(problem, "bad_input")
    from tdbg.minifier.diagnose.bisect import bisect as run_bisect
    with doing(f"bisecting {script}"):
        result = run_bisect(script, list(args), {}, backend=backend, timeout=timeout, jobs=jobs, on_step=_progress)
    code = _exit(result)
    minify = _minify_command(result, script, args)
    render(result, minify)
    write_json(json_path, {"script": script, "argv": list(args), "exit_code": code, "minify_command": minify,
                           "next_commands": _next_commands(result, minify), **result}, JSON_SCHEMA, JSON_VERSION)
    raise SystemExit(code)


def _progress(record: dict) -> None:
    from rich.markup import escape
    status = "[green]pass[/]" if record["status"] == "ok" else f"[red]fail ({record['stage']})[/]"
    err().print(f"  run {escape(record['label']):<28} {status}  {record.get('duration_s') or 0:.1f} s")
    now_doing(f"bisecting, the runs after '{record['label']}'")


def _exit(result: dict) -> int:
    verdict = result["verdict"]
    if verdict["level"] == "none":
        return exit_code("not_reproduced")
    if verdict["level"] == "unreachable":   # bad input, or tdbg's own failure (internal)
        return exit_code("internal" if verdict["stage"] == "internal" else "bad_input")
    if verdict["level"] == "script":
        return common.stage_exit_code({"status": "failed", "stage": "script",
                                       "script_exit_code": (result["reference"] or {}).get("script_exit_code")}) \
            if verdict["stage"] == "script" else common.stage_exit_code({"status": "failed", **verdict})
    return common.stage_exit_code({"status": "failed", "stage": verdict["stage"]})


def _minify_command(result: dict, script: str, args) -> str:
    """The minify that captures the first failing backend's failure ("" when none fits: a
    script's own failure after matching calls has no failing graph). Every layer below that
    backend passed, so a compiler's failure is in its own compile (--after aot where it has one)."""
    level, backend = result["verdict"]["level"], result.get("first_failing_backend")
    if level in ("none", "script", "bad_input", "unreachable", "dynamo") or not backend:
        return ""
    if any(c.get("subsystem") in BEFORE_AOT_GRAPH for c in result.get("culprits") or ()):
        # the aten graph --after aot captures comes out of these passes: their bug is already in it
        return common.minify_command(script, args, backend, result["verdict"]["stage"]) or ""
    return common.minify_command(script, args, backend, result["verdict"]["stage"], layer_checked=True) or ""


# Inductor subsystems that rewrite the graph before its inner compiler gets the aten graph
BEFORE_AOT_GRAPH = ("pre_grad_passes", "joint_graph_passes")


def _reproduce_line(repro: dict) -> str:
    env = " ".join(f"{k}={common.command_line([v])}" for k, v in repro["env"].items())
    return (env + " " if env else "") + common.command_line(repro["argv"])


# a script that fails after every checked call matched: how many calls the suggested run checks
CHECK_MORE_CALLS = 100


def _check_more(result: dict) -> str:
    """For a script's own failure after compiled calls that matched eager (stage script at a
    backend): the run that checks CHECK_MORE_CALLS calls of each graph, else ""."""
    repro = result.get("reproduce")
    if result["verdict"].get("stage") != "script" or not repro or "--check-accuracy" not in repro["argv"]:
        return ""
    argv = list(repro["argv"])
    at = argv.index("--check-accuracy") + 1
    return _reproduce_line(dict(repro, argv=argv[:at] + ["--check-calls", str(CHECK_MORE_CALLS)] + argv[at:]))


def _next_commands(result: dict, minify: str) -> list:
    """What to run next, as shown: the reproducing run, then the minify or the run that checks
    more calls (each one runs on this case)."""
    repro, more = result.get("reproduce"), _check_more(result)
    return ([_reproduce_line(repro)] if repro else []) + [c for c in (minify, more) if c]


def render(result: dict, minify: str) -> None:
    from rich.markup import escape
    c = out()
    own, label = result.get("own"), common.backend_label(result.get("backend"))
    if own and result.get("backend"):
        c.print(f"[bold]Backend:[/] {escape(label)}, the script's own (torch.compile asks for "
                f"{escape(', '.join(own['asked']))})")
    if own and own.get("note"):
        c.print(f"  [bold yellow]note:[/] {escape(own['note'])}")
    if result.get("replaced"):
        c.print(f"  [bold yellow]replaced:[/] your script asked for {escape('; '.join(result['replaced']))}; the chain "
                f"runs up to {escape(label)} instead (--backend {escape(result['backend'])})")
    _render_chain(c, result)
    if result["subsystems"]:
        c.print("[bold]Compiler subsystems[/] (switched off one at a time):")
        for row in result["subsystems"]:
            change = ", ".join(f"{k}={v}" for k, v in row["change"].items())
            c.print(f"  {row['name']:<32} {change:<28} {escape(row['result'])}")
    for culprit in result["culprits"]:
        if "subsystem" in culprit:
            _render_torch_culprit(c, culprit)
            continue
        c.print(f"[bold]Culprit {escape(culprit['kind'])}[/]: #{culprit['index']} "
                f"(fails with {culprit['knob']}={culprit['count']}, passes with {culprit['passes_with']})")
        for key in ("fx_node", "target", "kernel", "graph", "source"):
            if culprit.get(key) not in (None, ""):
                c.print(f"  {key.replace('_', ' ')}: {escape(str(culprit[key]))}")
    verdict = result["verdict"]
    color = "green" if verdict["level"] == "none" else "red"
    c.print(f"[bold {color}]Verdict:[/] {escape(verdict['summary'])}")
    _render_error(c, result)
    _render_commands(c, result, minify)


def _render_chain(c, result: dict) -> None:
    from rich.markup import escape
    from rich.table import Table
    table = Table(title="Backends chain (each run compared with the uncompiled run)", title_justify="left",
                  show_edge=False, pad_edge=False)
    table.add_column("backend", overflow="fold")
    table.add_column("adds")
    table.add_column("result", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    ran = {row["backend"]: row for row in result["backends"]}
    for backend in result.get("chain") or [row["backend"] for row in result["backends"]]:
        row = ran.get(backend)
        status = "not run" if row is None else "[green]pass[/]" if row["status"] == "ok" \
            else f"[red]FAIL[/] ({row['stage']})"
        words = (row or {}).get("adds") or ""
        time_s = f"{row['duration_s']:.1f} s" if row and row.get("duration_s") is not None else ""
        table.add_row(escape(common.backend_label(backend)), escape(words), status, time_s)
    c.print(table)


def _render_torch_culprit(c, culprit: dict) -> None:
    from rich.markup import escape
    if culprit["index"] is None:
        c.print(f"[bold]{escape(culprit['subsystem'])}[/]: {escape(culprit['note'])}")
        return
    c.print(f"[bold]Culprit {escape(culprit['subsystem'])}[/]: #{culprit['index']} of {culprit['of']} "
            f"(fails with the first {culprit['count']} on, passes with the first {culprit['passes_with']} on)")
    for key in ("applied", "target"):
        if culprit.get(key):
            c.print(f"  {key}: {escape(str(culprit[key]))}")
    if culprit.get("kernels"):
        c.print(f"  kernel: {escape(', '.join(culprit['kernels']))}")
    if culprit.get("source"):
        c.print(f"  source: {escape(culprit['source'])}")


def _render_error(c, result: dict) -> None:
    from rich.markup import escape
    failing = next((b for b in result["backends"] if b["status"] != "ok"), None)
    error = (failing or {}).get("error") or (result["reference"] or {}).get("error")
    if not error or result["verdict"]["level"] == "none":
        return
    source = result.get("source") or error.get("source")
    if source:
        c.print(f"  source: {escape(source)}")
    if error.get("source") and error["source"] != source:   # the culprit's line above; where it showed here
        c.print(f"  seen at: {escape(error['source'])}")
    # the whole message (runs keep its first lines, each whole): a cut line may be the hint
    for line in str(error.get("message") or "").splitlines():
        c.print(f"    {escape(line)}")


def _render_commands(c, result: dict, minify: str) -> None:
    from rich.markup import escape
    repro = result.get("reproduce")
    if repro:
        c.print("[bold]Reproduce:[/]")
        c.print(f"  {escape(_reproduce_line(repro))}")
        if repro.get("checked"):
            c.print(f"  (checked: {escape(repro['checked'])})")
    workaround = result.get("workaround")
    if workaround and workaround["passes"]:
        c.print(f"[bold]Workaround:[/] TDBG_FALLBACK_OPS={escape(','.join(workaround['fallback_ops']))} "
                "(the program passes with that op run by aten)")
    if minify:
        c.print("[bold]Minify:[/]")
        c.print(f"  {escape(minify)}")
    more = _check_more(result)
    if more:
        c.print("[bold]Check more calls:[/]")
        c.print(f"  {escape(more)}")
    c.print(f"[dim]{len(result['runs'])} runs in {result['duration_s']:.1f} s[/]")
