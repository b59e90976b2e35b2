"""Three compiled calls return, then the script's own Python loops forever (a hang outside any
compiled graph: the time goes in plain Python, not in the backend)."""
import torch


def f(x):
    return torch.sin(x) + 1


g = torch.compile(f)
for _ in range(3):
    g(torch.randn(4))
print("three calls done", flush=True)
while True:
    pass
