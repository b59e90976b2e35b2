"""Shared test helpers: compiled-vs-eager checks with informative failures.

`check_model` runs `fn` eagerly and under `torch.compile(fn, backend=...)` on clones of the
same inputs and fails with `tdbg.minifier.diagnose.accuracy.compare`'s mismatch messages. With
`check_grad`, it also compares the gradients of every parameter (when `fn` is a module) and
every input that requires grad, through a fixed random projection of the outputs.
"""
from __future__ import annotations

import copy

import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

from tdbg.minifier.diagnose.accuracy import compare, flatten, fp64_reference


def clone_inputs(inputs):
    """Detached copies that keep requires_grad, so eager and compiled runs never share state."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            c = x.detach().clone()
            c.requires_grad_(x.requires_grad)
            out.append(c)
        else:
            out.append(copy.deepcopy(x))
    return out


def _grad_leaves(fn, inputs):
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    return params + [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]


def _gradients(fn, outputs, inputs):
    """Gradients of a fixed random projection of the float outputs w.r.t. params and inputs."""
    leaves = _grad_leaves(fn, inputs)
    outs = [o for _, o in flatten(outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
    gen = torch.Generator().manual_seed(1234)
    loss = sum((o * torch.randn(o.shape, generator=gen).to(o.dtype)).sum() for o in outs)
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [torch.zeros_like(leaf) if g is None else g for leaf, g in zip(leaves, grads)]


def _fp64_gradients(fn, inputs):
    """The same gradients computed in float64 (the reference that absorbs eager's own error)."""
    try:
        fn64 = copy.deepcopy(fn).to(torch.float64) if isinstance(fn, torch.nn.Module) else fn
        in64 = [x.detach().to(torch.float64).requires_grad_(x.requires_grad)
                if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        return _gradients(fn64, fn64(*in64), in64)
    except Exception:
        return None


def _explicit_tolerance(mismatches, expected, actual, rtol, atol):
    """Drop the mismatches that the caller's explicit rtol/atol accept."""
    if rtol is None and atol is None:
        return mismatches
    values = dict(zip((p for p, _ in flatten(expected)), zip((e for _, e in flatten(expected)),
                                                              (a for _, a in flatten(actual)))))
    kept = []
    for m in mismatches:
        e, a = values.get(m.output, (None, None))
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor) and e.shape == a.shape and \
                torch.allclose(a.detach(), e.detach(), rtol=rtol or 0.0, atol=atol or 0.0, equal_nan=True):
            continue
        kept.append(m)
    return kept


def assert_matches(expected, actual, reference=None, *, rtol=None, atol=None, what="output"):
    mismatches = compare(expected, actual, reference)
    mismatches = _explicit_tolerance(mismatches, expected, actual, rtol, atol)
    assert not mismatches, f"compiled {what} differs from eager:\n" + "\n".join(
        f"  {m.output} {m.dtype} {list(m.shape)}: {m.message}" for m in mismatches)


def check_model(fn, inputs, *, backend="tdbg", rtol=None, atol=None, check_grad=False):
    """Compile `fn` with `backend`, run it on `inputs`, assert it matches eager; return its result.

    Asserts that Dynamo handed at least one graph to the backend (a test that silently ran
    eager would prove nothing).
    """
    torch._dynamo.reset()
    try:
        eager_in, compiled_in = clone_inputs(inputs), clone_inputs(inputs)
        expected = fn(*eager_in)
        counter = CompileCounterWithBackend(backend)
        actual = torch.compile(fn, backend=counter)(*compiled_in)
        assert counter.frame_count >= 1, "Dynamo compiled no graph: the test would only run eager"
        no_grad_in = [x.detach() if isinstance(x, torch.Tensor) else x for x in clone_inputs(inputs)]
        assert_matches(expected, actual, fp64_reference(fn, no_grad_in), rtol=rtol, atol=atol)
        if check_grad:
            assert_matches(_gradients(fn, expected, eager_in), _gradients(fn, actual, compiled_in),
                           _fp64_gradients(fn, inputs), rtol=rtol, atol=atol, what="gradient")
        return actual
    finally:
        torch._dynamo.reset()


def compile_capturing(fn, dynamo_dynamic=True, **cfg):
    """(fn compiled by tdbg after a Dynamo reset and a clear of its counters, the list its
    CompiledGraphs are appended to); `cfg` replaces fields of the current compiler config."""
    from torch._dynamo.utils import counters
    from tdbg.compiler import compile_aten, make_backend
    from tdbg.compiler.config import current
    torch._dynamo.reset()
    counters.clear()
    graphs = []

    def inner(gm, inputs, config, **kw):
        graphs.append(compile_aten(gm, inputs, config, **kw))
        return graphs[-1]
    return torch.compile(fn, backend=make_backend(current().replace(**cfg), inner), dynamic=dynamo_dynamic), graphs
