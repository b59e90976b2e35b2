"""explain on what Dynamo gives up on: a frame stopped by its recompile limit (the guard failure
that hit the limit compiled nothing, later calls ran uncompiled: it was counted as a recompile and
never said), and mark_dynamic on a dim a line specialized (Dynamo's ConstraintViolationError was
reported as the script's own failure). In process; the end-to-end runs are in
tests/scenarios/test_explain_shapes.py."""
import logging

from tdbg.minifier.diagnose.explain import build_report
from tdbg.minifier.runs import instrument, runner

FAILURES = [f"0/{i}: tensor 'x' size mismatch at index 0. expected {i + 1}, actual {i + 2}" for i in range(3)]


def _verdict(limits: list) -> dict:
    graphs = [{"index": i, "frame": "f", "ops": ["Tensor.sin"], "lines": []} for i in range(3)]
    recompiles = [{"frame": "f", "file": "/u/s.py", "line": 8, "reason": r, "graphs_before": i + 1}
                  for i, r in enumerate(FAILURES)]
    return {"status": "ok", "graphs": graphs, "recompiles": recompiles, "guards": [], "recompile_limits": limits}


def _limit_warning(into: list) -> None:
    """Dynamo's own warning, as convert_frame logs it when a frame hits its recompile limit."""
    handler = instrument._LimitRecorder(into)
    logger = logging.getLogger(instrument._LIMIT_LOGGER)
    logger.addHandler(handler)
    try:
        logger.warning("torch._dynamo hit config.%s (%s)\n   function: %s\n   last reason: %s\n", "recompile_limit", 3,
                       "'f' (/u/s.py:8)", FAILURES[-1])
    finally:
        logger.removeHandler(handler)


def test_the_recompile_limit_warning_is_recorded():
    limits: list = []
    _limit_warning(limits)
    assert limits == [{"frame": "f", "file": "/u/s.py", "line": 8, "limit": "torch._dynamo.config.recompile_limit",
                       "value": 3, "reason": FAILURES[-1]}]


def test_a_frame_stopped_by_the_limit_says_so_and_counts_only_real_recompiles():
    limits: list = []
    _limit_warning(limits)
    (fn,) = build_report(_verdict(limits))["functions"]
    # three guard failures, two recompiles (graphs 1, 2): the third hit the limit and compiled nothing
    assert [r["compiled"] for r in fn["recompiles"]] == [True, True, False]
    assert fn["recompile_count"] == 2
    limit = fn["recompile_limit"]
    assert (limit["limit"], limit["value"], limit["at"], limit["reason"]) == (
        "torch._dynamo.config.recompile_limit", 3, "/u/s.py:8", FAILURES[-1])
    assert "ran uncompiled (eager)" in limit["words"]
    # without the warning: every guard failure recompiled
    (fn,) = build_report(_verdict([]))["functions"]
    assert fn["recompile_count"] == 3 and "recompile_limit" not in fn


def test_a_constraint_violation_is_dynamos_not_the_scripts():
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError
    assert runner._is_dynamo_error([ConstraintViolationError("Constraints violated (L['x'].size()[0])!")])
    assert not runner._is_dynamo_error([RuntimeError("the script's own")])
