"""Hugging Face / Liger-style RoPE of q and k in one launch: launchers, operators, Function, API.

`apply_rotary_qk(q, k, cos, sin)` computes HF's `q * cos + rotate_half(q) * sin` (and the same
for k) from precomputed tables, q and k of one token in the same launch, optionally in place.

The eager path is kept short because a RoPE launch is a few hundred microseconds of GPU time
at most and the host path of a forward plus backward was once longer than both kernels:
the checks read each attribute once, each launch looks its whole plan up in one cached call,
and eager calls reach the launchers without the operator dispatcher.
"""

import functools
from typing import Optional, Tuple

import torch

from .._compat import custom_bwd, custom_fwd, custom_op, is_compiling
from .._validation import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_bool,
    check_device,
    check_ndim,
    check_overwritable,
    check_rotary_dim,
    check_tensor,
    on_kernel_device,
)
from ..kernels.rope_qk import _rope_qk_kernel
from ._layout import output_like, unit_last_stride
from .config import LaunchPlan, launch_config, launch_plan_for
from .launch import KernelLaunches

_rope_qk_launches = KernelLaunches(_rope_qk_kernel)

# Tiles of the HF-style kernel (H100, Triton 3.6, bf16 q, k (4, 4096, H, D) forward): whole token
# rows do best, q's and k's in one program: (H, D) = (32, 512) takes 0.728 ms with 32-row tiles
# of q and k together under 16 warps against 0.799 with 16-row tiles of one tensor under 8
# (Liger 0.729); (32, 256) 0.362 vs 0.364; (32, 128) 0.184 either way; (64, 128) 0.361 vs
# 0.363. So tiles of up to 32 KiB per tensor, up to 16 warps. With 2 KiB per tensor (8 heads
# of 128) separate programs are better (0.0504 ms against 0.0530 together): q and k share a
# program from 4 KiB per tensor up.
QK_TILE_BYTES = 32768
QK_MAX_WARPS = 16
QK_TOGETHER_MIN_BYTES = 4096


@functools.cache
def launch_plan(
    n_q_heads: int, n_k_heads: int, d2: int, head_dim: int, element_size: int, in_place: bool, has_position_ids: bool,
) -> LaunchPlan:  # fmt: skip
    """Everything about one _rope_qk_kernel launch that the shape decides (cached per shape; the
    forward into new tensors and the backward share it, and their compiled kernel).

    One BLOCK_R for q and k, from the larger head count; q and k in one program (with twice the
    warps: twice the tile) when each fits one tile of at least QK_TOGETHER_MIN_BYTES.
    """
    n_heads = max(n_q_heads, n_k_heads)
    cfg = launch_config(
        n_heads, d2 // 2, head_dim - d2, element_size, not in_place, 0, QK_TILE_BYTES, QK_MAX_WARPS
    )  # fmt: skip
    together = n_k_heads > 0 and cfg.block_r >= n_heads and cfg.block_r * cfg.row_bytes >= QK_TOGETHER_MIN_BYTES
    if together:
        n_row_blocks, num_warps = 1, min(QK_MAX_WARPS, 2 * cfg.num_warps)
    else:
        n_row_blocks, num_warps = -(-n_q_heads // cfg.block_r) - (-n_k_heads // cfg.block_r), cfg.num_warps
    meta = dict(
        HALF=d2 // 2, HEAD_DIM=head_dim, HAS_POSITION_IDS=has_position_ids, BLOCK_R=cfg.block_r,
        BLOCK_P=cfg.block_p, BLOCK_PASS=cfg.block_pass, QK_TOGETHER=together, num_warps=num_warps,
    )  # fmt: skip
    return launch_plan_for(_rope_qk_kernel, n_row_blocks, meta)


def table_strides(cos: torch.Tensor) -> Tuple[int, int]:
    """(batch, position) strides of a (P, d2) or (Bc, P, d2) table; batch 0 where it broadcasts."""
    stride = cos.stride()
    if len(stride) == 2 or cos.shape[0] == 1:
        return 0, stride[-2]
    return stride[0], stride[1]


def _launch(q, k, cos, sin, position_ids, q_out, k_out, transpose: int) -> None:
    """One launch of _rope_qk_kernel: q_out, k_out (which may be q, k) <- transform of q, k.

    q, k: last dim contiguous. k and k_out may be None: q alone (the in-place backward treats q
    and k one at a time). The kernel indexes cos and sin with one set of strides and
    position_ids as contiguous: unusual layouts of these small tensors are copied here, at run
    time (under torch.compile only here are the strides the real ones).
    """
    cos_stride = cos.stride()
    if cos_stride[-1] != 1 or sin.stride() != cos_stride:
        cos, sin = cos.contiguous(), sin.contiguous()
    batch, n_q_heads, seq_len, head_dim = q.shape
    n_tokens = batch * seq_len
    if k is None:
        k = k_out = q
        n_k_heads = 0
    else:
        n_k_heads = k.shape[1]
    if n_tokens == 0 or n_q_heads + n_k_heads == 0:
        return
    plan = launch_plan(
        n_q_heads, n_k_heads, cos.shape[-1], head_dim, q.element_size(), q_out is q, position_ids is not None
    )
    if position_ids is None:
        position_ids, stride_pos_b = q, 0
    else:
        position_ids = position_ids.contiguous()
        stride_pos_b = 0 if position_ids.shape[0] == 1 else seq_len
    stride_q, stride_k, stride_q_out, stride_k_out = q.stride(), k.stride(), q_out.stride(), k_out.stride()
    _rope_qk_launches(
        plan, (n_tokens, plan.n_row_blocks), (q, k, cos, sin, position_ids, q_out, k_out),
        (*stride_q[:3], *stride_k[:3], *stride_q_out[:3], *stride_k_out[:3], *table_strides(cos), stride_pos_b),
        (seq_len, n_q_heads, n_k_heads, transpose),
    )  # fmt: skip


def _launch_new(q, k, cos, sin, position_ids, transpose: int) -> Tuple[torch.Tensor, torch.Tensor]:
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
    return _launch_new(q, k, cos, sin, position_ids, 0)


def _fake_in_place(q, k, *args) -> None:
    return None


@custom_op("fused_rope::rope_qk_fwd_", fake=_fake_in_place, mutates_args=("q", "k"))
def rope_qk_fwd_(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> None:
    """Forward launcher in place: q and k (last dim contiguous) are overwritten."""
    _check_position_values(position_ids, cos)
    _launch(q, k, cos, sin, position_ids, q, k, 0)


@custom_op("fused_rope::rope_qk_bwd", fake=_fake_new)
def rope_qk_bwd(
    dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Backward launcher: the transposed transform of both gradients, into new tensors."""
    return _launch_new(dq, dk, cos, sin, position_ids, 1)


def _fake_one(dx, *args):
    return output_like(dx)


@custom_op("fused_rope::rope_qk_bwd_one", fake=_fake_one)
def rope_qk_bwd_one(
    dx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> torch.Tensor:
    """Backward launcher for one of q, k (the in-place path's gradients arrive one at a time)."""
    dx_in = output_like(dx)
    _launch(unit_last_stride(dx), None, cos, sin, position_ids, dx_in, None, 1)
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
    """Every check of apply_rotary_qk, each attribute read once; the messages are built only on failure."""
    for name, x in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES:
            check_tensor(name, x)
    if k.dtype != q.dtype:
        raise TypeError(f"k has dtype {k.dtype} but q has {q.dtype}; they must match")
    if sin.dtype != cos.dtype:
        raise TypeError(f"sin has dtype {sin.dtype} but cos has {cos.dtype}; they must match")
    if position_ids is not None:
        if not isinstance(position_ids, torch.Tensor) or position_ids.dtype not in INDEX_DTYPES:
            check_tensor("position_ids", position_ids, INDEX_DTYPES)
    if inplace is not False and inplace is not True:
        check_bool("inplace", inplace)
    q_shape, k_shape, cos_shape = q.shape, k.shape, cos.shape
    if len(q_shape) != 4:
        check_ndim("q", q, (4,), "(batch, heads, seq, head_dim)")
    if len(k_shape) != 4:
        check_ndim("k", k, (4,), "(batch, kv_heads, seq, head_dim)")
    batch, _, seq_len, head_dim = q_shape
    if k_shape[0] != batch or k_shape[2] != seq_len or k_shape[3] != head_dim:
        raise ValueError(
            f"k has shape {tuple(k_shape)} but q has {tuple(q_shape)}: "
            "batch, seq and head_dim (dims 0, 2, 3) must match"
        )
    if len(cos_shape) not in (2, 3):
        check_ndim("cos", cos, (2, 3), "(positions, d2) or (batch or 1, positions, d2)")
    if sin.shape != cos_shape:
        raise ValueError(f"sin has shape {tuple(sin.shape)} but cos has {tuple(cos_shape)}; they must match")
    if len(cos_shape) == 3 and cos_shape[0] != 1 and cos_shape[0] != batch:
        raise ValueError(f"cos has batch dim {cos_shape[0]} (dim 0); it must be 1 or q's batch {batch}")
    d2 = cos_shape[-1]
    if d2 % 2 or d2 == 0 or d2 > head_dim:
        check_rotary_dim("cos", d2, head_dim, "q and k")
    if position_ids is None:
        if cos_shape[-2] < seq_len:
            raise ValueError(f"cos has {cos_shape[-2]} positions (dim -2) but q has a sequence of {seq_len} (dim 2)")
    else:
        pos_shape = position_ids.shape
        if len(pos_shape) != 2:
            check_ndim("position_ids", position_ids, (2,), "(batch or 1, seq)")
        if (pos_shape[0] != 1 and pos_shape[0] != batch) or pos_shape[1] != seq_len:
            raise ValueError(
                f"position_ids has shape {tuple(pos_shape)}; it must be ({batch} or 1, {seq_len}) (q's batch, seq)"
            )
    if inplace:
        if q.stride(-1) != 1 or k.stride(-1) != 1:
            raise ValueError("inplace=True needs q and k with a contiguous last dim (stride 1)")
        if torch.is_grad_enabled():
            for name, x in (("q", q), ("k", k)):
                if x.requires_grad and x.is_leaf:
                    raise ValueError(f"inplace=True cannot overwrite {name}: it is a leaf tensor that requires grad")
    device = q.get_device()
    if not (
        on_kernel_device(q) and on_kernel_device(k) and on_kernel_device(cos) and on_kernel_device(sin)
        and k.get_device() == device and cos.get_device() == device and sin.get_device() == device
        and (position_ids is None or (on_kernel_device(position_ids) and position_ids.get_device() == device))
    ):  # fmt: skip
        check_device(q=q, k=k, cos=cos, sin=sin, position_ids=position_ids)
    if inplace:
        if q is k:
            raise ValueError("q and k are the same tensor: an in-place update would rotate it twice; use inplace=False")
        if not is_compiling():  # it reads data pointers, which a traced call does not have
            check_overwritable(q, k)


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
    inplace: overwrite q and k instead of new tensors; needs their last dim contiguous and no
        element of q or k sharing memory with another (q is not k, no overlapping or expanded
        views), as torch's in-place ops require: checked from data pointers and strides.

    Rotate-half pairs (j, j + d2/2): out = x * cos + rotate_half(x) * sin per head, each
    column with its own table entry, computed in fp32 and rounded once. Returns (q_out, k_out)
    (q and k themselves when inplace). Differentiable in q and k; cos, sin get no gradient.
    """
    _check_qk_args(q, k, cos, sin, position_ids, inplace)
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)):
        # Nothing to differentiate (inference, no_grad): the operators alone, no autograd node.
        if inplace:
            rope_qk_fwd_(q, k, cos, sin, position_ids)
            return q, k
        return rope_qk_fwd(q, k, cos, sin, position_ids)
    if not inplace:
        return RoPEQKFunction.apply(q, k, cos, sin, position_ids)
    if is_compiling():
        # Dynamo before torch 2.13 drops ctx.mark_dirty (pytorch/pytorch#184113, fixed by
        # #184267): the gradient would skip the rotation when, as usual, the caller reads the
        # result through the buffer q and k are views of. Traced, the update is written as
        # what AOTAutograd makes of any in-place op anyway: new tensors copied back.
        q_out, k_out = RoPEQKFunction.apply(q, k, cos, sin, position_ids)
        return q.copy_(q_out), k.copy_(k_out)
    q = RoPEQKInplaceFunction.apply(q, k, cos, sin, position_ids)
    return q, _RotatedInPlace.apply(k, cos, sin, position_ids)
