"""The model zoo's training check (benchmarks/models.py gradient_mismatches, EagerSpread,
run_training): the tensor-level rule passes an error spread like eager's that `compare`'s
worst-element rule flags, and a ReLU input that a different summation order puts on the other
side of the kink when eager's own one-ulp perturbed steps do too; it still flags a gradient off
in one channel or one element; a checked training run throws no step away."""
import importlib.util
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKENDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "perturbed_grads.py")


@pytest.fixture(scope="module")
def m():
    spec = importlib.util.spec_from_file_location("tdbg_bench_models_rule",
                                                  os.path.join(ROOT, "benchmarks", "models.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _grads(values):
    return {"w": torch.tensor(values, dtype=torch.float32)}


def test_spread_error_like_eagers_passes_where_the_worst_element_rule_flags(m):
    """100 gradient elements of 1.0; eager off by 1e-4 on every element (error norm 1e-3), the
    compiled result off by 5e-4 on four (error norm 1e-3, worst element 5x eager's)."""
    from tdbg.minifier.diagnose.accuracy import compare
    loss = torch.tensor(2.0)
    ref = (loss.double(), {"w": torch.ones(100, dtype=torch.float64)})
    eager = (loss, _grads([1 + 1e-4] * 100))
    spread = (loss, _grads([1 + 5e-4] * 4 + [1.0] * 96))
    assert [mm.output for mm in compare(eager, spread, ref)] == ["out[1]['w']"]
    assert m.gradient_mismatches(eager, spread, ref) == ([], [])
    # the same error norm, 2.5x eager's (five elements off by 1e-3): flagged, with both figures
    worse = (loss, _grads([1 + 1e-3] * 5 + [1.0] * 95))
    (mm,), within = m.gradient_mismatches(eager, worse, ref)
    assert mm.output == "out[1]['w']" and mm.message.endswith("= 2.2x eager's 0.001 (tensor rule <= 2x)")
    # the loss keeps the worst-element rule; without a float64 reference, compare's verdict stands
    wrong_loss = (torch.tensor(2.001), spread[1])
    assert [mm.output for mm in m.gradient_mismatches(eager, wrong_loss, ref)[0]] == ["out[0]"]
    assert [mm.output for mm in m.gradient_mismatches(eager, spread, None)[0]] == ["out[1]['w']"]


def test_one_ulp_moves_each_float_element_by_at_most_one_ulp_and_leaves_ints(m):
    t = torch.tensor([1.0, -2.0, 0.0, 3e-8] * 25)
    moved = m.one_ulp(t, torch.Generator().manual_seed(0))
    up, down = torch.nextafter(t, torch.tensor(9.0)), torch.nextafter(t, torch.tensor(-9.0))
    assert bool(((moved == t) | (moved == up) | (moved == down)).all())
    assert bool((moved == up).any()) and bool((moved == down).any()) and bool((moved == t).any())
    ids = torch.arange(5)
    assert m.one_ulp(ids, torch.Generator().manual_seed(0)) is ids


class Kink(torch.nn.Module):
    """Two ReLU units over three features, each pre-activation summed term by term in `order`;
    loss = sum(relu(h) * v). With x = [1, -1, 2e-8] and unit weights, unit 0's pre-activation is
    2e-8 summed left to right (float64's sign) and exactly 0 right to left (-1 + 2e-8 rounds to
    -1): the same model, another summation order, the other side of the kink."""

    def __init__(self, order):
        super().__init__()
        self.order = order
        self.w = torch.nn.Parameter(torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.25, 1.0]]))
        self.v = torch.nn.Parameter(torch.tensor([1.5, -0.5]))

    def forward(self, x):
        h = []
        for row in self.w:
            terms = [x[i] * row[i] for i in self.order]
            h.append(terms[0] + terms[1] + terms[2])
        return (torch.relu(torch.stack(h)) * self.v).sum()


_KINK_X = torch.tensor([1.0, -1.0, 2e-8])


def test_kink_flip_passes_within_eagers_perturbed_spread_a_wrong_gradient_does_not(m):
    """Right-to-left summation masks unit 0's gradient (float64 and eager keep it): `compare` and
    the eager-error rule flag w; eager's own steps on one-ulp perturbed problems flip it too, so
    the spread rule passes it and says so. A gradient off by 1e-3 in one element of v is beyond
    that spread and stays flagged; perturbed steps are made only when and as far as needed."""
    initial = Kink((0, 1, 2))
    ref = m.gradients(Kink((0, 1, 2)).double(), [_KINK_X.double()])
    eager = m.gradients(initial, [_KINK_X])
    flipped = m.gradients(Kink((2, 1, 0)), [_KINK_X])
    assert eager[1]["w"][0, :2].tolist() == [1.5, -1.5]
    assert flipped[1]["w"][0].tolist() == [0.0, 0.0, 0.0]
    spread = m.EagerSpread(initial, [_KINK_X], ref)
    assert [mm.output for mm in m.gradient_mismatches(eager, flipped, ref)[0]] == ["out[1]['w']"]
    assert m.gradient_mismatches(eager, eager, ref, spread) == ([], []) and spread.runs == 0
    mismatches, within = m.gradient_mismatches(eager, flipped, ref, spread)
    assert mismatches == [] and spread.runs == m.SPREAD_ROUNDS[0]
    assert len(within) == 1 and within[0].startswith("w: error norm 2.12 = 1.00x the largest of 4 one-ulp")
    # a gradient off by 1e-3 in one element: every round is made, and it is still wrong
    wrong_v = (flipped[0], dict(flipped[1], v=flipped[1]["v"] + torch.tensor([1e-3, 0.0])))
    (mm,), within = m.gradient_mismatches(eager, wrong_v, ref, spread)
    assert mm.output == "out[1]['v']" and spread.runs == m.SPREAD_ROUNDS[-1]
    assert f"the largest of {m.SPREAD_ROUNDS[-1]} one-ulp perturbed eager steps" in mm.message
    assert [w.split(":")[0] for w in within] == ["w"]


class BNNet(torch.nn.Module):
    """Convolution (no bias, as in the zoo's CNNs), training BatchNorm, ReLU, pooled, linear."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))

    def forward(self, x):
        return self.body(x)


def _bn_case(m):
    torch.manual_seed(0)
    net = m.Loss(BNNet()).train()
    return net, [torch.randn(2, 3, 8, 8), torch.tensor([3, 7])]


def test_bn_model_correct_backward_passes_one_channel_or_element_off_fails(m, monkeypatch):
    """run_training on a BatchNorm CNN at batch 2: tdbg's backward passes and is timed; a backward
    off by 0.1% in one output channel of the first convolution's weight gradient, or by 2e-4 in
    one element of the first BatchNorm weight's gradient, is a mismatch naming that parameter."""
    net, inputs = _bn_case(m)
    monkeypatch.setattr(m, "build", lambda zm, tiny, shapes, training, dtype: (net, inputs))
    specs = ["eager", "tdbg", f"{BACKENDS}:one_channel_off", f"{BACKENDS}:one_element_off"]
    eager, tdbg, channel, element = m.run_training(m.BY_NAME["distilbert"], specs,
                                                   m.Settings(repeat=2, warmup=1, quick=True), m.SHAPES[True])
    assert (eager.status, tdbg.status) == ("ok", "ok"), tdbg.error
    assert len(tdbg.runs_s) == 2 and tdbg.compile_s > 0
    assert channel.status == element.status == "mismatch" and channel.runs_s == element.runs_s == []
    assert [mm["output"] for mm in channel.mismatches] == ["out[1]['net.body.0.weight']"]
    assert [mm["output"] for mm in element.mismatches] == ["out[1]['net.body.1.weight']"]
    for cell in (channel, element):
        assert "(tensor rule <= 2x)" in cell.error


def test_checked_training_run_throws_no_step_away(m, monkeypatch):
    """Forward calls of one eager training run (repeat 2, warm-up 2, one call per timed run): the
    float64 reference 1, the check's cold and warm steps 2 (the reference for other backends and
    the first warm-up step), 1 more warm-up step, 2 timed: 6 (it was 9: a separate eager
    reference step, a second warm-up step and a calibration step)."""
    net, inputs = _bn_case(m)
    calls = []
    net.net.register_forward_pre_hook(lambda mod, args: calls.append(args[0].dtype))
    monkeypatch.setattr(m, "build", lambda zm, tiny, shapes, training, dtype: (net, inputs))
    phases = m.Phases()
    (cell,) = m.run_training(m.BY_NAME["distilbert"], ["eager"], m.Settings(repeat=2, warmup=2, run_seconds=0.0),
                             m.SHAPES[True], phases)
    assert cell.status == "ok" and len(cell.runs_s) == 2
    assert calls == [torch.float64] + [torch.float32] * 5
    assert list(phases) == ["build", "float64 reference", "check eager", "warm-up", "timed"]
