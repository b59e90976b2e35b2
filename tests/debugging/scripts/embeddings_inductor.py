"""BERT's embeddings as plain torch (tests/debugging/test_determinism_later.py): three embeddings
summed and layer-normed. Two things no toy showed:
- `positions` is an expanded input (stride 0): a check that copied inputs with clone() made it
  contiguous, and Inductor's compiled graph rejected it (`expected ... stride 128==0`): a correct
  program reported FAILED at stage backend;
- Inductor fuses the token-type embedding's backward (all 2048 tokens hit row 0) into a parallel
  C++ kernel that accumulates with atomic adds: with 2 or more threads, the rows' sums come out in
  another order on each run (its gradient differs in the last bits between two runs; at this
  size 4 runs of 4 differed here, at 4 x 32 tokens one run of 3 came out the same)."""
import torch

torch.manual_seed(0)
word = torch.nn.Embedding(1000, 128)
pos = torch.nn.Embedding(128, 128)
tt = torch.nn.Embedding(2, 128)
norm = torch.nn.LayerNorm(128)
lin = torch.nn.Linear(128, 128)


def f(ids, types, positions):
    h = norm(word(ids) + tt(types) + pos(positions))
    return lin(h).sum()


ids = torch.randint(0, 1000, (16, 128))
types = torch.zeros(16, 128, dtype=torch.long)
positions = torch.arange(128).expand(16, 128)
torch.compile(f)(ids, types, positions).backward()
print("ok", round(float(tt.weight.grad.abs().sum()), 1))
