"""Command-line checks that answer before any child process starts (click's CliRunner)."""
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tdbg.cli.console import exit_code
from tdbg.cli.main import cli

SCRIPTS = "tests/cli/scripts"

# arguments -> (exit code name, phrase of the one-paragraph message)
BAD = {
    ("run", "does/not/exist.py"): ("bad_input", "does not exist"),
    ("bisect", "does/not/exist.py"): ("bad_input", "does not exist"),
    ("explain", "does/not/exist.py"): ("bad_input", "does not exist"),
    ("run", f"{SCRIPTS}/bad_syntax.py"): ("bad_input", "does not parse: invalid syntax at line 1"),
    ("run", "examples/foo2.py", "--backend", "nope"): ("bad_input", "unknown backend 'nope': choose one of own"),
    ("run", "examples/foo2.py", "--backend", "inductr"):
        ("bad_input", "unknown backend 'inductr' (did you mean inductor or torch:inductor?): choose one of own"),
    ("run", "examples/foo2.py", "--backend", "missing.py:fn"): ("bad_input", "file 'missing.py' does not exist"),
    ("run", "examples/foo2.py", "--logs", "dynamo,bogus"): ("usage", "unknown log channel(s) bogus"),
    ("run", "examples/foo2.py", "--repro-level", "3"): ("usage", "need --repro-after"),
    # a directory is a script that does not exist, not a usage error (was click's exit 2)
    ("run", "examples"): ("bad_input", "'examples' is a directory, not a script."),
    ("profile", "examples"): ("bad_input", "'examples' is a directory, not a script."),
    ("run", "examples/foo2.py", "--timeout", "0"): ("usage", "'--timeout': 0.0 is not in the range x>0"),
    # a backend file that does not parse is refused by the parent, before any child starts (was exit 70)
    ("run", "examples/foo2.py", "--backend", f"{SCRIPTS}/bad_syntax.py:fn"):
        ("bad_input", f"loading {SCRIPTS}/bad_syntax.py failed at {SCRIPTS}/bad_syntax.py:1: SyntaxError: invalid syntax"),
}


@pytest.mark.parametrize("args", sorted(BAD))
def test_bad_input_is_one_clear_message(args):
    code_name, phrase = BAD[args]
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == exit_code(code_name), result.output
    assert phrase in " ".join(result.output.split())


@pytest.mark.parametrize("command", ["run", "bisect", "explain", "minify", "profile"])
def test_help_is_torch_free_and_lists_exit_codes(command):
    code = ("import sys; from click.testing import CliRunner; from tdbg.cli.main import cli; "
            f"r = CliRunner().invoke(cli, ['{command}', '--help']); "
            "assert r.exit_code == 0, r.output; assert '  16  a compiled graph' in r.output, r.output; "
            "assert '130  interrupted (Ctrl-C)' in r.output, r.output; "
            "assert 'torch' not in sys.modules, 'help imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_command_parents_stay_torch_free():
    """The CLI process only starts children: importing torch there would cost seconds per command."""
    code = ("import sys; from tdbg.cli import run, bisect, explain, common; "
            "from tdbg.minifier.runs import runner, forkserver, backends; from tdbg.minifier.reduce import workers; "
            "from tdbg.minifier.diagnose import bisect as b, explain as e; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_environment_check_is_torch_free():
    """Every command checks TDBG_* before any work; that check must not cost a torch import."""
    code = ("import sys; from click.testing import CliRunner; from tdbg.cli.main import cli; "
            "r = CliRunner().invoke(cli, ['run', 'examples/foo2.py'], env={'TDBG_INJECT_BUG': 'neg:nope'}); "
            "assert r.exit_code == 3 and 'TDBG_INJECT_BUG' in r.output, r.output; "
            "assert 'torch' not in sys.modules, 'the environment check imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


# every command that runs a script: --backend defaults to the script's own (the same everywhere)
SCRIPT_COMMANDS = ("run", "bisect", "minify", "explain", "profile", "compare", "memory")


@pytest.mark.parametrize("command", SCRIPT_COMMANDS)
def test_every_script_command_defaults_to_the_scripts_own_backend(command):
    option = next(p for p in cli.get_command(None, command).params if p.name == "backend")
    assert option.default == "own"
    assert "own (the default): each torch.compile call's own backend, mode and options" in option.help
