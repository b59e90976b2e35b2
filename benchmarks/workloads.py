"""The benchmark workloads, one table row each.

A row's `build(quick)` returns `(fn, inputs)`: `fn(*inputs)` is what every backend runs
(modules are built in eval mode inside `build`, with a fixed seed). `bytes_moved(inputs, out)`
is set for memory-bound rows: the bytes a single pass must read and write, from which the
harness computes the achieved bandwidth.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    build: Callable            # quick: bool -> (fn, inputs)
    bytes_moved: Optional[Callable] = None   # (inputs, output) -> int, for memory-bound rows
    max_time_vs_inductor: float = 1.0        # issue 5's goal for tdbg's time per call
    bandwidth_goal: bool = False             # memory-bound: tdbg should reach 80% of the copy figure


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _rows(full: int, quick: int, q: bool) -> int:
    return quick if q else full


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _seed_pattern(q):
    # the tutorial's bench.py: arg_1, arg_3, arg_4 broadcast over the rows
    g, n = _gen(), _rows(16384, 256, q)

    def fn(arg_0, arg_1, arg_2, arg_3, arg_4):
        return ((arg_0 + arg_1) + arg_2) * arg_3 + arg_4
    return fn, [torch.rand(n, 512, generator=g), torch.rand(1, 512, generator=g), torch.zeros(n, 512),
                torch.rand(1, 512, generator=g), torch.rand(1, 512, generator=g)]


def _foo1(q):
    g = _gen()

    def foo1(x1, x2):
        a = torch.neg(x1)
        b = torch.maximum(x2, a)
        return torch.cat([b], dim=0)
    return foo1, [torch.randint(256, (1, 8), dtype=torch.uint8, generator=g),
                  torch.randint(256, (_rows(8390, 64, q), 8), dtype=torch.uint8, generator=g)]


def _softmax(q):
    def softmax(x):
        return torch.softmax(x, dim=-1)
    return softmax, [torch.randn(_rows(4096, 64, q), 1024, generator=_gen())]


def _layernorm(q):
    torch.manual_seed(0)
    return torch.nn.LayerNorm(768).eval(), [torch.randn(_rows(8192, 64, q), 768, generator=_gen())]


class MLP(torch.nn.Module):
    """Linear(768, 3072) -> GELU -> Linear(3072, 768) + residual (a module, so fp64 references work)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(768, 3072), torch.nn.Linear(3072, 768)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))) + x


def _mlp(q):
    torch.manual_seed(0)
    return MLP().eval(), [torch.randn(_rows(512, 16, q), 768, generator=_gen())]


def _reductions(q):
    def reductions(x):
        return x.sum(1), (x * x).mean(0)
    return reductions, [torch.randn(_rows(8192, 64, q), 1024, generator=_gen())]


def _encoder(q):
    torch.manual_seed(0)
    x = torch.randn(_rows(16, 2, q), _rows(128, 16, q), 512, generator=_gen())
    return torch.nn.TransformerEncoderLayer(512, 8).eval(), [x]


def _copy_add(q):
    g, n = _gen(), (1 << 26) if not q else (1 << 16)

    def add(a, b):
        return a + b
    return add, [torch.rand(n, generator=g), torch.rand(n, generator=g)]


def _io_bytes(inputs, out) -> int:
    """Every input read once and every output written once."""
    outs = out if isinstance(out, (tuple, list)) else [out]
    return _nbytes(*inputs, *outs)


WORKLOADS = (
    Workload("seed_pattern", "add/add/mul/add on (16384,512) fp32 (seed)", _seed_pattern, _io_bytes,
             bandwidth_goal=True),
    Workload("foo1_uint8", "uint8 neg/maximum/cat at (1,8) and (8390,8) (seed foo1)", _foo1, _io_bytes),
    Workload("softmax", "softmax over (4096,1024)", _softmax, _io_bytes, 0.7, True),
    Workload("layernorm", "nn.LayerNorm(768) on (8192,768)", _layernorm, _io_bytes, 0.7, True),
    Workload("mlp", "Linear(768,3072)->GELU->Linear(3072,768)+residual on (512,768)", _mlp),
    Workload("reductions", "x.sum(1) and (x*x).mean(0) on (8192,1024)", _reductions, _io_bytes, 0.7, True),
    Workload("encoder_layer", "nn.TransformerEncoderLayer(512,8) on (16,128,512), eval, fastpath off", _encoder),
    Workload("add_64m", "a + b on 64M fp32 (bandwidth with a fresh output)", _copy_add, _io_bytes,
             bandwidth_goal=True),
)

BY_NAME = {w.name: w for w in WORKLOADS}
