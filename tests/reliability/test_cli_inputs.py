"""Careless input to every command (issue 11, items 11, 15, 16): one clear paragraph, the same
exit code for the same cause in every command, and nothing run before the answer.

Everything here answers before a child process starts (click's CliRunner, in this process)."""
import json
import os

import pytest
from click.testing import CliRunner

from tdbg.cli import console
from tdbg.cli.console import EXIT_CODES, exit_code, verdict_exit_code
from tdbg.cli.main import cli

SCRIPT = "examples/foo2.py"
COMMANDS = ("run", "bisect", "minify", "explain", "profile", "memory")


def _invoke(args, env=None):
    result = CliRunner().invoke(cli, list(args), env=env)
    assert "Traceback" not in result.output, result.output
    return result, " ".join(result.output.split())


def test_one_code_per_cause_in_the_table():
    codes = [code for code, _ in EXIT_CODES.values()]
    assert len(codes) == len(set(codes))
    assert exit_code("bad_input") == 3 and exit_code("usage") == 2 and exit_code("interrupted") == 130


@pytest.mark.parametrize("verdict, code", [
    ({"status": "ok", "compile_calls": 2}, 0),
    ({"status": "ok", "compile_calls": 0}, 3),              # never called torch.compile: bad input
    ({"status": "failed", "stage": "script", "script_exit_code": 7}, 7),
    ({"status": "failed", "stage": "script", "script_exit_code": None}, 1),
    ({"status": "failed", "stage": "accuracy"}, 16),
    ({"status": "failed", "stage": "bad_input"}, 3),
    ({"status": "failed", "stage": "ok"}, 70),            # a failed verdict never exits 0
    ({"status": "failed", "stage": "no_such_stage"}, 70),
])
def test_verdict_exit_code(verdict, code):
    assert verdict_exit_code(verdict) == code


@pytest.mark.parametrize("command", COMMANDS)
def test_a_directory_as_script_is_bad_input_like_a_missing_file(command):
    missing, missing_text = _invoke([command, "no/such/script.py"])
    folder, folder_text = _invoke([command, "examples"])
    assert missing.exit_code == exit_code("bad_input"), missing_text
    # minify takes a dump folder, so a folder without one is its own kind of bad input
    assert folder.exit_code == exit_code("bad_input"), folder_text
    if command != "minify":
        assert "'examples' is" in folder_text and "Python script" in folder_text


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("variable, value, phrase", [
    ("TDBG_INJECT_BUG", "neg", "environment variable TDBG_INJECT_BUG='neg': inject_bug must look like OP:KIND"),
    ("TDBG_CONFIG", "{not json", "tdbg's configuration from the environment is not usable"),
    ("TDBG_NUM_THREADS", "two", "environment variable TDBG_NUM_THREADS='two'"),
    ("TDBG_REPRO_LEVEL", "9", "repro_level must be 1, 2, 3 or 4, got '9'"),
    ("TDBG_CONFIG", '{"fusoin": false}', "unknown config key(s) 'fusoin'"),
    ("TDBG_INJECT_BUG", "nosuchop:accuracy", "inject_bug op 'nosuchop' is not an op tdbg lowers"),
])
def test_a_malformed_variable_is_bad_input_in_every_command(tmp_path, command, variable, value, phrase):
    out = tmp_path / "out"
    extra = ["--out", str(out)] if command == "minify" else []
    result, text = _invoke([command, SCRIPT, *extra], env={variable: value})
    assert result.exit_code == exit_code("bad_input"), text
    assert phrase in text and "Fix or unset that variable" in text
    assert not out.exists()


@pytest.mark.parametrize("command", ["run", "profile", "minify", "bisect"])
def test_an_unwritable_cache_dir_is_named(command, tmp_path):
    extra = ["--out", str(tmp_path / "out")] if command == "minify" else []
    result, text = _invoke([command, SCRIPT, *extra], env={"TDBG_CACHE_DIR": "/proc/tdbg-cache"})
    assert result.exit_code == exit_code("bad_input"), text
    assert text.startswith("error: TDBG_CACHE_DIR /proc/tdbg-cache: cannot be created in /proc")
    assert "Point TDBG_CACHE_DIR at a folder this user can write" in text
    assert not (tmp_path / "out").exists()


def test_the_cache_dir_is_not_checked_when_the_compiler_does_not_run():
    """With --backend eager tdbg's compiler never runs: its cache folder is no reason to refuse."""
    result, text = _invoke(["profile", "no/such/script.py", "--backend", "eager"],
                           env={"TDBG_CACHE_DIR": "/proc/tdbg-cache"})
    assert result.exit_code == exit_code("bad_input") and "does not exist" in text and "CACHE" not in text


@pytest.mark.parametrize("command", ["run", "explain", "bisect"])
@pytest.mark.parametrize("value", ["0.0", "-1.0"])
def test_timeout_must_be_positive(command, value):
    result, text = _invoke([command, SCRIPT, "--timeout", value])
    assert result.exit_code == exit_code("usage"), text
    assert f"Invalid value for '--timeout': {value} is not in the range x>0" in text


@pytest.mark.parametrize("option, path, phrase", [
    ("--trace", "/proc/x.json", "--trace /proc/x.json: cannot be written (No such file or directory)"),
    ("--json", "/proc/x.json", "--json /proc/x.json: cannot be written (No such file or directory)"),
    ("--json", "/no/such/folder/p.json", "--json /no/such/folder/p.json: the folder /no/such/folder does not exist"),
    ("--trace", "examples", "--trace examples: that is a directory; give a file path"),
])
def test_profile_refuses_output_paths_before_any_work(option, path, phrase):
    result, text = _invoke(["profile", SCRIPT, option, path])
    assert result.exit_code == exit_code("usage"), text
    assert text == f"error: {phrase}."


def test_write_json_failure_is_one_error_not_a_traceback(tmp_path, monkeypatch):
    target = tmp_path / "gone" / "out.json"    # the folder disappeared after the up-front check
    with pytest.raises(SystemExit) as info:
        console.write_json(str(target), {"a": 1}, "tdbg.test")
    assert info.value.code == exit_code("usage")
    assert not (tmp_path / "gone").exists()
    console.write_json(str(tmp_path / "ok.json"), {"a": 1}, "tdbg.test")
    assert json.loads((tmp_path / "ok.json").read_text()) == {"schema": "tdbg.test", "version": 1, "a": 1}
    assert os.listdir(tmp_path) == ["ok.json"]


def test_help_documents_every_code():
    result, text = _invoke(["--help"])
    for code, meaning in EXIT_CODES.values():
        assert f"{code} {meaning}" in text


@pytest.mark.parametrize("given", [False, True])
def test_the_test_session_removes_only_its_own_cache(tmp_path, given):
    """tests/conftest.py: the session's compile cache goes at exit unless TDBG_TEST_CACHE_DIR gave it."""
    import subprocess
    import sys
    root = tmp_path / "tmp"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TDBG_")}
    env["TMPDIR"] = str(root)
    if given:
        env["TDBG_TEST_CACHE_DIR"] = str(tmp_path / "mine")
        (tmp_path / "mine").mkdir()
    test = "tests/reliability/test_cli_inputs.py::test_one_code_per_cause_in_the_table"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [n for n in os.listdir(root) if n.startswith("tdbg")] == []
    assert (tmp_path / "mine").is_dir() == given


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("env, args, code", [
    ({"TDBG_INJECT_BUG": "nope"}, (SCRIPT,), 3),                 # stopped by the environment check
    ({}, ("examples/no_such_script.py",), 3),                    # stopped by the command's own check
])
def test_json_is_written_when_the_command_stops_on_bad_input(tmp_path, command, env, args, code):
    if command == "profile" and args == (SCRIPT,):
        args = (SCRIPT, "--backend", "inductor")
    path = tmp_path / "out.json"
    result, text = _invoke([command, *args, "--json", str(path)], env=env)
    assert result.exit_code == code, text
    doc = json.loads(path.read_text())
    assert (doc["schema"], doc["exit_code"]) == (f"tdbg.{command}", code)


@pytest.mark.parametrize("option, value", [("--tolerance", "-1"), ("--tolerance", "0"), ("--max-queries", "0"),
                                           ("--timeout", "0"), ("--timeout", "-1")])
def test_minify_refuses_values_out_of_range_before_any_work(tmp_path, option, value):
    result, text = _invoke(["minify", SCRIPT, option, value, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and f"Invalid value for '{option}'" in text
    assert not (tmp_path / "out").exists()
