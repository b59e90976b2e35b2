"""Right places (issue 9 item 7): a failure in a backward graph names a forward op's own user
line (backward nodes carry their forward node's stack trace): the failing node's for a kernel
that fails while running; for a fused kernel g++ rejects, its earliest node's in graph order
(here the backward of `(y * y).sum()`, fused with relu's)."""
import os

import pytest

from tdbg.cli.console import exit_code


SCRIPT = os.path.join("tests", "scenarios", "scripts", "train_function.py")
CASES = (("le:runtime_error", "kernel_runtime", "le", "7 in f: y = torch.relu(h)"),
         ("le:compile_error", "cpp_build", "le", "8 in f: return (y * y).sum()"))


@pytest.mark.parametrize("bug, stage, node, line", CASES)
def test_backward_kernel_failure_names_the_ops_own_line(tdbg_runs, bug, stage, node, line):
    tdbg_runs.start(*((("run", SCRIPT, "--backend", "inductor"), {"TDBG_INJECT_BUG": b}) for b, *_ in CASES))
    r = tdbg_runs(("run", SCRIPT, "--backend", "inductor"), {"TDBG_INJECT_BUG": bug})
    err = r.json["verdict"]["error"]
    assert (r.code, err["stage"], err["part"]) == (exit_code(stage), stage, "backward")
    assert err["source"] == f"{SCRIPT}:{line}"
    assert node in err["fx_node"].split(", ")
