"""minifier/accuracy.py: float64-referenced comparison with exact, informative mismatches."""
import torch

from tdbg.minifier.diagnose.accuracy import compare, fp64_reference


def test_identical_outputs_pass():
    x = torch.randn(4, 4)
    assert compare((x, 3), (x.clone(), 3)) == []


def test_float_mismatch_names_output_and_position():
    e = torch.zeros(2, 3)
    a = e.clone()
    a[1, 2] = 0.5
    [m] = compare([torch.ones(1), e], [torch.ones(1), a])
    assert m.output == "out[1]" and m.max_abs_error == 0.5
    assert "at (1, 2): expected 0, got 0.5" in m.message


def test_integer_outputs_compare_exactly_unless_ignored():
    e = torch.tensor([1, 2, 3], dtype=torch.uint8)
    a = torch.tensor([1, 2, 4], dtype=torch.uint8)
    [m] = compare(e, a)
    assert m.message.startswith("1 of 3 elements differ; first at (2,): expected 3, got 4")
    assert compare(e, a, ignore_non_fp=True) == []


def test_fp64_reference_forgives_error_no_worse_than_eager():
    torch.manual_seed(0)
    x = torch.randn(10000, dtype=torch.float32)
    ref = x.double().sum()
    eager = x.sum()
    # a different summation order: not bit-equal to eager, but as close to fp64 as eager is
    other = x.double().sum().float()
    assert compare(eager, other, reference=ref, tolerance=0.0) == []
    # a result much worse than eager is still caught
    assert len(compare(eager, other + 1.0, reference=ref)) == 1


def test_shape_and_count_mismatch():
    [m] = compare(torch.zeros(2), torch.zeros(3))
    assert "expected (2,) torch.float32, got (3,) torch.float32" == m.message
    [m] = compare((torch.zeros(1),), (torch.zeros(1), torch.zeros(1)))
    assert m.message == "expected 1 outputs, got 2"


def test_nan_positions_must_agree():
    e = torch.tensor([float("nan"), 1.0])
    assert compare(e, e.clone()) == []
    assert len(compare(e, torch.tensor([0.0, 1.0]))) == 1


def test_fp64_reference_runs_modules_in_double():
    m = torch.nn.Linear(3, 2)
    out = fp64_reference(m, [torch.randn(4, 3)])
    assert out.dtype == torch.float64 and m.weight.dtype == torch.float32
