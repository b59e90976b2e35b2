"""README's first session, run for real: its `tdbg run` example must still exit as README says and
print each finding README shows (the source line, FX node, mismatch and suggested commands).

The command is read from README and run through `tdbg_runs`, which runs each command once per
session: test_own_backend.py runs the same one (`foo2_checked`), so this costs no extra run."""
import shlex

from test_docs import README, code_blocks, section


def test_first_session_run_prints_what_readme_shows(tdbg_runs):
    block = next(b for b in code_blocks(section(README.read_text(), "## A first session"))
                 if b.startswith("$ TDBG_INJECT_BUG=neg:accuracy tdbg run "))
    first, *shown = block.splitlines()
    argv = shlex.split(first[2:])
    env = dict(a.split("=", 1) for a in argv if a.startswith("TDBG_"))
    args = tuple(a for a in argv[argv.index("tdbg") + 1:])
    # the command test_own_backend.py runs too (one run for both); a README that shows another
    # command must update this line, and that file's "foo2_checked" if the run is to stay shared
    assert args == ("run", "examples/foo2.py", "--backend", "inductor") and env == {"TDBG_INJECT_BUG": "neg:accuracy"}
    r = tdbg_runs(args, env)
    assert r.code == 16, r.output
    findings = [l for l in shown if l.lstrip().startswith(("source:", "fx node:", "out[0]", "tdbg "))]
    assert len(findings) == 5, findings
    assert [l for l in findings if l not in r.stdout.splitlines()] == [], r.stdout
