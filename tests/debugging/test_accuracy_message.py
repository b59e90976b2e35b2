"""An accuracy failure names the element that fails. The message named the largest absolute
error, which on a large value is within tolerance: a BertModel gradient under tdbg's compiler
failed with 'max abs error 6.10352e-05 at (15, 55): expected 161.913, got 161.913', naming no
failure at all (the failing element was a small one)."""
import torch

from tdbg.minifier.diagnose.accuracy import compare


def test_the_failing_element_is_named_when_the_largest_error_is_within_tolerance():
    e = torch.tensor([161.913, 1e-4, 0.5])
    a = torch.tensor([161.913 + 6e-5, 1e-4 + 3e-5, 0.5])
    [m] = compare([e], [a])
    assert m.message == ("max abs error 6.10352e-05 at (0,): expected 161.913, got 161.913 (rtol=1.3e-05, "
                         "atol=1e-05); within tolerance there; outside it: 1 element(s), worst at (1,): expected "
                         "0.0001, got 0.00013 (|error| 3e-05 > 1e-05 allowed)")


def test_a_largest_error_outside_tolerance_keeps_the_message_as_it_was():
    [m] = compare([torch.tensor([1.0, 2.0])], [torch.tensor([1.5, 2.0])])
    assert m.message == "max abs error 0.5 at (0,): expected 1, got 1.5 (rtol=1.3e-05, atol=1e-05)"
