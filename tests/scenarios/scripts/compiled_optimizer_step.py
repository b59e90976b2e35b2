"""A compiled AdamW step beside an eager twin: Dynamo installs the parameters and the optimizer's
state as attributes of its graph (get_attr, not inputs), and the step changes them in place. The
script checks itself: the compiled copy must end where the eager twin does."""
import copy

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
twin = copy.deepcopy(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)


@torch.compile
def step():
    opt.step()


for _ in range(3):
    x = torch.randn(4, 8)
    for m, o, s in ((model, opt, step), (twin, twin_opt, twin_opt.step)):
        m(x).square().mean().backward()
        s()
        o.zero_grad()
diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))
print(f"max parameter difference from the eager twin: {diff:.3g}")
assert diff < 1e-5, "the compiled optimizer took other steps than eager"
