"""Scenario tests drive the real `tdbg` CLI on the shared scripts in tests/scenarios/scripts/.

`tdbg_runs` (session fixture): `tdbg_runs.start(*commands)` starts CLI runs two at a time in the
background, `tdbg_runs(args, env)` waits for one (starting it if needed). A command is
(args tuple, env dict); the same command runs once per session, whichever test asks first.
"""
import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

_CLI_CONFTEST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cli", "conftest.py")
_spec = importlib.util.spec_from_file_location("tdbg_cli_test_runner", _CLI_CONFTEST)
_cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cli)
run_tdbg = _cli.run_tdbg        # (args, env) -> Result(code, stdout, stderr, json, files)
SCRIPTS = os.path.join("tests", "scenarios", "scripts")


class _Runs:
    def __init__(self):
        self.pool = ThreadPoolExecutor(max_workers=2)
        self.futures = {}

    @staticmethod
    def _key(args, env):
        return tuple(args), tuple(sorted((env or {}).items()))

    def start(self, *commands) -> None:
        for args, env in commands:
            key = self._key(args, env)
            if key not in self.futures:
                self.futures[key] = self.pool.submit(run_tdbg, list(args), dict(env or {}))

    def __call__(self, args, env=None):
        self.start((args, env))
        return self.futures[self._key(args, env)].result()


@pytest.fixture(scope="session")
def tdbg_runs():
    runs = _Runs()
    yield runs
    runs.pool.shutdown(wait=True, cancel_futures=True)
