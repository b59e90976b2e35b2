"""Compiles fine, then fails on its own: tdbg run must return the script's own exit code."""
import sys

import torch

f = torch.compile(lambda x: x + 1, backend="eager")
f(torch.ones(2))
sys.exit(7)
