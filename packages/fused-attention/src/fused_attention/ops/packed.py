"""flash_attention_qkvpacked: attention over one packed (B, S, H + 2 H_kv, D) tensor.

A fused qkv projection yields q, k and v as views of one tensor. Through flash_attention, autograd
then splits that tensor, and its backward concatenates dQ, dK and dV into the packed gradient: a
copy of the whole gradient per layer (measured on an H100 in a 410M GPT step, batch 8 x 2048:
1.6 ms of 98 in `CatArrayBatchedCopy`). Here the backward kernels write dQ, dK and dV straight
into views of one packed gradient instead.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._compat import KERNEL_DEVICE_TYPE, custom_bwd, custom_fwd, is_compiling
from .._validation import ATTENTION_DTYPES, check_device, check_head_dim, check_tensor
from .attention import _addressable, _autocast_inputs, _dense_spec, flash_attention
from .launch import AttentionSpec, attention_bwd, attention_fwd


def _unpack(qkv: torch.Tensor, n_heads: int, n_kv_heads: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as (B, S, heads, D) views of the packed tensor (or of its gradient)."""
    return qkv.split((n_heads, n_kv_heads, n_kv_heads), dim=2)


class FlashAttentionQKVPackedFunction(torch.autograd.Function):
    """Autograd of attention over a packed qkv tensor; the gradient comes back packed the same way."""

    @staticmethod
    @custom_fwd
    def forward(ctx, qkv, alibi_slopes, spec: AttentionSpec):
        q, k, v = _unpack(qkv, spec.n_heads, spec.n_kv_heads)
        out, lse = attention_fwd(q, k, v, alibi_slopes, None, None, spec)
        ctx.save_for_backward(qkv, out, lse)
        ctx.extras = (alibi_slopes, spec)
        return out

    @staticmethod
    @custom_bwd
    def backward(ctx, dout):
        qkv, out, lse = ctx.saved_tensors
        alibi_slopes, spec = ctx.extras
        dout = _addressable(dout, 1)
        dqkv = torch.empty(qkv.shape, dtype=qkv.dtype, device=qkv.device)
        q, k, v = _unpack(qkv, spec.n_heads, spec.n_kv_heads)
        grads = _unpack(dqkv, spec.n_heads, spec.n_kv_heads)
        attention_bwd(dout, q, k, v, out, lse, None, alibi_slopes, None, None, spec, grads=grads)
        return dqkv, None, None


def _packed_heads(qkv, n_kv_heads: Optional[int]) -> Tuple[int, int]:
    """(H, H_kv) of a packed qkv tensor, checked."""
    if not isinstance(qkv, torch.Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() != 4:
        raise ValueError(f"qkv must be a 4-D (B, S, H + 2 * H_kv, D) tensor, got shape {tuple(qkv.shape)}")
    packed = qkv.shape[2]
    if packed < 3:
        raise ValueError(f"qkv packs {packed} heads: at least 3 are needed (a query, a key and a value head)")
    if n_kv_heads is None:
        if packed % 3:
            raise ValueError(
                f"qkv packs {packed} heads, not a multiple of 3: pass n_kv_heads (H_kv) for grouped-query attention"
            )
        n_kv_heads = packed // 3
    elif isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1:
        raise ValueError(f"n_kv_heads must be a positive int, got {n_kv_heads!r}")
    n_heads = packed - 2 * n_kv_heads
    if n_heads < 1:
        raise ValueError(f"qkv packs {packed} heads, too few for 2 x n_kv_heads = {2 * n_kv_heads} plus the queries")
    check_head_dim(qkv.shape[3])
    return n_heads, n_kv_heads


def flash_attention_qkvpacked(
    qkv: torch.Tensor,
    n_kv_heads: Optional[int] = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    deterministic: bool = False,
) -> torch.Tensor:
    """flash_attention over q, k and v packed in one tensor, differentiable in it.

    qkv: (B, S, H + 2 * H_kv, D): the H query heads, then the H_kv key heads, then the H_kv value
        heads, as a fused qkv projection's output viewed as heads. FlashAttention's packed
        (B, S, 3, H, D) is the same memory: `qkv.flatten(2, 3)` passes it without a copy.
    n_kv_heads: H_kv; None: a third of the packed heads (multi-head attention).
    causal, softmax_scale, alibi_slopes, window_size, deterministic: as flash_attention (layout
        "bshd"; self-attention, so S_q = S_k).

    Returns out (B, S, H, D). The gradient of qkv is written packed by the backward kernels (no
    concatenation of dQ, dK and dV). Under torch.compile it traces as flash_attention on the views.
    """
    n_heads, n_kv_heads = _packed_heads(qkv, n_kv_heads)
    (qkv,) = _autocast_inputs(qkv)  # once for q, k and v
    if qkv.dtype not in ATTENTION_DTYPES or qkv.device.type != KERNEL_DEVICE_TYPE:  # errors that name qkv
        check_tensor("qkv", qkv, ATTENTION_DTYPES)
        check_device(qkv=qkv)
    qkv = _addressable(qkv, 1)
    q, k, v = _unpack(qkv, n_heads, n_kv_heads)
    if is_compiling() or not (torch.is_grad_enabled() and qkv.requires_grad):
        return flash_attention(q, k, v, causal, softmax_scale, alibi_slopes, window_size, False, "bshd", deterministic)
    # flash_attention's checks and spec (cached per argument combination)
    spec = _dense_spec(q, k, v, causal, softmax_scale, alibi_slopes, window_size, "bshd", deterministic)
    return FlashAttentionQKVPackedFunction.apply(qkv, alibi_slopes, spec)
