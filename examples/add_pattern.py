"""Seed pattern from the profiling section: add / add / mul / add on (16384, 512) float32."""
import torch


def fn(a, b, c, d):
    return (a + b + c) * d + a


torch.manual_seed(0)
args = [torch.randn(16384, 512) for _ in range(4)]
compiled = torch.compile(fn)
for _ in range(3):
    out = compiled(*args)
torch.testing.assert_close(out, fn(*args))
print("add_pattern ok")
