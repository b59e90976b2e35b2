"""The `tdbg` command group. Subcommands load lazily so `tdbg --help` never imports torch."""
from __future__ import annotations

import importlib

import click

from tdbg.cli.console import exit_codes_help

# name -> (module:attribute of the click command, one-line help shown by `tdbg --help`)
COMMANDS = {
    "run": ("tdbg.cli.run:run", "Run a script with every torch.compile sent to a backend; say what broke."),
    "bisect": ("tdbg.cli.bisect:bisect", "Find the first failing backend, then the culprit inside the compiler."),
    "minify": ("tdbg.cli.minify:minify", "Shrink a failing graph and write standalone repro files."),
    "explain": ("tdbg.cli.explain:explain", "Report graph breaks, recompiles and guards of a script."),
    "profile": ("tdbg.cli.profile:profile", "Time a script eager vs compiled and show where the time goes."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return [name for name in COMMANDS if _available(name)]

    def get_command(self, ctx, name):
        if name not in COMMANDS or not _available(name):
            return None
        module, attr = COMMANDS[name][0].split(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _available(name: str) -> bool:
    module = COMMANDS[name][0].split(":")[0]
    return importlib.util.find_spec(module) is not None


@click.group(cls=LazyGroup, epilog=exit_codes_help(),
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="tdbg")
def cli():
    """tdbg: find, explain and shrink torch.compile failures on CPU.

    Backends (--backend): eager, aot_eager, inductor (tdbg's own compiler), torch:NAME (any
    backend registered with Dynamo, e.g. torch:inductor), module:function or file.py:function.
    """


def main():
    cli(prog_name="tdbg")


if __name__ == "__main__":
    main()
