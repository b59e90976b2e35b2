"""`tdbg bisect`: the first failing backend, then the culprit inside tdbg's compiler."""
from __future__ import annotations

import click

from tdbg.cli import common
from tdbg.cli.console import err, exit_code, exit_codes_help, out, report_to_stderr, write_json

JSON_SCHEMA, JSON_VERSION = "tdbg.bisect", 1


@click.command(epilog=exit_codes_help() + "\n\n\bbisect exits with the failing stage's code when it finds a "
               "failure, `not_reproduced` when every backend passes, and the script's own code when the script "
               "fails uncompiled.")
@common.script_arguments
@common.timeout_option(300.0)
@click.option("--jobs", type=click.IntRange(1), default=2, show_default=True,
              help="Child processes run at once while probing compiler subsystems.")
@common.json_option
def bisect(script, args, timeout, jobs, json_path):
    """Find where SCRIPT (ARGS after --) breaks under torch.compile.

    Runs it uncompiled, then with eager, aot_eager and inductor (tdbg's compiler), each in its own
    process with every compiled graph checked against eager. When tdbg's compiler is the first to
    fail it goes on by itself: which graph, which compiler subsystem, then which lowered op or
    fusion (FX node and kernel), and prints the command and environment that reproduce it.
    """
    common.require_script(script)
    if json_path == "-":
        report_to_stderr()
    from tdbg.minifier.diagnose.bisect import bisect as run_bisect
    result = run_bisect(script, list(args), {}, timeout=timeout, jobs=jobs, on_step=_progress)
    code = _exit(result)
    minify = _minify_command(result, script, args)
    render(result, minify)
    write_json(json_path, {"script": script, "argv": list(args), "exit_code": code, "minify_command": minify,
                           **result}, JSON_SCHEMA, JSON_VERSION)
    raise SystemExit(code)


def _progress(record: dict) -> None:
    from rich.markup import escape
    status = "[green]pass[/]" if record["status"] == "ok" else f"[red]fail ({record['stage']})[/]"
    err().print(f"  run {escape(record['label']):<28} {status}  {record.get('duration_s') or 0:.1f} s")


def _exit(result: dict) -> int:
    verdict = result["verdict"]
    if verdict["level"] == "none":
        return exit_code("not_reproduced")
    if verdict["level"] == "script":
        return common.stage_exit_code({"status": "failed", "stage": "script",
                                       "exit_code": (result["reference"] or {}).get("exit_code")}) \
            if verdict["stage"] == "script" else common.stage_exit_code({"status": "failed", **verdict})
    return common.stage_exit_code({"status": "failed", "stage": verdict["stage"]})


def _minify_command(result: dict, script: str, args) -> str:
    level = result["verdict"]["level"]
    if level not in ("compiler", "aot_autograd"):
        return ""
    stage = result["verdict"]["stage"]
    words = ["tdbg", "minify", script, "--after", "aot", "--level",
             "4" if stage == "accuracy" else "3" if stage in ("crash", "timeout") else "2"]
    return common.command_line(words + (["--", *args] if args else []))


def render(result: dict, minify: str) -> None:
    from rich.markup import escape
    c = out()
    c.print("[bold]Backends[/] (each run compared with the uncompiled run):")
    for row in result["backends"]:
        status = "[green]pass[/]" if row["status"] == "ok" else f"[red]FAIL[/] ({row['stage']})"
        c.print(f"  {row['backend']:<10} {status}")
    if result["subsystems"]:
        c.print("[bold]Compiler subsystems[/] (switched off one at a time):")
        for row in result["subsystems"]:
            change = ", ".join(f"{k}={v}" for k, v in row["change"].items())
            c.print(f"  {row['name']:<16} {change:<24} {escape(row['result'])}")
    for culprit in result["culprits"]:
        c.print(f"[bold]Culprit {escape(culprit['kind'])}[/]: #{culprit['index']} "
                f"(fails with {culprit['knob']}={culprit['count']}, passes with {culprit['passes_with']})")
        for key in ("fx_node", "target", "kernel", "graph"):
            if culprit.get(key) not in (None, ""):
                c.print(f"  {key.replace('_', ' ')}: {escape(str(culprit[key]))}")
    verdict = result["verdict"]
    color = "green" if verdict["level"] == "none" else "red"
    c.print(f"[bold {color}]Verdict:[/] {escape(verdict['summary'])}")
    _render_error(c, result)
    _render_commands(c, result, minify)


def _render_error(c, result: dict) -> None:
    from rich.markup import escape
    failing = next((b for b in result["backends"] if b["status"] != "ok"), None)
    error = (failing or {}).get("error") or (result["reference"] or {}).get("error")
    if not error or result["verdict"]["level"] == "none":
        return
    if error.get("source"):
        c.print(f"  source: {escape(error['source'])}")
    lines = str(error.get("message") or "").splitlines()[:6]
    for line in lines:
        c.print(f"    {escape(line)}")


def _render_commands(c, result: dict, minify: str) -> None:
    from rich.markup import escape
    repro = result.get("reproduce")
    if repro:
        env = " ".join(f"{k}={common.command_line([v])}" for k, v in repro["env"].items())
        c.print("[bold]Reproduce:[/]")
        c.print(f"  {escape((env + ' ') if env else '')}{escape(common.command_line(repro['argv']))}")
    workaround = result.get("workaround")
    if workaround and workaround["passes"]:
        c.print(f"[bold]Workaround:[/] TDBG_FALLBACK_OPS={escape(','.join(workaround['fallback_ops']))} "
                "(the program passes with that op run by aten)")
    if minify:
        c.print("[bold]Minify:[/]")
        c.print(f"  {escape(minify)}")
    c.print(f"[dim]{len(result['runs'])} runs in {result['duration_s']:.1f} s[/]")
