"""Session-wide test setup: one compile cache for the whole session, shared by subprocesses."""
import os
import tempfile

_CACHE = os.environ.get("TDBG_TEST_CACHE_DIR") or tempfile.mkdtemp(prefix="tdbg-test-cache-")
os.environ["TDBG_CACHE_DIR"] = _CACHE
# Keep torch's own threads modest on the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "2")
