"""The install: console script, Dynamo entry point, torch-free --help."""
import subprocess
import sys
from importlib.metadata import entry_points


def test_dynamo_backend_entry_point_is_registered():
    [ep] = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "tdbg"]
    assert ep.value == "tdbg.compiler:compile_fx"


def test_help_does_not_import_torch():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom tdbg.cli.main import cli\n"
            "r = CliRunner().invoke(cli, ['--help'])\nassert r.exit_code == 0, r.output\n"
            "names = [n for n in ('run', 'bisect', 'minify', 'explain', 'profile') if n in r.output]\n"
            "for n in names:\n"
            "    s = CliRunner().invoke(cli, [n, '--help'])\n    assert s.exit_code == 0, (n, s.output)\n"
            "print(','.join(names), 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names, torch_loaded = out.split()
    assert torch_loaded == "False"
    assert names == "run,bisect,minify,explain,profile"


def test_exit_code_table_is_documented_in_help():
    from tdbg.cli.console import EXIT_CODES
    out = subprocess.run(["tdbg", "--help"], capture_output=True, text=True, check=True).stdout
    codes = [c for c, _ in EXIT_CODES.values()]
    assert len(set(codes)) == len(codes)
    flat = " ".join(out.split())    # rows are wrapped to the help width
    for code, meaning in EXIT_CODES.values():
        assert f"{code} {' '.join(meaning.split())}" in flat
