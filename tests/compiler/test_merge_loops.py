"""Loop merging (compiler/merge_loops.py): a pointwise kernel's short innermost loop joins the
loop outside it when every access walks the two as one.

Each case compiles a small graph as a training forward graph (no layout planning), checks the
answer against float64 within float32 tolerance and the loops of the generated kernel."""
import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tdbg.compiler import compile_aten, lowering
from tdbg.compiler.config import current
from tdbg.compiler.decompositions import decomposition_table
from tdbg.compiler.merge_loops import MERGE_BELOW

F = torch.nn.functional


def compile_fn(fn, *inputs):
    lowering.reset_counters()
    gm = make_fx(fn, decomposition_table=decomposition_table(current()))(*inputs)
    return compile_aten(gm, list(inputs), current(), kind="forward")


def loop_bounds(source: str) -> list:
    """The bounds of the `for` loops of the first kernel, outermost first."""
    kernel = source.split("extern \"C\"", 1)[1].split("return tdbg_status;", 1)[0]
    return [int(b) for b in re.findall(r"for \(int64_t \w+ = 0; \w+ < (\d+);", kernel)]


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def channel_affine(x, m, s, y):   # a batch-norm backward's shape: per-channel broadcasts
    return ((x - m[None, :, None, None]) * s[None, :, None, None]).sigmoid() * y


# (name, fn, inputs, the first kernel's loop bounds)
CASES = [
    ("14x14 planes with channel broadcasts", channel_affine,
     (randn(2, 64, 14, 14), randn(64, seed=1), randn(64, seed=2), randn(2, 64, 14, 14, seed=3)), [2, 64, 196]),
    # 49 < MERGE_BELOW, but m[c] and s[c] do not walk C and the plane as one
    ("7x7 planes: channel broadcasts stop the second merge", channel_affine,
     (randn(2, 64, 7, 7), randn(64, seed=1), randn(64, seed=2), randn(2, 64, 7, 7, seed=3)), [2, 64, 49]),
    ("7x7 planes without broadcasts merge with C, then stop (3136 >= MERGE_BELOW)", lambda x, y: (x * y).tanh(),
     (randn(2, 64, 7, 7), randn(2, 64, 7, 7, seed=1)), [2, 64 * 49]),
    ("every dim small", lambda x: x.exp() + 1, (randn(2, 4, 3, 5),), [120]),
    ("a broadcast along the inner dim only stops the merge", lambda x, r: x * r,
     (randn(2, 8, 14, 14), randn(1, 1, 1, 14, seed=1)), [2, 8, 14, 14]),
    ("a transposed read stops it", lambda x, y: x + y.transpose(2, 3),
     (randn(2, 8, 14, 14), randn(2, 8, 14, 14, seed=1)), [2, 8, 14, 14]),
    # the pad's innermost loop runs in segments [0, 1), [1, 15), [15, 16) (codegen_segments)
    ("an index used as a value (a pad's mask) stops it", lambda x: F.pad(x, (1, 1)) * 2,
     (randn(2, 8, 14, 14),), [2, 8, 14, 1]),
    ("an innermost loop of MERGE_BELOW stays", lambda x: x.exp(), (randn(3, MERGE_BELOW),), [3, MERGE_BELOW]),
]


@pytest.mark.parametrize("name,fn,inputs,bounds", CASES, ids=[c[0] for c in CASES])
def test_merged_loops(name, fn, inputs, bounds):
    compiled = compile_fn(fn, *inputs)
    assert loop_bounds(compiled.source_code) == bounds
    got = compiled(*inputs)
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got.double(), fn(*[x.double() for x in inputs]), rtol=1e-5, atol=1e-5)


def test_a_merged_loop_is_the_vector_loop():
    compiled = compile_fn(channel_affine, *CASES[0][2])
    assert re.search(r"#pragma omp simd simdlen\(\d+\)\s*for \(int64_t x2 = 0; x2 < 196;", compiled.source_code)
