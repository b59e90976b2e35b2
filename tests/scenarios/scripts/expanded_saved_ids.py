"""BERT's token-type ids in a training step: a gather of a buffer, expanded over the batch
(stride 0), saved for the embedding's backward. Under tdbg (torch 2.13) the backward graph
restrides that saved input to stride (0, 1) with a copy_, which fails: "more than one element of
the written-to tensor refers to a single memory location" (aot_eager and Inductor run it). Found
by benchmarks/models.py on tiny BERT (`--tiny --only bert_base --modes training`)."""
import torch


class TokenTypes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(4, 8)
        self.register_buffer("types", torch.zeros(1, 64, dtype=torch.long))
        self.register_buffer("pos", torch.arange(64).expand(1, -1))

    def forward(self, x):
        ids = torch.gather(self.types.expand(1, -1), 1, self.pos[:, :16]).expand(x.shape[0], 16)
        return (self.emb(ids) * x).sum()


torch.manual_seed(0)
model, x = TokenTypes(), torch.randn(2, 16, 8)
model(x).backward()
expected = model.emb.weight.grad.clone()
model.zero_grad()
torch.compile(model)(x).backward()
print("grad max abs error", float((model.emb.weight.grad - expected).abs().max()))
