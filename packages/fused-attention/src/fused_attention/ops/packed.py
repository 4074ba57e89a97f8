"""flash_attention_qkvpacked: attention over one packed (B, S, H + 2 H_kv, D) tensor.

A fused qkv projection yields q, k and v as views of one tensor. Through flash_attention, autograd
then splits that tensor, and its backward concatenates dQ, dK and dV into the packed gradient: a
copy of the whole gradient per layer (measured on an H100 in a 410M GPT step, batch 8 x 2048:
1.6 ms of 98 in `CatArrayBatchedCopy`). Here the backward kernels write dQ, dK and dV straight
into views of one packed gradient instead.

Host path, per call: one plan lookup (as flash_attention's, keyed by the packed tensor), the
forward on its three views; the backward allocates the packed gradient and launches on its views.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from .._runtime.compat import KERNEL_DEVICE_TYPE, custom_bwd, custom_fwd, is_compiling
from .._runtime.dropout import check_seed, dropout_rng
from .._runtime.registration import eager_function_apply
from .._validation import ATTENTION_DTYPES, check_device, check_head_dim, check_tensor
from .attention import (
    _addressable,
    _autocast_inputs,
    _check_dense,
    _option_key,
    _slopes_key,
    call_plan,
    flash_attention,
    lookup,
)
from .launch import ForwardPlan, addressable, call_plan_cache, contiguous_strides


class PackedPlan(NamedTuple):
    """What flash_attention_qkvpacked's checks decided for one argument key: the forward plan of
    the q, k, v views (of qkv's contiguous copy where copy), their head counts, and the shape and
    the views' strides of the packed gradient."""

    forward: ForwardPlan
    split: Tuple[int, int, int]
    copy: bool
    shape: torch.Size
    grad_strides: Tuple[Tuple[int, ...], ...]


class FlashAttentionQKVPackedFunction(torch.autograd.Function):
    """Autograd of attention over a packed qkv tensor laid out as `plan` says; the gradient comes
    back packed the same way."""

    @staticmethod
    @custom_fwd
    def forward(ctx, qkv, alibi_slopes, rng, plan: PackedPlan):
        q, k, v = qkv.split(plan.split, dim=2)
        out, lse = plan.forward.forward(q, k, v, alibi_slopes, None, None, rng)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.extras = (alibi_slopes, rng, plan)
        return out

    @staticmethod
    @custom_bwd
    def backward(ctx, dout):
        if torch.is_grad_enabled():  # create_graph=True: a second backward through this one must raise
            return _backward_once(ctx, dout)
        return _backward(ctx, dout)


_packed_apply = eager_function_apply(FlashAttentionQKVPackedFunction)


def _backward(ctx, dout):
    q, k, v, out, lse = ctx.saved_tensors
    alibi_slopes, rng, plan = ctx.extras
    forward = plan.forward
    dqkv = torch.empty(plan.shape, dtype=forward.dtype, device=forward.device)
    grads = dqkv.split(plan.split, dim=2)
    forward.backward(dout, None, q, k, v, out, lse, alibi_slopes, None, None, grads, plan.grad_strides, rng=rng)
    return dqkv, None, None, None


_backward_once = once_differentiable(_backward)


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


def _check_packed(qkv, n_kv_heads) -> Tuple[int, int, int]:
    """The head split (H, H_kv, H_kv) of a packed qkv tensor, checked, with the type, dtype and
    device errors naming qkv."""
    n_heads, n_kv_heads = _packed_heads(qkv, n_kv_heads)
    if qkv.dtype not in ATTENTION_DTYPES or qkv.device.type != KERNEL_DEVICE_TYPE:
        check_tensor("qkv", qkv, ATTENTION_DTYPES)
        check_device(qkv=qkv)
    return n_heads, n_kv_heads, n_kv_heads


def flash_attention_qkvpacked(
    qkv: torch.Tensor,
    n_kv_heads: Optional[int] = None,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    deterministic: bool = False,
    softcap: float = 0.0,
    dropout_p: float = 0.0,
    seed: Optional[int] = None,
    seed_offset: int = 0,
) -> torch.Tensor:
    """flash_attention over q, k and v packed in one tensor, differentiable in it.

    qkv: (B, S, H + 2 * H_kv, D): the H query heads, then the H_kv key heads, then the H_kv value
        heads, as a fused qkv projection's output viewed as heads. FlashAttention's packed
        (B, S, 3, H, D) is the same memory: `qkv.flatten(2, 3)` passes it without a copy.
    n_kv_heads: H_kv; None: a third of the packed heads (multi-head attention).
    causal, softmax_scale, alibi_slopes, window_size, deterministic, softcap, dropout_p, seed,
        seed_offset: as flash_attention (layout "bshd"; self-attention, so S_q = S_k).

    Returns out (B, S, H, D). The gradient of qkv is written packed by the backward kernels (no
    concatenation of dQ, dK and dV). Under torch.compile it traces as flash_attention on the views.
    """
    check_seed(seed, seed_offset)
    (qkv,) = _autocast_inputs(qkv)  # once for q, k and v
    if is_compiling():
        q, k, v = _addressable(qkv, 1).split(_check_packed(qkv, n_kv_heads), dim=2)
        return flash_attention(
            q, k, v, causal, softmax_scale, alibi_slopes, window_size, False, "bshd", deterministic, softcap,
            dropout_p, seed, seed_offset,
        )  # fmt: skip
    plan = lookup(_PACKED_PLANS, _packed_key, _packed_plan, qkv, n_kv_heads, causal, softmax_scale, alibi_slopes,
                  window_size, deterministic, softcap, dropout_p)  # fmt: skip
    rng = dropout_rng(qkv.device, seed, seed_offset) if plan.forward.spec.dropout_p else None
    if plan.copy:
        qkv = qkv.contiguous()
    if torch.is_grad_enabled() and qkv.requires_grad:
        return _packed_apply(qkv, alibi_slopes, rng, plan)
    q, k, v = qkv.split(plan.split, dim=2)
    return plan.forward.forward(q, k, v, alibi_slopes, None, None, rng)[0]


_PACKED_PLANS = call_plan_cache()


def _packed_key(
    qkv, n_kv_heads, causal, softmax_scale, alibi_slopes, window_size, deterministic, softcap, dropout_p
) -> tuple:  # fmt: skip
    return (
        qkv.shape, qkv.stride(), qkv.dtype, qkv.device, not qkv.data_ptr() & 15, n_kv_heads, n_kv_heads.__class__,
        _slopes_key(alibi_slopes), *_option_key(causal, softmax_scale, window_size, deterministic, softcap, dropout_p),
    )  # fmt: skip


def _packed_plan(
    qkv, n_kv_heads, causal, softmax_scale, alibi_slopes, window_size, deterministic, softcap, dropout_p
) -> PackedPlan:  # fmt: skip
    split = _check_packed(qkv, n_kv_heads)
    q, k, v = qkv.split(split, dim=2)
    spec = _check_dense(
        q, k, v, causal, softmax_scale, alibi_slopes, window_size, "bshd", deterministic, softcap, dropout_p
    )
    copy = not addressable(qkv.stride(), 1)
    strides = contiguous_strides(qkv.shape) if copy else qkv.stride()
    views = call_plan((q, k, v), alibi_slopes, spec, strides=[strides] * 3)
    return PackedPlan(views.forward, split, copy, qkv.shape, (contiguous_strides(qkv.shape),) * 3)
