def forward(self, arg0_1, arg1_1):
    neg = torch.ops.aten.neg.default(arg0_1)
    return (neg,)
