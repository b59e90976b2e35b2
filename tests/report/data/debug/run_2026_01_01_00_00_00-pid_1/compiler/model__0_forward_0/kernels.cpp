// kernel cpp_fused_exp_neg_0
extern "C" int cpp_fused_exp_neg_0(const float* in_ptr0, float* out_ptr0)
{
    for (int64_t x0 = 0; x0 < 4; ++x0)
    {
        // FX: neg = torch.ops.aten.neg.default(arg0_1)
        float tmp0 = in_ptr0[x0];
        float tmp1 = -tmp0;
        // FX: exp = torch.ops.aten.exp.default(neg)
        float tmp2 = tdbg_exp(tmp1);
        out_ptr0[x0] = tmp2;
    }
    return 0;
}
