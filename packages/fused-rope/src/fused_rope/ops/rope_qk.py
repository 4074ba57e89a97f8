"""Hugging Face / Liger-style RoPE of q and k in one launch: launchers, operators, Function, API.

`apply_rotary_qk(q, k, cos, sin)` computes HF's `q * cos + rotate_half(q) * sin` (and the same
for k) from precomputed tables, q and k of one token in the same launch, optionally in place.

The eager path is kept short because a RoPE launch is a few hundred microseconds of GPU time
at most: the checks read each attribute once; each launch looks its plan up in one cached call
(the Launch with its grid and every argument fixed, which calls the compiled kernel directly
after its first launch), allocates its outputs and launches; gradients are read in the layout
they arrive in (an expanded one is not copied); eager calls reach the launchers without the
operator dispatcher.
"""

import functools
from typing import NamedTuple, Optional, Tuple

import torch

from .._runtime.compat import custom_bwd, custom_fwd, is_compiling
from .._runtime.launch import Launch
from .._runtime.registration import custom_op, eager_function_apply
from .._runtime.validation import FLOAT_DTYPES, INDEX_DTYPES, check_bool, check_device, check_ndim, check_tensor
from .._validation import check_overwritable, check_rotary_dim, on_kernel_device
from ..kernels.rope_qk import _rope_qk_kernel
from ._layout import contiguous_strides, empty_contiguous, output_like, output_strides
from .config import KernelChoice, kernel_choice, launch_config, reads_columns

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
def kernel_config(
    n_q_heads: int, n_k_heads: int, d2: int, head_dim: int, element_size: int, in_place: bool, has_position_ids: bool,
) -> KernelChoice:  # fmt: skip
    """The tiles, warps and compile-time arguments of _rope_qk_kernel for heads of this shape (the
    forward into new tensors and the backward share them, and their compiled kernel).

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
    return kernel_choice(
        n_row_blocks, num_warps, HALF=d2 // 2, HEAD_DIM=head_dim, HAS_POSITION_IDS=has_position_ids,
        BLOCK_R=cfg.block_r, BLOCK_P=cfg.block_p, BLOCK_PASS=cfg.block_pass, QK_TOGETHER=together,
    )  # fmt: skip


def table_strides(shape: Tuple[int, ...], stride: Tuple[int, ...]) -> Tuple[int, int]:
    """(batch, position) strides of a (P, d2) or (Bc, P, d2) table; batch 0 where it broadcasts."""
    if len(stride) == 2 or shape[0] == 1:
        return 0, stride[-2]
    return stride[0], stride[1]


class QKPlan(NamedTuple):
    """One _rope_qk_kernel call for one key of layouts and options: the launch, with its grid and
    every stride, size and compile-time argument fixed, how the outputs are allocated and the
    copies the inputs need first."""

    launch: Optional[Launch]  # None when there are no tokens or no heads
    # New outputs as output_like: empty_like of q (k) where its last dim is contiguous, else contiguous.
    q_out_like_q: bool
    k_out_like_k: bool
    copies: bool  # an input needs a copy first (see _copy_inputs); rare


@functools.lru_cache(maxsize=1024)
def _plan(
    q_shape: torch.Size, q_stride: tuple, k_shape: Optional[torch.Size], k_stride: Optional[tuple],
    dtype: torch.dtype, table_shape: torch.Size, table_stride: tuple, sin_stride: tuple,
    position_batch: Optional[int], in_place: bool, transpose: int,
) -> QKPlan:  # fmt: skip
    """The plan of a call on q, k (checked by the caller; k None: q alone, as the in-place path's
    backward) with tables cos, sin of these layouts; position_batch: position_ids' dim 0 or None;
    in_place: the outputs are q and k themselves; transpose: 1 for the backward."""
    batch, n_q_heads, seq_len, head_dim = q_shape
    n_k_heads = 0 if k_shape is None else k_shape[1]
    q_out_like_q, k_out_like_k = q_stride[-1] == 1, k_stride is None or k_stride[-1] == 1
    if batch * seq_len == 0 or n_q_heads + n_k_heads == 0:
        return QKPlan(None, q_out_like_q, k_out_like_k, False)
    if in_place:
        if q_stride[-1] != 1 or (k_stride is not None and k_stride[-1] != 1):
            raise ValueError("inplace=True needs q and k with a contiguous last dim (stride 1)")
        q_out_stride, k_out_stride = q_stride, k_stride
    else:
        q_out_stride = output_strides(q_shape, q_stride, dtype)
        k_out_stride = None if k_shape is None else output_strides(k_shape, k_stride, dtype)
    copy_q = not reads_columns(q_stride[-1], head_dim)
    copy_k = k_stride is not None and not reads_columns(k_stride[-1], head_dim)
    copy_tables = table_stride[-1] != 1 or sin_stride != table_stride
    if copy_q:
        q_stride = contiguous_strides(q_shape)
    if copy_k:
        k_stride = contiguous_strides(k_shape)
    if copy_tables:
        table_stride = contiguous_strides(table_shape)
    if k_shape is None:  # q stands in for k and its output (no k program runs)
        k_stride, k_out_stride = q_stride, q_out_stride
    choice = kernel_config(
        n_q_heads, n_k_heads, table_shape[-1], head_dim, dtype.itemsize, in_place, position_batch is not None
    )
    stride_table_b, stride_table_s = table_strides(table_shape, table_stride)
    launch = Launch(
        _rope_qk_kernel, (batch * seq_len, choice.n_row_blocks), num_warps=choice.num_warps,
        stride_q_b=q_stride[0], stride_q_h=q_stride[1], stride_q_s=q_stride[2], stride_q_d=q_stride[3],
        stride_k_b=k_stride[0], stride_k_h=k_stride[1], stride_k_s=k_stride[2], stride_k_d=k_stride[3],
        stride_q_out_b=q_out_stride[0], stride_q_out_h=q_out_stride[1], stride_q_out_s=q_out_stride[2],
        stride_k_out_b=k_out_stride[0], stride_k_out_h=k_out_stride[1], stride_k_out_s=k_out_stride[2],
        stride_table_b=stride_table_b, stride_table_s=stride_table_s,
        stride_pos_b=0 if position_batch is None or position_batch == 1 else seq_len,
        seq_len=seq_len, n_q_heads=n_q_heads, n_k_heads=n_k_heads, transpose=transpose, **choice.constexprs,
    )  # fmt: skip
    return QKPlan(launch, q_out_like_q, k_out_like_k, copy_q or copy_k or copy_tables)


def _copy_inputs(q, k, cos, sin):
    """The copies a plan with `copies` asks for: q or k whose columns are too far apart for the
    kernel's int32 column offsets, cos and sin with a strided last dim or different strides."""
    head_dim = q.shape[-1]
    if not reads_columns(q.stride(-1), head_dim):
        q = q.contiguous()
    if k is not None and not reads_columns(k.stride(-1), head_dim):
        k = k.contiguous()
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    return q, k, cos, sin


def _launch(
    q: torch.Tensor,
    k: Optional[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: Optional[torch.Tensor],
    in_place: bool,
    transpose: int,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One launch of _rope_qk_kernel: (q_out, k_out) <- transform of q, k; q and k themselves when
    in_place, else new tensors (output_like). k may be None: q alone (k_out None).

    The kernel indexes cos and sin with one set of strides and position_ids as contiguous:
    unusual layouts of these small tensors are copied here, at run time (under torch.compile
    only here are the strides the real ones).
    """
    plan = _plan(
        q.shape, q.stride(), None if k is None else k.shape, None if k is None else k.stride(), q.dtype, cos.shape,
        cos.stride(), sin.stride(), None if position_ids is None else position_ids.shape[0], in_place, transpose,
    )  # fmt: skip
    if in_place:
        q_out, k_out = q, k
    else:
        q_out = torch.empty_like(q) if plan.q_out_like_q else empty_contiguous(q)
        k_out = None if k is None else torch.empty_like(k) if plan.k_out_like_k else empty_contiguous(k)
    if plan.launch is not None:
        if plan.copies:
            q, k, cos, sin = _copy_inputs(q, k, cos, sin)
        position_ids = q if position_ids is None else position_ids.contiguous()
        if k is None:
            plan.launch(q, q, cos, sin, position_ids, q_out, q_out)
        else:
            plan.launch(q, k, cos, sin, position_ids, q_out, k_out)
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
    return _launch(q, k, cos, sin, position_ids, False, 0)


def _fake_in_place(q, k, *args) -> None:
    return None


@custom_op("fused_rope::rope_qk_fwd_", fake=_fake_in_place, mutates_args=("q", "k"))
def rope_qk_fwd_(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> None:
    """Forward launcher in place: q and k (last dim contiguous) are overwritten."""
    _check_position_values(position_ids, cos)
    _launch(q, k, cos, sin, position_ids, True, 0)


@custom_op("fused_rope::rope_qk_bwd", fake=_fake_new)
def rope_qk_bwd(
    dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Backward launcher: the transposed transform of both gradients, into new tensors."""
    return _launch(dq, dk, cos, sin, position_ids, False, 1)


def _fake_one(dx, *args):
    return output_like(dx)


@custom_op("fused_rope::rope_qk_bwd_one", fake=_fake_one)
def rope_qk_bwd_one(
    dx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: Optional[torch.Tensor]
) -> torch.Tensor:
    """Backward launcher for one of q, k (the in-place path's gradients arrive one at a time)."""
    return _launch(dx, None, cos, sin, position_ids, False, 1)[0]


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


_rope_qk_apply = eager_function_apply(RoPEQKFunction)


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
        return _rope_qk_apply(q, k, cos, sin, position_ids)
    if is_compiling():
        # Dynamo before torch 2.13 drops ctx.mark_dirty (pytorch/pytorch#184113, fixed by
        # #184267): the gradient would skip the rotation when, as usual, the caller reads the
        # result through the buffer q and k are views of. Traced, the update is written as
        # what AOTAutograd makes of any in-place op anyway: new tensors copied back.
        q_out, k_out = _rope_qk_apply(q, k, cos, sin, position_ids)
        return q.copy_(q_out), k.copy_(k_out)
    q = RoPEQKInplaceFunction.apply(q, k, cos, sin, position_ids)
    return q, _RotatedInPlace.apply(k, cos, sin, position_ids)
