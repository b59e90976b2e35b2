"""Inductor recompiles more often than Dynamo alone: the module is compiled for 2 rows, then for
any number of rows (Dynamo's automatic dynamic shapes); Inductor adds a guard of its own on the
row count (2 <= rows <= 4096 in torch 2.13), so 5000 rows recompile once more (eager: 1
recompile, torch:inductor: 2). The guards name module parameters (`self.fc.weight`)."""
import torch


class ColumnSums(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)).sum(0)


torch.manual_seed(0)
model = torch.compile(ColumnSums())
with torch.no_grad():
    for rows in (2, 3, 8, 600, 5000):
        print(rows, model(torch.ones(rows, 4)).shape)
