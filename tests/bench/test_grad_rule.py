"""The model zoo's training check (benchmarks/models.py gradient_mismatches, run_training): the
tensor-level rule passes an error spread like eager's that `compare`'s worst-element rule flags,
and still flags a gradient off in one channel or one element; a checked training run throws no
step away."""
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
    assert m.gradient_mismatches(eager, spread, ref) == []
    # the same error norm, 2.5x eager's (five elements off by 1e-3): flagged, with both figures
    worse = (loss, _grads([1 + 1e-3] * 5 + [1.0] * 95))
    (mm,) = m.gradient_mismatches(eager, worse, ref)
    assert mm.output == "out[1]['w']" and mm.message.endswith("= 2.2x eager's 0.001 (tensor rule <= 2x)")
    # the loss keeps the worst-element rule; without a float64 reference, compare's verdict stands
    wrong_loss = (torch.tensor(2.001), spread[1])
    assert [mm.output for mm in m.gradient_mismatches(eager, wrong_loss, ref)] == ["out[0]"]
    assert [mm.output for mm in m.gradient_mismatches(eager, spread, None)] == ["out[1]['w']"]


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
    monkeypatch.setattr(m, "build", lambda zm, tiny, shapes, training: (net, inputs))
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
    monkeypatch.setattr(m, "build", lambda zm, tiny, shapes, training: (net, inputs))
    phases = m.Phases()
    (cell,) = m.run_training(m.BY_NAME["distilbert"], ["eager"], m.Settings(repeat=2, warmup=2, run_seconds=0.0),
                             m.SHAPES[True], phases)
    assert cell.status == "ok" and len(cell.runs_s) == 2
    assert calls == [torch.float64] + [torch.float32] * 5
    assert list(phases) == ["build", "float64 reference", "check eager", "warm-up", "timed"]
