"""Every command tdbg suggests runs on the case at hand (issue 22 item 8).

A few failing scenarios (real PyTorch bugs and an injected one) are run; each command in their
JSON `next_commands` is then run as a user would paste it (its `VAR=value` prefix included, in the
scenario's environment) and must neither be refused (usage 2, bad input 3) nor hit a bug in tdbg
(internal 70, a traceback); a suggested minify must find a failing graph to minify.
"""
import os
import re
import shlex

import pytest

from tdbg.cli.console import exit_code

S = "tests/scenarios/scripts"
USER = f"{S}/user_backends.py:wrong_below_minus_one"
REFUSED = {exit_code("usage"), exit_code("bad_input"), exit_code("internal")}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# a frame of tdbg's own code in a traceback (the script's own traceback is its failure, reported)
TDBG_FRAME = re.compile(r'File "' + re.escape(ROOT) + r'/(cli|minifier|compiler|repro_templates)/')

# name -> (the failing command, its environment, the exit code it must give)
SCENARIOS = {
    # an injected accuracy bug in tdbg's compiler: bisect and a level-4 minify after aot
    "foo2_accuracy": (("run", "examples/foo2.py", "--backend", "inductor", "--check-accuracy"),
                      {"TDBG_INJECT_BUG": "neg:accuracy"}, exit_code("accuracy")),
    # PyTorch #162151 without checks: the script's own assert fails after the compiled call
    "slice_write_assert": (("run", f"{S}/issue_162151_slice_write.py", "--backend", "torch:inductor",
                            "--no-check-accuracy"), {}, 1),
    # the fifth call is wrong, the checked first calls match: no minify, a run checking more calls
    "late_call_bisect": (("bisect", f"{S}/asserts_late_call.py", "--backend", USER), {}, 1),
}


def split(command: str):
    """(tdbg arguments, environment) of a suggested command line: `A=b tdbg CMD ...`."""
    words = shlex.split(command)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[:1] == ["tdbg"], command
    return tuple(words[1:]), env


def _suggested(tdbg_runs, name):
    args, env, code = SCENARIOS[name]
    r = tdbg_runs(args, env)
    assert r.code == code, r.output
    commands = r.json["next_commands"]
    assert commands, f"{name}: a failure with nothing to run next"
    runs = [(command, *split(command)) for command in commands]
    # a minify without --out writes ./tdbg_repro: in the run's temporary folder, not the checkout
    runs = [(command, a + ("--out", "{tmp}/minified") if a[0] == "minify" and "--out" not in a else a, e)
            for command, a, e in runs]
    tdbg_runs.start(*(((a, {**env, **e})) for _, a, e in runs))
    return [(command, tdbg_runs(a, {**env, **e}), a) for command, a, e in runs]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_suggested_command_runs_on_the_case(tdbg_runs, name):
    tdbg_runs.start(*((a, e) for a, e, _ in SCENARIOS.values()))
    for command, r, args in _suggested(tdbg_runs, name):
        assert r.code not in REFUSED, f"{command}\n{r.output}"
        assert not TDBG_FRAME.search(r.output), f"{command}\n{r.output}"
        if args[0] == "minify":
            assert r.code != exit_code("not_reproduced") and "nothing to minify" not in r.output, \
                f"{command}\n{r.output}"
            assert r.json["status"] == "minified", f"{command}\n{r.output}"


def test_suggestions_fit_the_failure(tdbg_runs):
    """Which commands each case gets: never a minify for a script's own failure after checked
    calls matched, never one that depends on a command's default backend."""
    tdbg_runs.start(*((a, e) for a, e, _ in SCENARIOS.values()))
    foo2 = tdbg_runs(*SCENARIOS["foo2_accuracy"][:2]).json["next_commands"]
    assert foo2 == ["tdbg bisect examples/foo2.py --backend inductor",
                    "tdbg minify examples/foo2.py --after aot --level 4 --backend inductor"]
    slice_write = tdbg_runs(*SCENARIOS["slice_write_assert"][:2]).json["next_commands"]
    script = f"{S}/issue_162151_slice_write.py"
    # the run that compares with eager (run's default) finds what the assert saw, then bisect
    assert slice_write == [f"tdbg run {script} --backend torch:inductor",
                           f"tdbg bisect {script} --backend torch:inductor"]
    late = tdbg_runs(*SCENARIOS["late_call_bisect"][:2])
    assert late.json["minify_command"] == "" and "Minify:" not in late.stdout
    assert late.json["next_commands"] == [
        f"tdbg run {S}/asserts_late_call.py --backend {USER} --check-accuracy",
        f"tdbg run {S}/asserts_late_call.py --backend {USER} --check-accuracy --check-calls 100"]
    assert "tdbg minify" not in late.json["verdict"]["summary"]


def test_messages_are_never_cut(tdbg_runs):
    """A long line of a message (here the hint on graphs that draw random numbers, once cut at 300
    characters: `Inductor: torch._induc`) is kept whole in the JSON and on the terminal."""
    from tdbg.minifier.diagnose.checks import RANDOM_NOTE
    r = tdbg_runs(("run", f"{S}/dropout_mlp.py", "--backend", "inductor", "--check-accuracy"),
                  {"TDBG_INJECT_BUG": "relu:accuracy"})
    assert r.code == exit_code("accuracy"), r.output
    assert len(RANDOM_NOTE) > 300 and RANDOM_NOTE in r.json["verdict"]["error"]["message"].splitlines()
    assert f"    {RANDOM_NOTE}\n" in r.stdout
