"""A program Dynamo cannot capture: fullgraph=True with a data-dependent branch."""
import torch


def clip_if_large(x):
    if x.sum() > 0:
        return x.clamp(max=1.0)
    return x


compiled = torch.compile(clip_if_large, fullgraph=True)
print(compiled(torch.randn(16)).sum())
