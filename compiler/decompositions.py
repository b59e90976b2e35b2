"""The decomposition table tdbg owns: composite aten ops rewritten (by torch._decomp) into the
small set lowering.py handles, so the lowering table stays small.

`decomposition_table(config)` is what AOTAutograd gets; `config.decompose=False` gives the
minimal table (nothing decomposed: such ops run through aten as extern calls).
"""
from __future__ import annotations

import functools

import torch

from .torch_compat import get_decompositions

aten = torch.ops.aten

DECOMPOSED = [
    # normalization, activations and their backwards -> pointwise + reductions
    aten._softmax, aten._log_softmax, aten._softmax_backward_data, aten._log_softmax_backward_data,
    aten.native_layer_norm, aten.native_layer_norm_backward,
    aten._native_batch_norm_legit_functional,
    # eval BatchNorm: pointwise over the running stats, so it fuses with the activation/residual after it
    aten._native_batch_norm_legit_no_training, aten._native_batch_norm_legit, aten.native_batch_norm,
    aten.native_batch_norm_backward, aten.native_group_norm, aten.native_group_norm_backward,
    aten.gelu, aten.gelu_backward, aten.silu, aten.silu_backward, aten.hardtanh, aten.hardtanh_backward,
    aten.leaky_relu, aten.leaky_relu_backward, aten.elu, aten.elu_backward, aten.softplus,
    aten.softplus_backward, aten.hardsigmoid, aten.hardsigmoid_backward, aten.hardswish,
    aten.hardswish_backward, aten.mish, aten.threshold, aten.threshold_backward, aten.sigmoid_backward,
    aten.tanh_backward, aten.logit, aten.glu,
    # losses
    aten.nll_loss_forward, aten.nll_loss_backward, aten.mse_loss, aten.mse_loss_backward,
    aten.binary_cross_entropy, aten.binary_cross_entropy_backward, aten.huber_loss, aten.smooth_l1_loss,
    # pointwise composites
    aten.addcmul, aten.addcdiv, aten.lerp, aten.masked_fill, aten.rsub, aten.xlogy, aten.logaddexp,
    aten.clamp_min, aten.clamp_max, aten.square, aten.nan_to_num, aten.heaviside,
    # factories -> full / iota
    aten.zeros, aten.ones, aten.zeros_like, aten.ones_like, aten.full_like, aten.new_zeros, aten.new_ones,
    aten.new_full, aten.arange, aten.linspace, aten.eye,
    # reductions
    aten.std, aten.std_mean, aten.logsumexp, aten.linalg_vector_norm, aten.norm,
    # shape composites -> views and cat
    aten.stack, aten.narrow, aten.split, aten.split_with_sizes, aten.unbind, aten.expand_as,
    aten.select_backward, aten.slice_backward, aten.embedding_dense_backward, aten.flip, aten.roll,
    aten.diagonal_backward, aten.repeat, aten.tril, aten.triu,
    aten.baddbmm, aten.addmv, aten.index_add, aten._unsafe_index,
    # OpInfo coverage (issue 23 item 5): composites whose decompositions reach lowered ops only
    aten.diag_embed, aten.diagonal_copy, aten.log_sigmoid_forward,
    aten._safe_softmax, aten.isneginf, aten.isposinf, aten.nansum, aten.deg2rad, aten.rad2deg,
    aten.expand_copy, aten.alias_copy, aten.view_copy, aten.permute_copy, aten.t_copy, aten.transpose_copy,
    aten.unsqueeze_copy, aten.squeeze_copy, aten.narrow_copy, aten.unbind_copy,
    aten.slice_scatter, aten.select_scatter, aten.logaddexp2, aten.sinc, aten.sgn,
    aten.celu, aten._prelu_kernel, aten.binary_cross_entropy_with_logits,
    aten.nll_loss2d_forward, aten.addr, aten.block_diag, aten.dist, aten.rot90, aten.trace, aten.zero,
    aten.fill, aten.count_nonzero, aten.pixel_shuffle, aten.pixel_unshuffle, aten.channel_shuffle,
    aten.special_xlog1py, aten.special_entr, aten.renorm, aten.ldexp,
    aten.index_fill, aten.index_copy, aten.take, aten.mvlgamma, aten.aminmax, aten.reflection_pad1d,
    aten.replication_pad1d, aten.replication_pad2d, aten._adaptive_avg_pool2d,
    aten.logspace, aten.linalg_cross, aten.new_empty,
    aten.empty_like, aten._unsafe_masked_index, aten.im2col,
    aten._batch_norm_with_update_functional,
    # (not max_pool2d_with_indices: its decomposition gathers every window through index tensors,
    # 23 ms a call on ResNet-50's stem pool against aten's 5.6 (0.4 channels_last); a direct
    # lowering with masked taps took 6.2 ms channels_last (2026-11-27): aten's kernel stays)
    # (not soft_margin_loss: torch's decomposition computes in float32 where eager's fp16 kernel
    # rounds exp() to fp16: eager gives inf, the decomposition 7.64, a mismatch against eager)
    # random: the distributions' transforms of uniform samples, drawn by lowering_random
    aten.cauchy, aten.exponential, aten.geometric, aten.log_normal,
]


@functools.lru_cache(maxsize=2)
def _table(decompose: bool) -> dict:
    return get_decompositions(DECOMPOSED) if decompose else {}


def decomposition_table(config) -> dict:
    """Decompositions AOTAutograd applies for `config`."""
    return _table(bool(config.decompose))
