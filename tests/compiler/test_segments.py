"""Innermost-loop segments (compiler/codegen_segments.py): a pad of the innermost dim or a cat
along it reads under masks that compare the innermost loop variable with constants; codegen cuts
that loop at those constants so each piece reads without a branch and vectorizes.

Each case is compared with float64 within the ulps the pointwise ops guarantee (pads and cats
copy values) and its kernel is checked for the loops it was cut into."""
import re

import pytest
import torch
from test_layout import compile_fn

from tdbg.compiler import codegen_segments

F = torch.nn.functional


def _rotate(x):
    return torch.cat((-x[..., 3:], x[..., :3]), dim=-1)


# (name, fn, input shape, innermost loop bounds expected in the pad/cat kernel: [(lo, hi)] or
# None when the loop must stay whole)
CASES = [
    ("pad_right", lambda x: F.pad(torch.sigmoid(x), [0, 1]), (2, 3, 7), [(0, 7), (7, 8)]),
    ("pad_left", lambda x: F.pad(torch.sigmoid(x), [2, 0]), (2, 3, 7), [(0, 2), (2, 9)]),
    ("pad_both_and_rows", lambda x: F.pad(x * 2, [1, 2, 1, 1], value=-3.0), (2, 3, 5, 6),
     [(0, 1), (1, 7), (7, 9)]),
    ("pad_crop", lambda x: F.pad(x + 1, [-2, 3]), (4, 9), [(0, 7), (7, 10)]),
    ("pad_wider_than_input", lambda x: F.pad(torch.exp(x), [5, 5]), (3, 3), [(0, 5), (5, 8), (8, 13)]),
    ("cat_rotate", lambda x: _rotate(x) * x, (2, 4, 8), [(0, 5), (5, 8)]),
    ("cat_three", lambda x: torch.cat([x, x * 2, -x], dim=-1), (3, 4), [(0, 4), (4, 8), (8, 12)]),
    ("cat_too_many_parts", lambda x: torch.cat([x * i for i in range(1, 9)], dim=-1), (3, 2), None),
    ("cat_outer_dim", lambda x: torch.cat([x, x + 1], dim=0), (3, 4), None),
    ("pad_1d", lambda x: F.pad(x * 3, [2, 2]), (6,), None),
]


def kernel(compiled):
    (name,) = [k for k in compiled.kernels if "constant_pad_nd" in k or "cat" in k]
    src = compiled.source_code
    start = src.index(f'extern "C" int {name}(')
    return src[start:src.index("\n}\n", start)]


def innermost_loops(src, var):
    return [(int(lo), int(hi)) for lo, hi in re.findall(rf"for \(int64_t {var} = (\d+); {var} < (\d+); \+\+{var}\)", src)]


@pytest.mark.parametrize("name,fn,shape,expected", CASES, ids=[c[0] for c in CASES])
def test_segments(name, fn, shape, expected):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    compiled = compile_fn(lambda t: (fn(t),), x)
    (got,), want = compiled(x), fn(x.double())
    # pads and cats copy; the ops around them are within 2 float32 ulps of float64 (test_vecmath)
    torch.testing.assert_close(got.double(), want, rtol=4 * 2.0 ** -24, atol=0)
    src = kernel(compiled)
    var = f"x{len(want.shape) - 1}"
    if expected is None:
        assert len(innermost_loops(src, var)) == 1, src
        return
    assert innermost_loops(src, var) == expected, src
    for lo, hi in expected:   # every segment reads without a branch or not at all
        head = f"for (int64_t {var} = {lo}; {var} < {hi}; ++{var})"
        seg = src[src.index(head):]
        seg = seg[:seg.index("for (int64_t", len(head))] if seg.count("for (int64_t") > 1 else seg
        assert "if (tmp" not in seg, seg
        assert src[:src.index(head)].splitlines()[-2].strip().startswith("#pragma omp simd"), src
    assert "if (false)" not in src


def test_segment_count_is_bounded():
    """cat_too_many_parts stays one loop because its cuts exceed MAX_SEGMENTS, not by accident."""
    segs = codegen_segments.MaskSegments()
    segs.cuts = set(range(2, 16, 2))
    assert segs.segments(16) is None and len(segs.cuts) + 1 > codegen_segments.MAX_SEGMENTS
    segs.cuts = {0, 4, 16, 20}   # cuts at or beyond the ends do not split
    assert segs.segments(16) == [(0, 4), (4, 16)]
