"""TransformerEngine-compatible RoPE: launchers, operators, autograd Function, functional API.

`apply_rotary_pos_emb` has the semantics of TransformerEngine's `apply_rotary_pos_emb`
(formats sbhd / bshd / thd, partial rotary, interleaved pairs, start positions) in one fused
kernel for the forward and one for the backward (the transposed transform). The launchers
are registered as torch custom operators where torch has them, so torch.compile traces
through `RoPEFunction` without a graph break. A launch looks up the plan of its key (t's shape,
strides and dtype, freqs' layout, the options and the direction) once per call: an immutable
value holding the Launch with its grid and every argument fixed.
"""

import functools
import math
from typing import NamedTuple, Optional

import torch

from .. import _compat
from .._runtime.compat import custom_bwd, custom_fwd
from .._runtime.launch import Launch
from .._runtime.registration import custom_op, eager_function_apply
from .._runtime.validation import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_bool,
    check_device,
    check_ndim,
    check_optional_tensor,
    check_tensor,
)
from .._validation import check_rotary_dim, on_kernel_device
from ..kernels.rope import _rope_kernel
from ._layout import contiguous_strides, empty_contiguous
from .config import KernelChoice, kernel_choice, launch_config, reads_columns

TENSOR_FORMATS = ("sbhd", "bshd", "thd")
# Dims of t holding (sequence, batch, heads) per format (thd: tokens, -, heads).
_SEQ_BATCH_HEAD_DIMS = {"sbhd": (0, 1, 2), "bshd": (1, 0, 2), "thd": (0, None, 1)}

# Interleaved pairs are split in registers (one contiguous load) where Triton has tl.split;
# the portable path loads the two members with stride-2 loads. Chosen once, at import.
SPLIT_INTERLEAVED_PAIRS = _compat.HAS_SPLIT_JOIN


@functools.cache
def kernel_config(
    is_thd: bool, n_rows: int, d2: int, head_dim: int, element_size: int, interleaved: bool, split_pairs: bool,
    has_start: bool,
) -> KernelChoice:  # fmt: skip
    """The tiles, warps and compile-time arguments of _rope_kernel for rows of this shape (the forward
    and the backward share them, and their compiled kernel: the direction is a runtime argument)."""
    cfg = launch_config(n_rows, d2 // 2, head_dim - d2, element_size, True, 2 if split_pairs else 1)
    return kernel_choice(
        -(-n_rows // cfg.block_r), cfg.num_warps, HALF=d2 // 2, HEAD_DIM=head_dim, IS_THD=is_thd,
        HAS_START=has_start, INTERLEAVED=interleaved, SPLIT_PAIRS=split_pairs, BLOCK_R=cfg.block_r,
        BLOCK_P=cfg.block_p, BLOCK_PASS=cfg.block_pass,
    )  # fmt: skip


class RopePlan(NamedTuple):
    """One _rope_kernel call for one key of layouts and options: the launch, with its grid and every
    stride, size and compile-time argument fixed, and the copies its inputs need first."""

    launch: Optional[Launch]  # None when t is empty
    copy_t: bool  # t's columns are too far apart for the kernel's int32 column offsets
    copy_freqs: bool  # freqs' last dim is strided (the kernel reads it contiguous)


@functools.lru_cache(maxsize=1024)
def _plan(
    tensor_format: str, t_shape: torch.Size, t_stride: tuple, dtype: torch.dtype, d2: int, freqs_stride: tuple,
    interleaved: bool, has_start: bool, n_cu_seqlens: Optional[int], transpose: int,
) -> RopePlan:  # fmt: skip
    """The plan of a call on t of this shape, strides and dtype (checked by the caller) into a new
    contiguous tensor; n_cu_seqlens: cu_seqlens' length (thd), transpose: 1 for the backward."""
    if math.prod(t_shape) == 0:
        return RopePlan(None, False, False)
    head_dim = t_shape[-1]
    copy_t = not reads_columns(t_stride[-1], head_dim)
    if copy_t:
        t_stride = contiguous_strides(t_shape)
    copy_freqs = freqs_stride[-1] != 1
    stride_freqs_s = d2 if copy_freqs else freqs_stride[0]  # a contiguous (s2, 1, 1, d2) or (s2, d2) copy
    out_stride = contiguous_strides(t_shape)
    seq_dim, batch_dim, head_dim_index = _SEQ_BATCH_HEAD_DIMS[tensor_format]
    n_heads = t_shape[head_dim_index]
    if batch_dim is None:  # thd: one program per token, rows are its heads
        n_seqs = n_cu_seqlens - 1
        n_groups, n_batch_groups, n_rows = t_shape[0], 1, n_heads
        stride_t_b = stride_out_b = 0
    else:
        batch, n_seqs = t_shape[batch_dim], 0
        # With start positions each batch entry has its own angles: one batch entry per program.
        n_batch_groups = batch if has_start else 1
        n_groups, n_rows = t_shape[seq_dim] * n_batch_groups, n_heads * (batch // n_batch_groups)
        stride_t_b, stride_out_b = t_stride[batch_dim], out_stride[batch_dim]
    choice = kernel_config(
        batch_dim is None, n_rows, d2, head_dim, dtype.itemsize, interleaved, interleaved and SPLIT_INTERLEAVED_PAIRS,
        has_start,
    )  # fmt: skip
    launch = Launch(
        _rope_kernel, (n_groups, choice.n_row_blocks), num_warps=choice.num_warps,
        stride_t_s=t_stride[seq_dim], stride_t_b=stride_t_b, stride_t_h=t_stride[head_dim_index],
        stride_t_d=t_stride[-1], stride_out_s=out_stride[seq_dim], stride_out_b=stride_out_b,
        stride_out_h=out_stride[head_dim_index], stride_freqs_s=stride_freqs_s, n_batch_groups=n_batch_groups,
        n_heads=n_heads, n_rows=n_rows, n_seqs=n_seqs, search_steps=(n_seqs - 1).bit_length() if n_seqs else 0,
        transpose=transpose, **choice.constexprs,
    )  # fmt: skip
    return RopePlan(launch, copy_t, copy_freqs)


def _launch(
    t: torch.Tensor,
    freqs: torch.Tensor,
    start_positions: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    tensor_format: str,
    interleaved: bool,
    transpose: int,
) -> torch.Tensor:
    """One launch of _rope_kernel over t (checked by the caller); returns a new contiguous tensor
    (TransformerEngine's fused kernel allocates its output and its gradient contiguous, whatever
    the input's strides; the kernel reads any strides, so this costs nothing).

    freqs: (s2, 1, 1, d2) or (s2, d2) (the kernel steps by its stride(0) from one position to
    the next; a strided last dim is copied).
    """
    plan = _plan(
        tensor_format, t.shape, t.stride(), t.dtype, freqs.shape[-1], freqs.stride(), interleaved,
        start_positions is not None, None if cu_seqlens is None else cu_seqlens.shape[0], transpose,
    )  # fmt: skip
    out = empty_contiguous(t)
    if plan.launch is not None:
        if plan.copy_t:
            t = t.contiguous()
        if plan.copy_freqs:
            freqs = freqs.contiguous()
        # A pointer the kernel does not read (no start positions, not thd) is given t.
        plan.launch(
            t, freqs, out, t if start_positions is None else start_positions, t if cu_seqlens is None else cu_seqlens
        )
    return out


def _check_positions(
    t: torch.Tensor,
    freqs: torch.Tensor,
    start_positions: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    tensor_format: str,
) -> None:
    """Value checks of cu_seqlens / start_positions against t and freqs: one host sync.

    Only called when there are index tensors; without them the shapes say everything.
    """
    n_positions = freqs.shape[0]
    if tensor_format == "thd":
        cu = cu_seqlens.long()
        lengths = cu[1:] - cu[:-1]
        ends = lengths if start_positions is None else lengths + start_positions
        zero = cu.new_zeros(())
        first, last, min_length, max_end, min_start = torch.stack([
            cu[0], cu[-1],
            lengths.min() if lengths.numel() else zero,
            ends.max() if ends.numel() else zero,
            start_positions.min().long() if start_positions is not None else zero,
        ]).tolist()  # fmt: skip
        if first != 0:
            raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0]={first}")
        if last != t.shape[0]:
            raise ValueError(f"cu_seqlens ends at {last} but t has {t.shape[0]} tokens (dim 0 of thd)")
        if min_length < 0:
            raise ValueError("cu_seqlens must be non-decreasing (sequence lengths are cu_seqlens[i+1] - cu_seqlens[i])")
        what = (
            "a sequence's length plus its start position reaches" if start_positions is not None else "a sequence has"
        )
    else:
        if start_positions.numel() == 0:  # batch 0: no positions to check
            return
        seq_len = t.shape[0 if tensor_format == "sbhd" else 1]
        min_start, max_start = torch.stack([start_positions.min(), start_positions.max()]).tolist()
        max_end = seq_len + max_start
        what = f"the sequence length {seq_len} plus the largest start position reaches"
    if min_start < 0:
        raise ValueError(f"start_positions must be >= 0, got a minimum of {min_start}")
    if max_end > n_positions:
        raise ValueError(f"freqs has {n_positions} positions (dim 0) but {what} {max_end} positions")


def _fake_like_input(t: torch.Tensor, *args) -> torch.Tensor:
    return empty_contiguous(t)


@custom_op("fused_rope::rope_fwd", fake=_fake_like_input)
def rope_fwd(
    t: torch.Tensor,
    freqs: torch.Tensor,
    start_positions: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    tensor_format: str,
    interleaved: bool,
) -> torch.Tensor:
    """Forward launcher: checks the index tensors' values (one host sync, only if there are any)."""
    if start_positions is not None or cu_seqlens is not None:
        _check_positions(t, freqs, start_positions, cu_seqlens, tensor_format)
    return _launch(t, freqs, start_positions, cu_seqlens, tensor_format, interleaved, 0)


@custom_op("fused_rope::rope_bwd", fake=_fake_like_input)
def rope_bwd(
    grad: torch.Tensor,
    freqs: torch.Tensor,
    start_positions: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    tensor_format: str,
    interleaved: bool,
) -> torch.Tensor:
    """Backward launcher: the transposed transform of the gradient (the forward checked the indices)."""
    return _launch(grad, freqs, start_positions, cu_seqlens, tensor_format, interleaved, 1)


class RoPEFunction(torch.autograd.Function):
    """apply_rotary_pos_emb with its gradient; freqs and the index tensors get none (as in TE)."""

    @staticmethod
    @custom_fwd
    def forward(ctx, t, freqs, start_positions, cu_seqlens, tensor_format, interleaved):
        ctx.save_for_backward(freqs, start_positions, cu_seqlens)
        ctx.tensor_format, ctx.interleaved = tensor_format, interleaved
        return rope_fwd(t, freqs, start_positions, cu_seqlens, tensor_format, interleaved)

    @staticmethod
    @custom_bwd
    def backward(ctx, grad):
        freqs, start_positions, cu_seqlens = ctx.saved_tensors
        dt = rope_bwd(grad, freqs, start_positions, cu_seqlens, ctx.tensor_format, ctx.interleaved)
        return dt, None, None, None, None, None


_rope_apply = eager_function_apply(RoPEFunction)


def _check_rope_args(t, freqs, tensor_format, interleaved, cu_seqlens, start_positions) -> None:
    """Every check of apply_rotary_pos_emb, each attribute read once; the messages are built only on failure."""
    if not isinstance(t, torch.Tensor) or t.dtype not in FLOAT_DTYPES:
        check_tensor("t", t)
    if not isinstance(freqs, torch.Tensor) or freqs.dtype not in FLOAT_DTYPES:
        check_tensor("freqs", freqs)
    if tensor_format not in TENSOR_FORMATS:
        raise ValueError(f"tensor_format must be one of {', '.join(map(repr, TENSOR_FORMATS))}, got {tensor_format!r}")
    if interleaved is not False and interleaved is not True:
        if interleaved is None or isinstance(interleaved, torch.Tensor):
            # TE >= 2.2 takes start_positions fourth: such a positional call is refused, never reinterpreted.
            raise TypeError(
                f"interleaved (the fourth argument) must be a bool, got {type(interleaved).__name__}; "
                "TransformerEngine's fourth argument is start_positions: pass start_positions= by keyword"
            )
        check_bool("interleaved", interleaved)
    for name, index in (("cu_seqlens", cu_seqlens), ("start_positions", start_positions)):
        if index is not None and (not isinstance(index, torch.Tensor) or index.dtype not in INDEX_DTYPES):
            check_optional_tensor(name, index, INDEX_DTYPES)
    thd = tensor_format == "thd"
    t_shape, freqs_shape = t.shape, freqs.shape
    if len(t_shape) != (3 if thd else 4):
        layouts = {"sbhd": "(s, b, h, d)", "bshd": "(b, s, h, d)", "thd": "(total_tokens, h, d)"}
        check_ndim("t", t, (3,) if thd else (4,), f"{layouts[tensor_format]} for tensor_format={tensor_format!r}")
    if len(freqs_shape) == 4:
        if freqs_shape[1] != 1 or freqs_shape[2] != 1:
            raise ValueError(f"freqs must have shape (s2, 1, 1, d2), got {tuple(freqs_shape)}")
    elif len(freqs_shape) != 2:
        check_ndim("freqs", freqs, (4, 2), "(s2, 1, 1, d2) or (s2, d2)")
    d2, head_dim = freqs_shape[-1], t_shape[-1]
    if d2 % 2 or d2 == 0 or d2 > head_dim:
        check_rotary_dim("freqs", d2, head_dim, "t")
    if thd:
        if cu_seqlens is None:
            raise ValueError("cu_seqlens is required with tensor_format='thd'")
        if cu_seqlens.dim() != 1:
            check_ndim("cu_seqlens", cu_seqlens, (1,), "(n_seqs + 1,) cumulative sequence lengths")
        n_entries = cu_seqlens.shape[0] - 1
        if n_entries < 0:
            raise ValueError("cu_seqlens must have n_seqs + 1 >= 1 entries, got an empty tensor")
    else:
        if cu_seqlens is not None:
            raise ValueError(f"cu_seqlens is only used with tensor_format='thd', not {tensor_format!r}")
        seq_dim = 0 if tensor_format == "sbhd" else 1
        if freqs_shape[0] < t_shape[seq_dim]:
            raise ValueError(
                f"freqs has {freqs_shape[0]} positions (dim 0) but t has a sequence of {t_shape[seq_dim]} "
                f"(dim {seq_dim} of {tensor_format})"
            )
        n_entries = t_shape[1 - seq_dim]
    if start_positions is not None:
        if start_positions.dim() != 1:
            check_ndim("start_positions", start_positions, (1,), "one start per batch entry (sequence)")
        if start_positions.shape[0] != n_entries:
            entries = "sequences (cu_seqlens has n_seqs + 1 entries)"
            if not thd:
                entries = f"batch entries (dim {1 - seq_dim} of t)"
            raise ValueError(
                f"start_positions has {start_positions.shape[0]} entries but there are {n_entries} {entries}"
            )
    device = t.get_device()
    if not (
        on_kernel_device(t) and on_kernel_device(freqs) and freqs.get_device() == device
        and (cu_seqlens is None or (on_kernel_device(cu_seqlens) and cu_seqlens.get_device() == device))
        and (start_positions is None or (on_kernel_device(start_positions) and start_positions.get_device() == device))
    ):  # fmt: skip
        check_device(t=t, freqs=freqs, cu_seqlens=cu_seqlens, start_positions=start_positions)


def apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    interleaved: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    start_positions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Rotary position embedding of `t` by the angles `freqs`, TransformerEngine's semantics.

    t: (s, b, h, d) for "sbhd", (b, s, h, d) for "bshd", or (total_tokens, h, d) for "thd"
        (sequences packed along dim 0); fp32, fp16 or bf16; any strides.
    freqs: (s2, 1, 1, d2) (or (s2, d2)) angles, fp32 (fp16/bf16 are upcast), s2 >= the
        sequence length (a longer table is fine), d2 even and <= d. Column j of position p is
        the angle of column j of the token at position p (TE's RotaryPositionEmbedding gives
        cat(theta, theta) for rotate-half pairs and repeat_interleave(theta, 2) for interleaved
        ones). Columns d2..d of each head pass through unchanged.
    tensor_format: "sbhd", "bshd" or "thd".
    interleaved: pairs (2j, 2j+1) (GPT-J) instead of rotate-half (j, j + d2/2) (GPT-NeoX, LLaMA).
    cu_seqlens: "thd" only, required: (n_seqs + 1,) int32/int64 cumulative lengths from 0 to
        total_tokens; each sequence's positions start at 0.
    start_positions: optional (b,) (or (n_seqs,) for "thd") int32/int64: the positions of
        batch entry (sequence) i start at start_positions[i].

    Returns a new contiguous tensor of t's shape and dtype (as TE's fused path, whatever t's
    strides): t * cos(freqs) + rotate(t) * sin(freqs) on the first d2 columns, computed in fp32
    and rounded once. Differentiable in t (freqs gets no gradient, as in TE; the gradient is
    contiguous too). Bad arguments raise TypeError / ValueError before any launch; with
    cu_seqlens or start_positions their values are checked too (one host sync).
    """
    _check_rope_args(t, freqs, tensor_format, interleaved, cu_seqlens, start_positions)
    if torch.is_grad_enabled() and t.requires_grad:
        return _rope_apply(t, freqs, start_positions, cu_seqlens, tensor_format, interleaved)
    # Nothing to differentiate (inference, no_grad): the operator alone, no autograd node.
    return rope_fwd(t, freqs, start_positions, cu_seqlens, tensor_format, interleaved)
