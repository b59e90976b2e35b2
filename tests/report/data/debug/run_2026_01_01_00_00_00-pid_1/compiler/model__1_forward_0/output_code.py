# tdbg output code for graph foo2__0_inference_0
# Run `python output_code.py` to time this graph on random inputs.
import torch
from torch import empty_strided
from tdbg.compiler.wrapper import (BufferPool as _BufferPool, as_strided as _as_strided,
                                   below_autograd as _below_autograd, kernel_failed as _kernel_failed,
                                   load_kernels, main as _main, restride as _restride)
aten = torch.ops.aten
prims = torch.ops.prims

GRAPH = 'foo2__0_inference_0'
KERNELS = {
    'cpp_fused_cat_maximum_neg_0': r'''
extern "C" int cpp_fused_cat_maximum_neg_0(const float* in_ptr0, const float* in_ptr1, float* out_ptr0)
{
    int tdbg_status = 0;
    #pragma omp parallel for num_threads(2)
    for (int64_t x0 = 0; x0 < 8390; ++x0)
    {
        #pragma omp simd simdlen(8)
        for (int64_t x1 = 0; x1 < 8; ++x1)
        {
            // FX: maximum = torch.ops.aten.maximum.default(arg1_1, neg)
            float tmp0 = in_ptr0[(x1 + (8*x0))];
            // FX: neg = torch.ops.aten.neg.default(arg0_1)
            float tmp1 = in_ptr1[x1];
            float tmp2 = decltype(tmp1)(-tmp1);
            // FX: maximum = torch.ops.aten.maximum.default(arg1_1, neg)
            float tmp3 = decltype(tmp2)(-2*tmp2);
            float tmp4 = tdbg_maximum(tmp0, tmp3);
            out_ptr0[(x1 + (8*x0))] = tmp4;
        }
    }
    return tdbg_status;
}
''',
}
NARGS = {'cpp_fused_cat_maximum_neg_0': 3}
STATUS = {'cpp_fused_cat_maximum_neg_0': []}
INPUTS = [((1, 8), (8, 1), torch.float32), ((8390, 8), (8, 1), torch.float32)]


def load(config=None):
    return load_kernels(KERNELS, NARGS, config)


def make_call(kernels, constants=None):
    _k_cpp_fused_cat_maximum_neg_0 = kernels['cpp_fused_cat_maximum_neg_0']

    def call(args):
        arg0_1, arg1_1 = args
        args.clear()
        if arg0_1.stride() != (8, 1): arg0_1 = _restride(arg0_1, (8, 1))
        if arg1_1.stride() != (8, 1): arg1_1 = _restride(arg1_1, (8, 1))
        buf0 = empty_strided((8390, 8), (8, 1), dtype=torch.float32)
        _status = _k_cpp_fused_cat_maximum_neg_0(arg1_1.data_ptr(), arg0_1.data_ptr(), buf0.data_ptr())
        if _status: _kernel_failed(_status, 'cpp_fused_cat_maximum_neg_0', STATUS, KERNELS)
        return (buf0,)
    return call


if __name__ == "__main__":
    _consts = {}
    _main(GRAPH, make_call(load(), _consts), INPUTS, _consts)
