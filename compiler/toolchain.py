"""What the host's CPU and C++ compiler are, asked without building anything: the defaults of
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


# /proc/cpuinfo's vendor_id -> Config.cpu_vendor
VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "amd"}


@functools.lru_cache(maxsize=None)
def cpu_vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """"intel", "amd" or "other": whose CPU this is, from the first vendor_id line of `cpuinfo`
    ("other" where there is none, as off Linux). MKL's GEMMs are tuned for Intel's CPUs; which
    library serves a linear depends on it (prepack.LINEAR_PACKINGS)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return VENDORS.get(line.split(":", 1)[1].strip(), "other")
    except OSError:
        pass
    return "other"
