"""Session-wide test setup: one compile cache for the whole session, shared by subprocesses, and
removed when the session ends unless TDBG_TEST_CACHE_DIR named it (then it is the caller's); each
test's random inputs seeded from its id."""
import os
import random
import shutil
import tempfile
import zlib

import pytest

_OWN_CACHE = not os.environ.get("TDBG_TEST_CACHE_DIR")
_CACHE = os.environ.get("TDBG_TEST_CACHE_DIR") or tempfile.mkdtemp(prefix="tdbg-test-cache-")
os.environ["TDBG_CACHE_DIR"] = _CACHE
# Generated-code tests spell 8-lane pragmas (simdlen(8), 32-lane partial sums): the suite pins
# the AVX2 width on every CPU. The native default (16 lanes where g++ targets AVX-512) is
# tested by the tests that set simdlen themselves and by test_native_vector_width.
os.environ.setdefault("TDBG_SIMDLEN", "8")
# Keep torch's own threads modest on the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(autouse=True)
def _seeded(request):
    """Every test draws the same random inputs on every run, from a seed of its own (its id): a
    numeric failure reproduces instead of showing once in a few hundred runs."""
    import torch
    seed = zlib.crc32(request.node.nodeid.encode())
    random.seed(seed)
    torch.manual_seed(seed)


def pytest_unconfigure(config):
    """Last hook of the session (after every fixture's teardown, so no subprocess still uses it)."""
    if _OWN_CACHE:
        shutil.rmtree(_CACHE, ignore_errors=True)
