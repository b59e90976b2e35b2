"""The tutorial's add/add/mul/add kernel (bench.py) at a small size, for `tdbg profile` tests.

argv: optional row count (default 256).
"""
import sys

import torch


def func(arg_0, arg_1, arg_2, arg_3, arg_4):
    return ((arg_0 + arg_1) + arg_2) * arg_3 + arg_4


rows = int(sys.argv[1]) if len(sys.argv) > 1 else 256
inputs = (torch.rand(rows, 512), torch.rand(1, 512), torch.zeros(rows, 512), torch.rand(1, 512), torch.rand(1, 512))
compiled = torch.compile(func)
with torch.no_grad():
    for _ in range(3):
        result = compiled(*inputs)
assert torch.allclose(result, func(*inputs))
