"""How `tdbg run` reports what --kernel-tests could not write (a regression: a backend with no AOT
stage gave "0 file(s) for 0 kernel(s) ... (run: pytest DIR)" and no reason)."""
from tdbg.cli.run import _save_io_lines


def test_a_graph_with_no_kernel_test_is_named_with_its_reason_and_no_pytest_hint(capsys):
    reason = "a dynamo graph is not split per kernel"
    _save_io_lines({"kernel_tests": {"dir": "kt", "files": [], "kernels": 0,
                                     "skipped": [{"graph": "g0_dynamo_c1", "reason": reason}]}})
    lines = [l.strip() for l in capsys.readouterr().out.splitlines()]
    assert lines == ["kernel tests: 0 file(s) for 0 kernel(s) in kt",
                     f"no kernel test: g0_dynamo_c1: {reason}"]


def test_written_tests_get_the_command_that_runs_them(capsys):
    """The command comes from the library (KernelTests.command): `pytest kt` was printed even
    where pytest is not installed (issue 25)."""
    _save_io_lines({"kernel_tests": {"dir": "kt", "files": ["kt/a.py", "kt/b.py"], "kernels": 2, "skipped": [],
                                     "command": "python kt/run_kernel_tests.py"}})
    assert capsys.readouterr().out.strip() == \
        "kernel tests: 2 file(s) for 2 kernel(s) in kt (run: python kt/run_kernel_tests.py)"
