"""`tdbg run`: run a script with every torch.compile sent to one backend; say what broke."""
from __future__ import annotations

import os

import click

from tdbg.cli import common, determinism_view
from tdbg.cli.console import doing, exit_codes_help, fail, out, report_to_stderr, write_json

# version 2: verdict.exit_code became verdict.script_exit_code (the script's own status, never tdbg's
# exit code, which is the document's exit_code); errors have source_lines
# (new fields keep the version: --check-determinism added options.check_determinism, verdict.check_determinism,
# graphs[].determinism and the stage nondeterministic)
JSON_SCHEMA, JSON_VERSION = "tdbg.run", 2
COMPILER_STAGES = ("aot_autograd", "lowering", "scheduling", "cpp_build", "kernel_runtime", "accuracy",
                   "crash", "timeout", "backend")
# failure stage -> what the FAILED line says when the failure is in a graph's backward
BACKWARD_WORDS = {
    "accuracy": "a compiled graph's backward gives gradients that differ from eager autograd",
    "kernel_runtime": "a compiled kernel of a graph's backward failed while running",
    "crash": "the process died from a signal while running a compiled graph's backward",
    "backend": "the backend failed while running a compiled graph's backward",
}


@click.command(epilog=exit_codes_help())
@common.script_arguments
@common.backend_option()
@click.option("--debug", is_flag=True, help="Write the compiler's debug directory; its path is printed at the end.")
@click.option("--logs", metavar="CHANNELS", default="",
              help="Comma-separated log channels: tdbg's compiler,output_code,schedule,graph and torch's "
                   "dynamo,aot,graph_breaks,recompiles,guards,graph_code,bytecode ('+name' = verbose).")
@click.option("--fullgraph", is_flag=True, help="Every torch.compile gets fullgraph=True: a graph break is an error.")
@click.option("--function", "function", metavar="NAME", help="Compile only frames of the function NAME; others run eagerly.")
@click.option("--check-accuracy/--no-check-accuracy", default=True, show_default=True,
              help="Compare compiled calls with eager on an untouched copy of each graph (float64 reference, "
                   "per-dtype tolerances): outputs, and gradients when the call builds an autograd graph. "
                   "Checked: each graph's first 3 calls and every later call with a new input signature. "
                   "--no-check-accuracy only runs the script (OK then means: no error).")
@click.option("--check-calls", type=click.IntRange(min=1), metavar="N",
              help="Check each graph's first N calls (and up to N later calls with a new input signature).")
@click.option("--check-determinism", is_flag=True,
              help="At each graph's first call, run the compiled graph twice and eager twice on copies of the same "
                   "inputs, each from the same RNG state, and compare bit for bit (outputs, inputs written, "
                   "gradients); name the first graph, FX node, kernel and line whose value differs between "
                   "compiled runs. Eager's own nondeterminism is reported apart. See docs/determinism.md.")
@click.option("--repro-after", type=click.Choice(["dynamo", "aot"]),
              help="Dump repro files for the graph after Dynamo or after AOTAutograd (also TDBG_REPRO_AFTER).")
@click.option("--repro-level", type=click.IntRange(1, 4), help="1 repro.py on compile failure, 2 launcher on failure, "
              "3 launcher before every compile, 4 accuracy check and dump on mismatch (default 2).")
@click.option("--out", "out_dir", metavar="DIR", help="Directory for repro files (default tdbg_repro/<time>/).")
@click.option("--save-io", "save_io", metavar="DIR",
              help="Save every compiled graph (aten graphs after AOTAutograd, forward and backward, when the "
                   "backend has an AOT stage; else Dynamo's graph) with its real inputs, eager outputs and compiled "
                   "outputs, at each call with a new input signature, into the new folder DIR "
                   "(see `tdbg replay`, `tdbg diff`).")
@click.option("--profile", "profile_io", is_flag=True,
              help="With --save-io: also save each graph's median compiled call time (for `tdbg diff`).")
@click.option("--kernel-tests", "kernel_tests", metavar="DIR",
              help="Write one pytest file per compiled kernel into the new folder DIR (from the graphs --save-io "
                   "saves; a temporary folder when --save-io is not given).")
@common.timeout_option(None)
@common.json_option
def run(script, args, backend, debug, logs, fullgraph, function, check_accuracy, check_calls, check_determinism,
        repro_after, repro_level, out_dir, save_io, profile_io, kernel_tests, timeout, json_path):
    """Run SCRIPT as __main__ (with its own ARGS after --), every torch.compile using --backend.

    On failure: which stage broke, the user's source line, the FX node and kernel when known, the
    first lines of the real error, and the next command to run.
    """
    common.require_script(script)
    if json_path == "-":
        report_to_stderr()
    _check_values(check_accuracy, check_calls, function)
    common.check_output_file(json_path, "--json")
    common.check_output_dir(out_dir, "--out")
    _check_save_io(save_io, profile_io, kernel_tests, repro_after)
    if check_determinism and (save_io or kernel_tests or repro_after):
        fail("--check-determinism compiles extra copies of each graph, which --save-io, --kernel-tests and "
             "--repro-after would save as graphs of the script; run them separately.", "usage")
    common.check_backend(backend)
    tdbg_logs, torch_logs = _split_logs(logs)
    changes = {"debug": True} if debug else {}
    if profile_io and backend == "inductor":   # profiler ranges around each kernel: per-kernel times
        changes["enable_kernel_profile"] = True
    if tdbg_logs:
        changes["logs"] = sorted({p.lstrip("+") for p in tdbg_logs})
        changes["verbose_logs"] = sorted({p.lstrip("+") for p in tdbg_logs if p.startswith("+")})
    from tdbg.cli.report import traces_for_page_only
    from tdbg.minifier.runs.runner import RunRequest, run_script, parse_torch_logs
    repro = _repro(repro_after, repro_level, out_dir)
    request = RunRequest(script=script, argv=list(args), backend=backend, fullgraph=fullgraph, function=function,
                         check_accuracy=check_accuracy, check_calls=check_calls, config_changes=changes,
                         torch_logs=parse_torch_logs(torch_logs), repro=repro, repro_from_env=repro is None,
                         timeout=timeout, stdout_to_stderr=json_path == "-",
                         quiet_compiler_log=not debug and traces_for_page_only(), check_determinism=check_determinism)
    with _io_folder(save_io, kernel_tests) as io_dir:
        request.save_io, request.save_io_profile = io_dir, profile_io
        with doing(f"the run of {script} with backend {common.backend_label(backend)}"):
            verdict = run_script(request)
        verdict["timeout"] = timeout
        code, commands = _outcome(verdict, script, args, backend, function)
        if kernel_tests:
            verdict["kernel_tests"] = _kernel_tests(io_dir, kernel_tests, verdict)
            if not save_io and verdict.get("save_io"):   # the folder is gone once the tests are written
                verdict["save_io"]["temporary"] = True
    render(verdict, script, backend, code, commands)
    write_json(json_path, {"script": script, "argv": list(args), "backend": backend,
                           "options": {"fullgraph": fullgraph, "function": function, "check_accuracy": check_accuracy,
                                       "check_calls": check_calls, "check_determinism": check_determinism,
                                       "debug": debug, "logs": logs,
                                       "timeout": timeout, "save_io": save_io, "profile": profile_io,
                                       "kernel_tests": kernel_tests},
                           "exit_code": code, "next_commands": commands, "verdict": verdict},
               JSON_SCHEMA, JSON_VERSION)
    raise SystemExit(code)


def _check_values(check_accuracy: bool, check_calls, function) -> None:
    """Refuse values no run can honour, before any work (--timeout's range is click's)."""
    if check_calls is not None and not check_accuracy:
        fail("--check-calls N says how many calls the accuracy check compares; it cannot be combined with "
             "--no-check-accuracy.", "usage")
    if function is not None and not function.isidentifier():
        fail(f"--function {function!r}: give the name of a Python function (an identifier), e.g. --function forward.",
             "usage")


def _check_save_io(save_io, profile_io: bool, kernel_tests, repro_after) -> None:
    """--save-io / --kernel-tests folders must be new or empty, before any work."""
    if profile_io and not save_io:
        fail("--profile times the graphs --save-io saves; add --save-io DIR.", "usage")
    if (save_io or kernel_tests) and repro_after:
        fail("--save-io and --kernel-tests cannot be combined with --repro-after (both hook the backend's "
             "compiler); run them separately.", "usage")
    common.check_output_dir(save_io, "--save-io")
    common.check_output_dir(kernel_tests, "--kernel-tests")
    if save_io and kernel_tests and os.path.abspath(save_io) == os.path.abspath(kernel_tests):
        fail("--save-io and --kernel-tests need two different folders.", "usage")


def _io_folder(save_io, kernel_tests):
    """The folder graphs are saved in: --save-io's, else (for --kernel-tests) a temporary one."""
    import contextlib
    import tempfile
    if save_io or not kernel_tests:
        return contextlib.nullcontext(save_io)
    return tempfile.TemporaryDirectory(prefix="tdbg-save-io-")


def _kernel_tests(io_dir: str, out_dir: str, verdict: dict) -> dict:
    """Write the kernel tests from the saved folder (diagnose/kernel_tests.py): {"dir", "files",
    "kernels"} or {"error"} when the saved graphs cannot give tests (the run's verdict stands)."""
    from tdbg.minifier.diagnose.kernel_tests import write_kernel_tests
    from tdbg.compiler.errors import TdbgError
    if not (verdict.get("save_io") or {}).get("graphs"):
        return {"dir": out_dir, "error": "no graph was saved, so there is no kernel to test"}
    try:
        result = write_kernel_tests(io_dir, out_dir)
    except TdbgError as e:
        return {"dir": out_dir, "error": str(e)}
    return {"dir": out_dir, "files": list(result.files), "kernels": int(result.kernels), "command": result.command,
            "skipped": [{"graph": g, "reason": r} for g, r in result.skipped]}


def _split_logs(spec: str):
    from tdbg.minifier.runs.runner import TORCH_LOG_CHANNELS
    tdbg_channels = ("compiler", "output_code", "schedule", "graph")
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [p for p in parts if p.lstrip("+") not in tdbg_channels + TORCH_LOG_CHANNELS]
    if unknown:
        fail(f"unknown log channel(s) {', '.join(unknown)}; tdbg channels: {', '.join(tdbg_channels)}; "
             f"torch channels: {', '.join(TORCH_LOG_CHANNELS)}.", "usage")
    return ([p for p in parts if p.lstrip("+") in tdbg_channels],
            [p for p in parts if p.lstrip("+") in TORCH_LOG_CHANNELS])


def _repro(after, level, out_dir):
    """--repro-* options; None lets the child read TDBG_REPRO_AFTER/LEVEL (and the torch names)."""
    if after is None and (level or out_dir):
        fail("--repro-level and --out need --repro-after dynamo|aot.", "usage")
    return {"after": after, "level": level or 2, "out_dir": out_dir} if after else None


def _outcome(verdict: dict, script: str, args, backend: str, function=None):
    """(exit code, next commands). A run that never compiled anything is bad input."""
    nothing = common.nothing_to_check(verdict, script)
    if nothing and not (function and verdict.get("compile_calls")):   # --function's own message below
        verdict.update(status="failed", stage="bad_input", error={"type": "bad_input", "message": nothing})
    elif verdict["status"] == "ok" and function and not verdict.get("graphs"):
        # by their functions' names (a resume function is its function's): what --function takes
        from tdbg.minifier.runs.names import function_of
        skipped = list(dict.fromkeys(function_of(f) for f in verdict.get("skipped_frames") or []))
        seen = f"the functions torch.compile reached were: {', '.join(skipped)}" if skipped else \
            "torch.compile reached no frame at all"
        verdict.update(status="failed", stage="bad_input",
                       error={"type": "bad_input", "message": f"--function {function}: no frame of a function named "
                              f"{function!r} was compiled ({seen}); nothing was checked. Give one of those names."})
    elif verdict["status"] == "ok":
        determinism_view.fail_if_nondeterministic(verdict)
    return common.stage_exit_code(verdict), next_commands(verdict, script, args, backend)


def next_commands(verdict: dict, script: str, args, backend: str) -> list:
    stage = verdict.get("stage")
    words = common.script_words(script, args)
    tail = ["--", *args] if args else []
    # the backend is always named (a suggestion must not depend on a command's default): the one the
    # script's own calls resolved to when there is one, else --backend's (own keeps mode/options)
    named = common.ran_backend(verdict, backend) or backend
    bisect = ["tdbg", "bisect", script, "--backend", named] + tail
    if stage == "dynamo":
        return [common.command_line(["tdbg", "explain", *words])]
    if stage == "script":
        graphs = verdict.get("graphs") or []
        unchecked = bool(graphs) and not any(g.get("checked") for g in graphs)
        check = [common.command_line(["tdbg", "run", script, "--backend", named, *tail])] if unchecked else []
        return check + [common.command_line(bisect)]
    if stage not in COMPILER_STAGES:
        return []
    err = verdict.get("error") or {}
    if stage in ("timeout", "crash") and err.get("graph") is None and err.get("last_compiled"):
        # the process was outside every compiled graph: see whether it does the same uncompiled
        confirm = ["tdbg", "run", script, "--backend", "eager"]
        limit = ["--timeout", f"{verdict['timeout']:g}"] if verdict.get("timeout") else []
        return [common.command_line(confirm + limit + tail)]
    commands = [common.command_line(bisect)] if named != "eager" else []
    launcher = os.path.join(verdict.get("repro_dir") or "", "minifier_launcher.py")
    if verdict.get("repro_dir") and os.path.isfile(launcher):   # the dump holds the failing graph
        return commands + [common.command_line(["tdbg", "minify", verdict["repro_dir"]])]
    minify = common.minify_command(script, args, named, stage)
    if stage == "accuracy" and verdict.get("check_calls") and (err.get("call") or 1) > 1:
        minify = None   # found past the first call by --check-calls N: minify checks only its default calls
    return commands + ([minify] if minify else [])


def render(verdict: dict, script: str, backend: str, code: int, commands: list) -> None:
    from rich.markup import escape
    c = out()
    graphs = verdict.get("graphs") or []
    if verdict["status"] == "ok":
        c.print(f"[bold green]OK[/] {escape(script)}: {escape(_ok_text(verdict, graphs, backend))}"
                f"{escape(determinism_view.ok_text(verdict))}, {verdict.get('duration_s', 0):.1f} s")
        _replaced_lines(verdict, backend)
        for g in graphs:
            if verdict.get("check_policy") and not g.get("checked") and not g.get("unchecked"):
                frame = common.frame_label(g.get("frame"))
                c.print(f"  [bold yellow]not checked:[/] graph {g['index']} (frame {escape(frame)}) was compiled but "
                        "never called")
            for miss in g.get("unchecked") or []:   # a pass that did not compare everything says so
                c.print(f"  [bold yellow]not checked:[/] graph {g['index']} call {miss['call']}: {escape(miss['reason'])}")
            if g.get("draws_random"):
                c.print(f"  [bold yellow]not checked:[/] graph {g['index']} draws random numbers: they came from "
                        "eager's generator while checking (fallback_random), so the backend's own random-number "
                        "code was not compared")
        _determinism_lines(verdict)
        _debug_line(verdict)
        _save_io_lines(verdict)
        return
    err = verdict.get("error") or {}
    stage = verdict.get("stage")
    words = BACKWARD_WORDS.get(stage) if err.get("part") == "backward" else None
    words = words or (determinism_view.WORDS if stage == "nondeterministic" else common.STAGE_WORDS.get(stage))
    c.print(f"[bold red]FAILED[/] {escape(script)}: {escape(words or str(stage))} "
            f"(stage {stage}, exit code {code})")
    rows = [("backend", common.ran_words(verdict, backend)), ("graph", _graph_text(err, len(graphs))), ("source", err.get("source")),
            ("fx nodes" if ", " in str(err.get("fx_node")) else "fx node", err.get("fx_node")),
            ("kernel", err.get("kernel")), ("error", err.get("message"))]
    if len(err.get("source_lines") or []) > 1:   # a kernel's ops come from several user lines
        rows.insert(3, ("lines", "\n".join(err["source_lines"])))
    for key, value in rows:
        _row(c, key, value)
    _determinism_lines(verdict)
    _replaced_lines(verdict, backend)
    _debug_line(verdict)
    _save_io_lines(verdict)
    if commands:
        c.print("[bold]Next:[/]")
        for command in commands:
            c.print(f"  {escape(command)}")


def _determinism_lines(verdict: dict) -> None:
    from rich.markup import escape
    for label, text in determinism_view.note_lines(verdict):
        out().print(f"  [bold yellow]{label}:[/] {escape(text)}")


def _ok_text(verdict: dict, graphs: list, backend: str) -> str:
    """What an OK verified: the graphs compared with eager (calls, gradients), or that nothing was."""
    head = f"{len(graphs)} graph(s) compiled by {common.ran_words(verdict, backend)}"
    if not verdict.get("check_policy"):
        return head + " and ran without error; results NOT compared with eager (--no-check-accuracy)"
    checked = sum(1 for g in graphs if g.get("checked"))
    calls = sum(g.get("checked_calls", 0) for g in graphs)
    grads = sum(g.get("grads_checked", 0) for g in graphs)
    return (f"{head}; results match eager on {checked} of {len(graphs)} graph(s) ({calls} call(s) compared, "
            f"gradients on {grads})")


def _replaced_lines(verdict: dict, backend: str) -> None:
    from rich.markup import escape
    for line in common.replaced_lines(verdict, backend):
        out().print(f"  [bold yellow]replaced:[/] {escape(line)}")


def _row(c, key: str, value) -> None:
    from rich.markup import escape
    if value in (None, ""):
        return
    text = str(value)
    if "\n" not in text:
        c.print(f"  [bold]{key}:[/] {escape(text)}")
        return
    c.print(f"  [bold]{key}:[/]")
    for line in text.splitlines():
        c.print(f"    {escape(line)}")


def _graph_text(err: dict, count: int):
    if err.get("graph") is None:
        return None
    sizes = f"; symbolic sizes {err['symbolic_sizes']}" if err.get("symbolic_sizes") else ""
    call = f" (call {err['call']}{sizes})" if err.get("call") else ""
    during = {"compile": "while compiling", "run": f"forward, while running{call}",
              "backward": f"backward, while running{call}"}.get(err.get("during"), "")
    frame = f" (frame {common.frame_label(err['frame'])})" if err.get("frame") else ""
    return f"{err['graph']}{frame} {during}".strip()


def _debug_line(verdict: dict) -> None:
    for key, label in (("debug_dir", "debug dir"), ("repro_dir", "repro files")):
        if verdict.get(key):
            out().print(f"  [bold]{label}:[/] {verdict[key]}")


def _save_io_lines(verdict: dict) -> None:
    """What --save-io and --kernel-tests wrote (and what they could not)."""
    from rich.markup import escape
    saved, tests = verdict.get("save_io"), verdict.get("kernel_tests")
    c = out()
    if saved and not saved.get("temporary"):
        names = saved.get("graphs") or []
        timing = ", with timings" if saved.get("timings") else ""
        c.print(f"  [bold]saved io:[/] {len(names)} graph call(s) in {escape(saved['dir'])}{timing}"
                + (f": {escape(', '.join(names))}" if names else ""))
        if saved.get("note"):
            c.print(f"  [bold yellow]note:[/] {escape(saved['note'])}")
        for skip in saved.get("skipped") or []:
            c.print(f"  [bold yellow]not saved:[/] graph {skip['graph']} ({skip['kind']}) call {skip['call']}: "
                    f"{escape(skip['reason'])}")
    if tests:
        if tests.get("error"):
            c.print(f"  [bold yellow]kernel tests not written:[/] {escape(tests['error'])}")
        else:
            run = f" (run: {escape(tests['command'])})" if tests.get("command") else ""
            c.print(f"  [bold]kernel tests:[/] {len(tests['files'])} file(s) for {tests['kernels']} kernel(s) in "
                    f"{escape(tests['dir'])}{run}")
        for skip in tests.get("skipped") or []:
            c.print(f"  [bold yellow]no kernel test:[/] {escape(skip['graph'])}: {escape(skip['reason'])}")

