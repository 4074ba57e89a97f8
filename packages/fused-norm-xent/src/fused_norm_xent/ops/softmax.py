"""Softmax / log-softmax launchers, autograd Function and functional API."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .._compat import custom_bwd, custom_fwd
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


@dataclass(frozen=True)
class LaunchConfig:
    chunked: bool
    block_m: int
    block_n: int
    num_warps: int


@functools.cache
def launch_config(n_cols: int) -> LaunchConfig:
    """Block shape and warps for rows of `n_cols`; the same rule for forward and backward.

    Cached, and plain integer arithmetic: triton.next_power_of_2 / triton.cdiv cost microseconds
    per call on Triton 3.x, which a memory-bound kernel on small rows cannot afford.
    """
    if n_cols > MAX_SINGLE_BLOCK_COLS:
        return LaunchConfig(chunked=True, block_m=1, block_n=CHUNK_COLS, num_warps=8)
    block_n = 1 << (n_cols - 1).bit_length()
    block_m = max(1, min(ELEMENTS_PER_PROGRAM // block_n, 64))
    # About 16 fp32 elements per thread: enough loads in flight, no register spills.
    num_warps = max(1, min(block_m * block_n // 512, 16))
    return LaunchConfig(chunked=False, block_m=block_m, block_n=block_n, num_warps=num_warps)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def softmax_fwd(x: torch.Tensor, log: bool) -> torch.Tensor:
    """(rows, cols) view, any strides -> contiguous softmax or log-softmax of each row."""
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    cfg = launch_config(n_cols)
    if cfg.chunked:
        _softmax_fwd_chunked_kernel[(n_rows,)](
            x, y, x.stride(0), x.stride(1), y.stride(0), n_cols,
            LOG=log, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        )  # fmt: skip
    else:
        _softmax_fwd_kernel[(_cdiv(n_rows, cfg.block_m),)](
            x, y, x.stride(0), x.stride(1), y.stride(0), n_rows, n_cols,
            LOG=log, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        )  # fmt: skip
    return y


def softmax_bwd(y: torch.Tensor, dy: torch.Tensor, log: bool) -> torch.Tensor:
    """Gradient of softmax_fwd: y contiguous (rows, cols), dy any strides -> contiguous dx."""
    n_rows, n_cols = y.shape
    dx = torch.empty_like(y)
    if dx.numel() == 0:
        return dx
    cfg = launch_config(n_cols)
    if cfg.chunked:
        _softmax_bwd_chunked_kernel[(n_rows,)](
            y, dy, dx, y.stride(0), dy.stride(0), dy.stride(1), dx.stride(0), n_cols,
            LOG=log, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        )  # fmt: skip
    else:
        _softmax_bwd_kernel[(_cdiv(n_rows, cfg.block_m),)](
            y, dy, dx, y.stride(0), dy.stride(0), dy.stride(1), dx.stride(0), n_rows, n_cols,
            LOG=log, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
        )  # fmt: skip
    return dx


def _as_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """(..., n) view with `dim` last, flattened to (rows, n); a copy only when no view exists."""
    moved = x if dim == x.dim() - 1 else x.movedim(dim, -1)
    return moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1])


def _from_rows(rows: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
    if dim == like.dim() - 1:
        return rows.view(like.shape)
    return rows.view(like.movedim(dim, -1).shape).movedim(-1, dim)


class SoftmaxFunction(torch.autograd.Function):
    """softmax or log-softmax along `dim`; saves only the output for backward."""

    @staticmethod
    @custom_fwd
    def forward(ctx, x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
        y = _from_rows(softmax_fwd(_as_rows(x, dim), log), x, dim)
        ctx.save_for_backward(y)
        ctx.dim, ctx.log = dim, log
        return y

    @staticmethod
    @custom_bwd
    def backward(ctx, dy: torch.Tensor):
        (y,) = ctx.saved_tensors
        dx = softmax_bwd(_as_rows(y, ctx.dim), _as_rows(dy, ctx.dim), ctx.log)
        return _from_rows(dx, y, ctx.dim), None, None


def _checked_dim(x: torch.Tensor, dim: int) -> int:
    check_tensor("x", x)
    dim = check_dim("dim", dim, x.dim())
    check_device(x=x)
    return dim


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax of `x` along `dim`, differentiable.

    x: any shape, fp32/fp16/bf16, any strides, on a CUDA device (the CPU under TRITON_INTERPRET=1).
    Returns a tensor of x's shape and dtype; statistics are computed in fp32. Rows that are all
    -inf give NaN, as torch.softmax does.
    """
    return SoftmaxFunction.apply(x, _checked_dim(x, dim), False)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Log-softmax of `x` along `dim`, differentiable; same contract as `softmax`."""
    return SoftmaxFunction.apply(x, _checked_dim(x, dim), True)
