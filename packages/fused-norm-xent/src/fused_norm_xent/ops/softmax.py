"""Softmax / log-softmax launchers, autograd and functional API."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Tuple

import torch
from torch import Tensor

from .._autograd import differentiable_op
from .._validation import check_device, check_dim, check_tensor
from ..kernels.softmax import (
    _softmax_bwd_chunked_kernel,
    _softmax_bwd_kernel,
    _softmax_fwd_chunked_kernel,
    _softmax_fwd_kernel,
)

# Widest row one block holds: beyond it a row streams through BLOCK_N chunks (two reads).
MAX_SINGLE_BLOCK_COLS = 16384
CHUNK_COLS = 4096
# Elements a program handles when rows are narrow: several rows share one program.
ELEMENTS_PER_PROGRAM = 4096


class LaunchConfig(NamedTuple):
    chunked: bool
    block_m: int
    block_n: int
    num_warps: int


@functools.cache
def launch_config(n_cols: int) -> LaunchConfig:
    """Block shape and warps for rows of `n_cols`; the same rule for forward and backward."""
    if n_cols > MAX_SINGLE_BLOCK_COLS:
        return LaunchConfig(chunked=True, block_m=1, block_n=CHUNK_COLS, num_warps=8)
    block_n = 1 << max(n_cols - 1, 0).bit_length()
    block_m = max(1, min(ELEMENTS_PER_PROGRAM // block_n, 64))
    # About 16 fp32 elements per thread: enough loads in flight, no register spills.
    num_warps = max(1, min(block_m * block_n // 512, 16))
    return LaunchConfig(chunked=False, block_m=block_m, block_n=block_n, num_warps=num_warps)


def _launch_fwd(x: Tensor, y: Tensor, log: bool) -> None:
    """Softmax of each row of the (rows, cols) view x (any strides) into contiguous y."""
    n_rows, n_cols = x.shape
    if y.numel() == 0:
        return
    cfg = launch_config(n_cols)
    if cfg.chunked:
        _softmax_fwd_chunked_kernel[(n_rows,)](
            x, y, x.stride(0), x.stride(1), y.stride(0), n_cols,
            LOG=log, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        )  # fmt: skip
    else:
        _softmax_fwd_kernel[((n_rows + cfg.block_m - 1) // cfg.block_m,)](
            x, y, x.stride(0), x.stride(1), y.stride(0), n_rows, n_cols,
            LOG=log, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        )  # fmt: skip


def _launch_bwd(y: Tensor, dy: Tensor, dx: Tensor, log: bool) -> None:
    """Gradient of _launch_fwd: y contiguous (rows, cols), dy any strides, into contiguous dx."""
    n_rows, n_cols = y.shape
    if dx.numel() == 0:
        return
    cfg = launch_config(n_cols)
    if cfg.chunked:
        _softmax_bwd_chunked_kernel[(n_rows,)](
            y, dy, dx, y.stride(0), dy.stride(0), dy.stride(1), dx.stride(0), n_cols,
            LOG=log, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        )  # fmt: skip
    else:
        _softmax_bwd_kernel[((n_rows + cfg.block_m - 1) // cfg.block_m,)](
            y, dy, dx, y.stride(0), dy.stride(0), dy.stride(1), dx.stride(0), n_rows, n_cols,
            LOG=log, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        )  # fmt: skip


def _as_rows(x: Tensor, dim: int) -> Tensor:
    """(rows, n) view with `dim` last; a copy only when no such view exists."""
    if dim != x.dim() - 1:
        x = x.movedim(dim, -1)
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1]) if x.dim() != 2 else x


def _empty_rows_like(x: Tensor, dim: int) -> Tuple[Tensor, Tensor]:
    """A contiguous (rows, n) buffer and its view in x's shape (dim last in memory)."""
    moved_shape = list(x.shape)
    moved_shape.append(moved_shape.pop(dim))
    rows = torch.empty(moved_shape, dtype=x.dtype, device=x.device)
    shaped = rows if dim == x.dim() - 1 else rows.movedim(-1, dim)
    flat = rows.view(math.prod(moved_shape[:-1]), moved_shape[-1]) if rows.dim() != 2 else rows
    return flat, shaped


def softmax_forward(x: Tensor, dim: int, log: bool) -> Tuple[Tensor]:
    """(y,): softmax or log-softmax of x along dim, x's shape and dtype, contiguous along dim."""
    y_rows, y = _empty_rows_like(x, dim)
    _launch_fwd(_as_rows(x, dim), y_rows, log)
    return (y,)


def _softmax_forward_fake(x: Tensor, dim: int, log: bool) -> Tuple[Tensor]:
    return (_empty_rows_like(x, dim)[1],)


def softmax_backward(y: Tensor, dy: Tensor, dim: int, log: bool) -> Tuple[Tensor]:
    """(dx,) from the forward's output y and the upstream gradient dy (any strides)."""
    dx_rows, dx = _empty_rows_like(y, dim)
    _launch_bwd(_as_rows(y, dim), _as_rows(dy, dim), dx_rows, log)
    return (dx,)


def _softmax_backward_fake(y: Tensor, dy: Tensor, dim: int, log: bool) -> Tuple[Tensor]:
    return (_empty_rows_like(y, dim)[1],)


def _setup_context(ctx, inputs, output):
    _, ctx.dim, ctx.log = inputs
    ctx.save_for_backward(output[0])


def _backward_rule(ctx, grads, backward, eager):
    (y,) = ctx.saved_tensors
    return backward(y, grads[0], ctx.dim, ctx.log)[0], None, None


SoftmaxFunction, _softmax_apply = differentiable_op(
    "softmax",
    forward=softmax_forward,
    fake_forward=_softmax_forward_fake,
    backward=softmax_backward,
    fake_backward=_softmax_backward_fake,
    setup_context=_setup_context,
    backward_rule=_backward_rule,
    n_differentiable_outputs=1,
    differentiable_args=(0,),
)


def _checked_dim(x: Tensor, dim: int) -> int:
    check_tensor("x", x)
    dim = check_dim("dim", dim, x.dim())
    check_device(x=x)
    return dim


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax of `x` along `dim`, differentiable.

    x: any shape, fp32/fp16/bf16, any strides, on a CUDA device (the CPU under TRITON_INTERPRET=1).
    Returns a tensor of x's shape and dtype; statistics are computed in fp32. Rows that are all
    -inf give NaN, as torch.softmax does.
    """
    return _softmax_apply(x, _checked_dim(x, dim), False)[0]


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Log-softmax of `x` along `dim`, differentiable; same contract as `softmax`."""
    return _softmax_apply(x, _checked_dim(x, dim), True)[0]
