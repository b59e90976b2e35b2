"""The `tdbg` command group. Subcommands load lazily so `tdbg --help` never imports torch.

Every command runs inside `guarded`: the TDBG_* environment is checked before any work (one
`bad_input` answer in every command), and Ctrl-C kills the command's child processes (they run
in their own sessions, so the terminal's SIGINT never reaches them), lets the command unwind
(its temporary folders are removed), and exits 130 with one line saying what was stopped.
"""
from __future__ import annotations

import functools
import importlib
import os
import signal
import sys
import threading
import time

import click

from tdbg.cli.console import current_activity, err, exit_code, exit_codes_help, hush

# name -> (module:attribute of the click command, one-line help shown by `tdbg --help`)
COMMANDS = {
    "run": ("tdbg.cli.run:run", "Run a script with every torch.compile sent to a backend; say what broke."),
    "bisect": ("tdbg.cli.bisect:bisect", "Find the first failing backend, then the culprit inside the compiler."),
    "minify": ("tdbg.cli.minify:minify", "Shrink a failing graph and write standalone repro files."),
    "explain": ("tdbg.cli.explain:explain", "Report graph breaks, recompiles and guards of a script."),
    "profile": ("tdbg.cli.profile:profile", "Time a script eager vs compiled and show where the time goes."),
    "replay": ("tdbg.cli.replay:replay", "Rerun one graph saved by `run --save-io` alone; compare with its eager outputs."),
    "diff": ("tdbg.cli.diff:diff", "Compare two `run --save-io` folders: changed graphs, outputs, timings."),
    "report": ("tdbg.cli.report:report", "Write the HTML report of an existing debug, run or minify folder."),
    "compare": ("tdbg.cli.compare:compare", "Find the first FX node whose compiled value diverges from eager."),
    "memory": ("tdbg.cli.memory:memory", "Measure each compiled graph's peak memory against eager's, per call."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return [name for name in COMMANDS if _available(name)]

    def get_command(self, ctx, name):
        if name not in COMMANDS or not _available(name):
            return None
        module, attr = COMMANDS[name][0].split(":")
        return guarded(name, getattr(importlib.import_module(module), attr))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:   # before a command's own handler (`guarded`) took over
            err().print("interrupted (Ctrl-C) before the command started; nothing was run.")
            raise SystemExit(exit_code("interrupted")) from None

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)




def guarded(name: str, command: click.Command) -> click.Command:
    """`command` with its callback run after the environment check and under `_Interrupt`
    (wrapped once; click has already parsed the arguments, so --help stays instant)."""
    callback = command.callback
    if getattr(callback, "tdbg_guarded", False):
        return command
    from tdbg.cli.report import HTML_COMMANDS, html_option
    has_html = name in HTML_COMMANDS
    if has_html:
        command.params.append(html_option())

    @functools.wraps(callback)
    def run(*args, **params):
        from tdbg.cli.common import check_environment
        from tdbg.cli.console import json_on_failure
        html_dir = params.pop("html_dir", None) if has_html else None
        json_on_failure(params.get("json_path"), f"tdbg.{name}")
        check_environment(params.get("backend"))
        with _Interrupt(name, params):
            if not html_dir:
                return callback(*args, **params)
            return _with_report(name, html_dir, callback, args, params)
    run.tdbg_guarded = True
    command.callback = run
    return command


def _with_report(name: str, html_dir: str, callback, args, params):
    """Run the command, then write its HTML report whatever its exit code (not when Ctrl-C
    stopped it: there is no verdict to show)."""
    from tdbg.cli.report import HtmlReport
    report = HtmlReport.start(name, html_dir, params)
    try:
        result = callback(*args, **params)
    except SystemExit as e:
        report.finish(e.code)
        raise
    report.finish(0)
    return result


class _Interrupt:
    """Ctrl-C during a command: every descendant process is SIGKILLed at once and again every
    REAP_S while the command unwinds (threads may still start runs), then one line and exit 130.
    A process that has not ended GRACE_S later (a worker thread still joining), or a second
    Ctrl-C, ends at once with the same line and code — only in a real `tdbg` process (`main`),
    never inside a caller such as a test's CliRunner.

    A KeyboardInterrupt raised while torch's native modules initialize can abort the process
    (SIGABRT from C++) or be swallowed there, so while `import torch...` runs it is held back
    (at most DEFER_S) and raised in the main thread once the import is done."""
    REAP_S, GRACE_S, DEFER_S = 0.05, 5.0, 60.0
    hard_exit = False

    def __init__(self, name: str, params: dict):
        from tdbg.cli.common import command_line
        target = params.get("script") or params.get("target") or ""
        self.command = command_line(["tdbg", name, *([target] if target else []), *(params.get("args") or ())])
        self.stopping = threading.Event()
        self.reported = threading.Lock()
        self.saved = None
        self.deferred = self.redelivered = False
        self.activity = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.saved = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def __exit__(self, kind, value, tb):
        if self.saved is not None:
            signal.signal(signal.SIGINT, self.saved)
        if kind is None or not issubclass(kind, KeyboardInterrupt):
            return False
        self.stopping.set()
        self._report(kill_descendants())
        if self.hard_exit:
            self._end_now()
        raise SystemExit(exit_code("interrupted"))

    def _on_signal(self, signum, frame):
        if self.redelivered:            # from _reap: the import that held it back is done
            self.redelivered = False
            raise KeyboardInterrupt
        if self.stopping.is_set():      # a second Ctrl-C
            if self.hard_exit:
                self._end_now()
            raise KeyboardInterrupt
        self.stopping.set()
        self.activity = current_activity()
        hush()
        kill_descendants()
        self.deferred = _importing_torch()
        threading.Thread(target=self._reap, name="tdbg-interrupt", daemon=True).start()
        if not self.deferred:
            raise KeyboardInterrupt

    def _reap(self):
        held = time.monotonic() + self.DEFER_S
        while self.deferred and _importing_torch() and time.monotonic() < held:
            kill_descendants()
            time.sleep(self.REAP_S)
        if self.deferred:     # a real signal (not _thread.interrupt_main): it also ends a sleep or wait
            self.deferred, self.redelivered = False, True
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        deadline = time.monotonic() + self.GRACE_S
        while time.monotonic() < deadline and not self.reported.locked():
            kill_descendants()
            time.sleep(self.REAP_S)
        if self.hard_exit:
            time.sleep(max(0.0, deadline - time.monotonic()))
            self._end_now()

    def _end_now(self):
        """End the process with 130 now. The command has unwound (its finally blocks ran) or is
        stuck; a normal exit could still wait for worker threads, or — when the KeyboardInterrupt
        was raised inside Python code run from C++ (pybind11's exec during `import torch`) — be
        turned by CPython into death by SIGINT (-2) instead of 130."""
        self._report(kill_descendants())
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code("interrupted"))

    def _report(self, survivors: list) -> None:
        if not self.reported.acquire(blocking=False):
            return
        during = getattr(self, "activity", None) or current_activity()
        left = (f"child process(es) {', '.join(map(str, survivors))} could not be killed" if survivors
                else "no child process is left running")
        line = (f"interrupted (Ctrl-C): {self.command} was stopped" + (f" during {during}" if during else "")
                + f"; {left}.")
        if self.hard_exit:    # the process's own stderr: sys.stderr may be a script's captured output
            sys.__stderr__.write(line + "\n")
            sys.__stderr__.flush()
            return
        hush(False)
        err().print(line, markup=False, highlight=False)


def _importing_torch() -> bool:
    """Is a torch module being initialized right now (importlib marks its spec)?"""
    return any(getattr(getattr(module, "__spec__", None), "_initializing", False)
               for name, module in list(sys.modules.items()) if name == "torch" or name.startswith("torch."))


def descendants(pid: int) -> list:
    """Every living process below `pid` (children first), read from /proc."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":     # a zombie is already dead; only its parent's wait remains
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), ()):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> list:
    """SIGKILL every descendant of this process (the whole group of each that leads its own
    group, so what it started goes too); the pids still alive a second later."""
    for pid in descendants(os.getpid()):
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    deadline = time.monotonic() + 1.0
    while descendants(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return descendants(os.getpid())


def _available(name: str) -> bool:
    module = COMMANDS[name][0].split(":")[0]
    return importlib.util.find_spec(module) is not None


@click.group(cls=LazyGroup, epilog=exit_codes_help(),
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="tdbg")
def cli():
    """tdbg: find, explain and shrink torch.compile failures on CPU.

    Backends (--backend): eager, aot_eager, inductor (tdbg's own compiler; also spelled tdbg),
    torch:NAME (any backend registered with Dynamo; torch:inductor is PyTorch's Inductor),
    module:function or file.py:function.
    """


def main():
    _Interrupt.hard_exit = True   # a real `tdbg` process (not a test's CliRunner) may end itself
    cli(prog_name="tdbg")


if __name__ == "__main__":
    main()
