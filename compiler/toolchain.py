"""What the host's C++ compiler targets, asked without building anything: the defaults of
`Config` (config.py) come from here, so this module sits below config and imports no other
module of compiler/."""
from __future__ import annotations

import functools
import os
import subprocess


@functools.lru_cache(maxsize=None)
def native_vector(cxx: str = "g++") -> tuple:
    """(float32 lanes, extra g++ flags) of the widest vectors `cxx -march=native` targets here:
    (16, ("-mprefer-vector-width=512",)) where it predefines __AVX512F__ (g++ would otherwise
    keep 256-bit vectors, while eager's and Inductor's kernels use 512), else (8, ()). Asked
    once per process and compiler; a compiler that cannot answer gets (8, ())."""
    try:
        out = subprocess.run([cxx, "-march=native", "-dM", "-E", "-x", "c++", os.devnull],
                             capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 8, ()
    return (16, ("-mprefer-vector-width=512",)) if "__AVX512F__ " in out else (8, ())
