class <lambda>(torch.nn.Module):
    def forward(self, arg0_1: "f32[4]"):
        # File: prog.py:3 in f, code: a = torch.neg(x)
        neg: "f32[4]" = torch.ops.aten.neg.default(arg0_1);  arg0_1 = None

        # File: prog.py:4 in f, code: b = torch.exp(a)
        exp: "f32[4]" = torch.ops.aten.exp.default(neg);  neg = None
        return (exp,)
