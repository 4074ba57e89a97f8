"""Hugging Face / Liger-style RoPE of q and k in one launch: launchers, operators, Function, API.

`apply_rotary_qk(q, k, cos, sin)` computes HF's `q * cos + rotate_half(q) * sin` (and the same
for k) from precomputed tables, q and k of one token in the same launch, optionally in place.
"""

import functools
from typing import Any, Dict, Optional, Tuple

import torch
import triton

from .._compat import custom_bwd, custom_fwd, custom_op
from .._validation import (
    check_bool,
    check_device,
    check_ndim,
    check_optional_index,
    check_rotary_dim,
    check_tensor,
)
from ..kernels.rope_qk import _rope_qk_kernel
from ._layout import output_like, unit_last_stride
from .config import launch_config


def _table_strides(table: torch.Tensor) -> Tuple[int, int]:
    """(batch, position) strides of a (P, d2) or (Bc, P, d2) table; 0 where it broadcasts."""
    stride = table.stride()
    if len(stride) == 2 or table.shape[0] == 1:
        return 0, stride[-2]
    return stride[0], stride[1]


@functools.cache
def launch_meta(
    n_heads: int, d2: int, head_dim: int, element_size: int, in_place: bool, has_position_ids: bool, transpose: bool
) -> Dict[str, Any]:
    """The compile-time arguments and num_warps of one _rope_qk_kernel launch (cached per shape).

    n_heads: the larger of q's and k's head counts (one BLOCK_R for both).
    """
    cfg = launch_config(n_heads, d2 // 2, head_dim - d2, element_size, not in_place, 0)
    return dict(
        HALF=d2 // 2, HEAD_DIM=head_dim, HAS_POSITION_IDS=has_position_ids, TRANSPOSE=transpose,
        COPY_PASS=cfg.copy_pass, BLOCK_R=cfg.block_r, BLOCK_P=cfg.block_p, BLOCK_PASS=cfg.block_pass,
        num_warps=cfg.num_warps,
    )  # fmt: skip


def _launch(q, k, cos, sin, position_ids, q_out, k_out, transpose: bool) -> None:
    """One launch of _rope_qk_kernel: q_out, k_out (which may be q, k) <- transform of q, k.

    k and k_out may be None: q alone (the in-place backward treats q and k one at a time).
    """
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_k_heads = 0 if k is None else k.shape[1]
    if batch * seq_len == 0 or n_q_heads + n_k_heads == 0:
        return
    if k is None:
        k = k_out = q[:, :0]
    cos, sin = unit_last_stride(cos), unit_last_stride(sin)
    meta = launch_meta(
        max(n_q_heads, n_k_heads), cos.shape[-1], head_dim, q.element_size(), q_out is q, position_ids is not None,
        transpose,
    )  # fmt: skip
    n_q_blocks = triton.cdiv(n_q_heads, meta["BLOCK_R"])
    grid = (batch * seq_len, n_q_blocks + triton.cdiv(n_k_heads, meta["BLOCK_R"]))
    if position_ids is None:
        pos_strides = (0, 0)
    else:
        pos_strides = position_ids.stride()
        pos_strides = (0 if position_ids.shape[0] == 1 else pos_strides[0], pos_strides[1])
    _rope_qk_kernel[grid](
        q, k, cos, sin, q if position_ids is None else position_ids, q_out, k_out,
        *q.stride()[:3], *k.stride()[:3], *q_out.stride()[:3], *k_out.stride()[:3],
        *_table_strides(cos), *_table_strides(sin), *pos_strides,
        seq_len, n_q_heads, n_k_heads, n_q_blocks,
        **meta,
    )  # fmt: skip


def _launch_new(q, k, cos, sin, position_ids, transpose: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    q_out, k_out = output_like(q), output_like(k)
    _launch(unit_last_stride(q), unit_last_stride(k), cos, sin, position_ids, q_out, k_out, transpose)
    return q_out, k_out


def _check_position_values(position_ids: Optional[torch.Tensor], cos: torch.Tensor) -> None:
    """0 <= position_ids < the table length: one host sync, only when position_ids is given."""
    if position_ids is None or position_ids.numel() == 0:
        return
    low, high = torch.stack([position_ids.min(), position_ids.max()]).tolist()
    if low < 0 or high >= cos.shape[-2]:
        raise ValueError(
            f"position_ids must be in [0, {cos.shape[-2]}) (the table length, dim -2 of cos), "
            f"got values in [{low}, {high}]"
        )


def _fake_new(q, k, *args):
    return output_like(q), output_like(k)


@custom_op("fused_rope::rope_qk_fwd", fake=_fake_new)
def rope_qk_fwd(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward launcher into new tensors (position_ids' values checked first)."""
    _check_position_values(position_ids, cos)
    return _launch_new(q, k, cos, sin, position_ids, False)


def _fake_in_place(q, k, *args) -> None:
    return None


@custom_op("fused_rope::rope_qk_fwd_", fake=_fake_in_place, mutates_args=("q", "k"))
def rope_qk_fwd_(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> None:
    """Forward launcher in place: q and k (last dim contiguous) are overwritten."""
    _check_position_values(position_ids, cos)
    _launch(q, k, cos, sin, position_ids, q, k, False)


@custom_op("fused_rope::rope_qk_bwd", fake=_fake_new)
def rope_qk_bwd(
    dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Backward launcher: the transposed transform of both gradients, into new tensors."""
    return _launch_new(dq, dk, cos, sin, position_ids, True)


def _fake_one(dx, *args):
    return output_like(dx)


@custom_op("fused_rope::rope_qk_bwd_one", fake=_fake_one)
def rope_qk_bwd_one(
    dx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> torch.Tensor:
    """Backward launcher for one of q, k (the in-place path's gradients arrive one at a time)."""
    dx_in = output_like(dx)
    _launch(unit_last_stride(dx), None, cos, sin, position_ids, dx_in, None, True)
    return dx_in


class RoPEQKFunction(torch.autograd.Function):
    """apply_rotary_qk into new tensors, with its gradient; cos, sin, position_ids get none (as in Liger)."""

    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, cos, sin, position_ids):
        ctx.save_for_backward(cos, sin, position_ids)
        return rope_qk_fwd(q, k, cos, sin, position_ids)

    @staticmethod
    @custom_bwd
    def backward(ctx, dq, dk):
        dq, dk = rope_qk_bwd(dq, dk, *ctx.saved_tensors)
        return dq, dk, None, None, None


class RoPEQKInplaceFunction(torch.autograd.Function):
    """apply_rotary_qk in place: one launch rotates q and k; returns q, declared modified.

    Autograd lets a Function that modifies a view in place (q and k usually are views: of a
    fused qkv output, or transposed) return only that one tensor, so k's update is declared
    right after by _RotatedInPlace, which launches nothing. Each backward is one launch.
    """

    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, cos, sin, position_ids):
        rope_qk_fwd_(q, k, cos, sin, position_ids)
        ctx.mark_dirty(q)
        ctx.save_for_backward(cos, sin, position_ids)
        return q

    @staticmethod
    @custom_bwd
    def backward(ctx, dq):
        return rope_qk_bwd_one(dq, *ctx.saved_tensors), None, None, None, None


class _RotatedInPlace(torch.autograd.Function):
    """Declares that x was rotated in place by RoPEQKInplaceFunction's launch."""

    @staticmethod
    @custom_fwd
    def forward(ctx, x, cos, sin, position_ids):
        ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin, position_ids)
        return x

    @staticmethod
    @custom_bwd
    def backward(ctx, dx):
        return rope_qk_bwd_one(dx, *ctx.saved_tensors), None, None, None


def _check_qk_args(q, k, cos, sin, position_ids, inplace) -> None:
    for name, x in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        check_tensor(name, x)
    if k.dtype != q.dtype:
        raise TypeError(f"k has dtype {k.dtype} but q has {q.dtype}; they must match")
    if sin.dtype != cos.dtype:
        raise TypeError(f"sin has dtype {sin.dtype} but cos has {cos.dtype}; they must match")
    check_optional_index("position_ids", position_ids)
    check_bool("inplace", inplace)
    check_ndim("q", q, (4,), "(batch, heads, seq, head_dim)")
    check_ndim("k", k, (4,), "(batch, kv_heads, seq, head_dim)")
    batch, _, seq_len, head_dim = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq_len, head_dim):
        raise ValueError(
            f"k has shape {tuple(k.shape)} but q has {tuple(q.shape)}: "
            "batch, seq and head_dim (dims 0, 2, 3) must match"
        )
    check_ndim("cos", cos, (2, 3), "(positions, d2) or (batch or 1, positions, d2)")
    if sin.shape != cos.shape:
        raise ValueError(f"sin has shape {tuple(sin.shape)} but cos has {tuple(cos.shape)}; they must match")
    if cos.dim() == 3 and cos.shape[0] not in (1, batch):
        raise ValueError(f"cos has batch dim {cos.shape[0]} (dim 0); it must be 1 or q's batch {batch}")
    check_rotary_dim("cos", cos.shape[-1], head_dim, "q and k")
    if position_ids is None:
        if cos.shape[-2] < seq_len:
            raise ValueError(f"cos has {cos.shape[-2]} positions (dim -2) but q has a sequence of {seq_len} (dim 2)")
    else:
        check_ndim("position_ids", position_ids, (2,), "(batch or 1, seq)")
        if position_ids.shape[0] not in (1, batch) or position_ids.shape[1] != seq_len:
            raise ValueError(
                f"position_ids has shape {tuple(position_ids.shape)}; "
                f"it must be ({batch} or 1, {seq_len}) (q's batch, seq)"
            )
    if inplace:
        if q.stride(-1) != 1 or k.stride(-1) != 1:
            raise ValueError("inplace=True needs q and k with a contiguous last dim (stride 1)")
        for name, x in (("q", q), ("k", k)):
            if x.is_leaf and x.requires_grad and torch.is_grad_enabled():
                raise ValueError(f"inplace=True cannot overwrite {name}: it is a leaf tensor that requires grad")
    check_device(q=q, k=k, cos=cos, sin=sin, position_ids=position_ids)


def apply_rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: Optional[torch.Tensor] = None,
    inplace: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of q and k in one launch, Hugging Face / Liger-Kernel semantics.

    q: (batch, heads, seq, head_dim); k: (batch, kv_heads, seq, head_dim) (GQA/MQA: any head
        counts); fp32, fp16 or bf16, the same dtype; any strides (a q.transpose(1, 2) view of
        (batch, seq, heads, head_dim) memory costs no copy and its result keeps that layout).
    cos, sin: (batch or 1, positions, d2) or (positions, d2), any float dtype, the same shape;
        d2 even and <= head_dim (partial rotary: columns d2.. pass through). Without
        position_ids the token at sequence index s uses table row s (positions >= seq).
    position_ids: optional (batch or 1, seq) int32/int64: the token at (b, s) uses table row
        position_ids[b, s] (legacy HF `cos[position_ids]`); values are checked (one host sync).
    inplace: overwrite q and k (needs their last dim contiguous) instead of new tensors.

    Rotate-half pairs (j, j + d2/2): out = x * cos + rotate_half(x) * sin per head, each
    column with its own table entry, computed in fp32 and rounded once. Returns (q_out, k_out)
    (q and k themselves when inplace). Differentiable in q and k; cos, sin get no gradient.
    """
    _check_qk_args(q, k, cos, sin, position_ids, inplace)
    if not inplace:
        return RoPEQKFunction.apply(q, k, cos, sin, position_ids)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        q = RoPEQKInplaceFunction.apply(q, k, cos, sin, position_ids)
        return q, _RotatedInPlace.apply(k, cos, sin, position_ids)
    # Nothing to differentiate: the in-place operator alone (Dynamo traces ctx.mark_dirty only
    # where autograd records the Function).
    rope_qk_fwd_(q, k, cos, sin, position_ids)
    return q, k
