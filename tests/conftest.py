"""Session-wide test setup: one compile cache for the whole session, shared by subprocesses, and
removed when the session ends unless TDBG_TEST_CACHE_DIR named it (then it is the caller's)."""
import os
import shutil
import tempfile

_OWN_CACHE = not os.environ.get("TDBG_TEST_CACHE_DIR")
_CACHE = os.environ.get("TDBG_TEST_CACHE_DIR") or tempfile.mkdtemp(prefix="tdbg-test-cache-")
os.environ["TDBG_CACHE_DIR"] = _CACHE
# Keep torch's own threads modest on the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "2")


def pytest_unconfigure(config):
    """Last hook of the session (after every fixture's teardown, so no subprocess still uses it)."""
    if _OWN_CACHE:
        shutil.rmtree(_CACHE, ignore_errors=True)
