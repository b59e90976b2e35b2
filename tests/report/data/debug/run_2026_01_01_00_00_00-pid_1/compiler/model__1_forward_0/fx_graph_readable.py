class <lambda>(torch.nn.Module):
    def forward(self, arg0_1: "f32[1, 8]", arg1_1: "f32[8390, 8]"):
        # File: /work/main/examples/foo2.py:6 in foo2, code: a = torch.neg(x1)
        neg: "f32[1, 8]" = torch.ops.aten.neg.default(arg0_1);  arg0_1 = None

        # File: /work/main/examples/foo2.py:7 in foo2, code: b = torch.maximum(x2, a)
        maximum: "f32[8390, 8]" = torch.ops.aten.maximum.default(arg1_1, neg);  arg1_1 = neg = None

        # File: /work/main/examples/foo2.py:8 in foo2, code: y = torch.cat([b], dim=0)
        cat: "f32[8390, 8]" = torch.ops.aten.cat.default([maximum]);  maximum = None
        return (cat,)
