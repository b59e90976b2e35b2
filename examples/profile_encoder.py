"""nn.TransformerEncoderLayer(512, 8) in eval mode with the MHA fast path off, compiled.

Used by `tdbg profile examples/profile_encoder.py` (see docs/profile.md) and the benchmark harness row
`encoder_layer`. argv: optional batch size (default 16).
"""
import sys

import torch

torch.backends.mha.set_fastpath_enabled(False)
torch.manual_seed(0)
batch = int(sys.argv[1]) if len(sys.argv) > 1 else 16
layer = torch.nn.TransformerEncoderLayer(512, 8).eval()
x = torch.randn(batch, 128, 512)
compiled = torch.compile(layer)
with torch.no_grad():
    for _ in range(3):
        out = compiled(x)
    expected = layer(x)
torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
print("encoder layer ok", tuple(out.shape))
