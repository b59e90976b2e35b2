"""Leaves its last writes to interpreter exit: an atexit handler, and a module-level file it never
closes (its buffer reaches the disk when the file object is torn down)."""
import atexit
import os
import sys

import torch

out = sys.argv[1]
log = open(os.path.join(out, "unclosed.txt"), "w")
log.write("written by the script, never closed\n")
atexit.register(lambda: open(os.path.join(out, "atexit.txt"), "w").write("written at exit\n"))
print(torch.compile(lambda x: x.sin() + 1)(torch.zeros(3)).tolist())
