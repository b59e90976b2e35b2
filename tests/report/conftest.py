"""Report tests: a headless Chromium (session-wide) and one real `tdbg run --html` shared by the
browser tests. Outside CI a missing browser skips the browser tests with the reason; in CI (the
CI variable set, as .ci/run does after installing chromium) it fails them."""
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

import report_browser as chromium

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


@pytest.fixture(scope="session")
def browser():
    try:
        driver = chromium.open_browser()
    except chromium.Unavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: {e}")
        pytest.skip(f"browser tests skipped: {e}")
    yield driver
    chromium.close_browser(driver)


@dataclass
class Cli:
    code: int
    stdout: str
    stderr: str
    html_dir: str


def _env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TDBG_", "TORCHDYNAMO_")) or k == "TDBG_CACHE_DIR"}
    env.update(extra, COLUMNS="200")
    return env


def run_tdbg(args, env=None, cwd=ROOT, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tdbg.cli.main", *args], cwd=cwd, env=_env(env or {}),
                          capture_output=True, text=True, timeout=timeout)


_FOO2 = {}     # the shared run, started as soon as the session knows a test reads it


def _foo2_run(tmp: str) -> Cli:
    html_dir = os.path.join(tmp, "html")
    proc = run_tdbg(["run", "examples/foo2.py", "--backend", "inductor", "--check-accuracy", "--html", html_dir],
                    {"TDBG_INJECT_BUG": "neg:accuracy"})
    return Cli(proc.returncode, proc.stdout, proc.stderr, html_dir)


def _start_foo2() -> None:
    if not _FOO2:
        _FOO2["tmp"] = tempfile.mkdtemp(prefix="tdbg-report-test-")
        _FOO2["pool"] = ThreadPoolExecutor(max_workers=1)
        _FOO2["future"] = _FOO2["pool"].submit(_foo2_run, _FOO2["tmp"])


def pytest_collection_finish(session):
    """Start the run while other tests go on (it is mostly a child process waiting on g++)."""
    if any("foo2_run" in getattr(item, "fixturenames", ()) for item in session.items):
        _start_foo2()


@pytest.fixture(scope="session")
def foo2_run():
    """`TDBG_INJECT_BUG=neg:accuracy tdbg run examples/foo2.py --check-accuracy --html DIR`."""
    _start_foo2()
    yield _FOO2["future"].result()
    _FOO2["pool"].shutdown(wait=True)
    shutil.rmtree(_FOO2["tmp"], ignore_errors=True)


def page_url(html_dir: str) -> str:
    return "file://" + os.path.join(os.path.abspath(html_dir), "index.html")
