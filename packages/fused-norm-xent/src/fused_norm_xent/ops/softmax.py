"""Softmax / log-softmax: plans, launchers, autograd and functional API.

Per call, a launcher looks up one plan (cached per shape, strides, dim, options and device;
building it checks the arguments), allocates its output and calls the plan's Launch. The output
is contiguous along dim (the kernels' rows); x is read through its own strides when its other dims
merge into one row index, else from a contiguous copy.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .._runtime.launch import Launch
from .._runtime.registration import differentiable_op
from .._validation import cached_plan, check_device, check_dim, check_tensor, stand_in
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


def _rows_view(shape, strides, dim: int, n_rows: int, n_cols: int) -> Optional[Tuple[int, int]]:
    """(row stride, col stride) of a tensor with `dim` moved last, seen as (n_rows, n_cols)
    without a copy; None when no such view exists."""
    moved = torch.empty_strided(tuple(shape), tuple(strides), device="meta").movedim(dim, -1)
    try:
        return moved.view(n_rows, n_cols).stride()
    except RuntimeError:
        return None


def _dim_last_strides(shape, dim: int) -> Tuple[int, ...]:
    """Strides of a tensor of `shape` laid out contiguously with `dim` last in memory."""
    moved = list(shape)
    moved.append(moved.pop(dim))
    return torch.empty(moved, device="meta").movedim(-1, dim).stride()


def _launch(kernel, chunked_kernel, cfg: LaunchConfig, n_rows: int, n_cols: int, log: bool, **strides) -> Launch:
    if cfg.chunked:
        return Launch(chunked_kernel, (n_rows,), n_cols=n_cols, LOG=log, BLOCK_N=cfg.block_n,
                      num_warps=cfg.num_warps, **strides)  # fmt: skip
    return Launch(kernel, (-(-n_rows // cfg.block_m),), n_rows=n_rows, n_cols=n_cols, LOG=log, BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, **strides)  # fmt: skip


class SoftmaxPlan(NamedTuple):
    """One call's launch and allocation, for one key of shape, strides, dim, options and device."""

    launch: Optional[Launch]  # None for an empty tensor
    shape: torch.Size
    out_strides: Tuple[int, ...]  # contiguous with dim last in memory
    out_like_in: bool  # the input already has out_strides: empty_like keeps them
    rows: Optional[Tuple[int, int]]  # (rows, cols) of the copy to make when the input's strides do not map to rows
    dim: int  # in range


def _rows(t: Tensor, plan: SoftmaxPlan) -> Tensor:
    """The (rows, cols) copy of t with dim last, where its strides do not map to rows."""
    if plan.rows is None:
        return t
    return t.movedim(plan.dim, -1).reshape(plan.rows)


@functools.lru_cache(maxsize=1024)
def _forward_plan(shape, strides, dtype, device, dim, log) -> SoftmaxPlan:
    """The plan of a forward call; raises on invalid arguments (never cached then)."""
    check_tensor("x", stand_in((), dtype))
    dim = check_dim("dim", dim, len(shape))
    check_device(x=device)
    n_cols = shape[dim]
    n_rows = math.prod(shape) // n_cols if n_cols else 0
    out_strides = _dim_last_strides(shape, dim)
    launch = None
    if n_rows and n_cols:
        view = _rows_view(shape, strides, dim, n_rows, n_cols) or (n_cols, 1)
        launch = _launch(_softmax_fwd_kernel, _softmax_fwd_chunked_kernel, launch_config(n_cols), n_rows, n_cols,
                         log, stride_x_row=view[0], stride_x_col=view[1], stride_y_row=n_cols)  # fmt: skip
    return SoftmaxPlan(
        launch=launch,
        shape=torch.Size(shape),
        out_strides=out_strides,
        out_like_in=tuple(strides) == out_strides,
        rows=(n_rows, n_cols) if launch and _rows_view(shape, strides, dim, n_rows, n_cols) is None else None,
        dim=dim,
    )


def _empty_out(plan: SoftmaxPlan, like: Tensor, device) -> Tensor:
    if plan.out_like_in:
        return torch.empty_like(like)
    return torch.empty_strided(plan.shape, plan.out_strides, dtype=like.dtype, device=device)


def softmax_forward(x: Tensor, dim: int, log: bool) -> Tuple[Tensor]:
    """(y,): softmax or log-softmax of x along dim, x's shape and dtype, contiguous along dim."""
    device = x.device
    plan = cached_plan(_forward_plan, (x.shape, x.stride(), x.dtype, device, dim, log))
    y = _empty_out(plan, x, device)
    if plan.launch is not None:
        plan.launch(_rows(x, plan), y)
    return (y,)


def _softmax_forward_fake(x: Tensor, dim: int, log: bool) -> Tuple[Tensor]:
    dim = dim % max(x.dim(), 1)
    return (torch.empty_strided(x.shape, _dim_last_strides(x.shape, dim), dtype=x.dtype, device=x.device),)


@functools.lru_cache(maxsize=1024)
def _backward_plan(shape, dy_strides, device, dim, log) -> SoftmaxPlan:
    """The backward's plan; y (saved) and dx have the forward output's layout."""
    n_cols = shape[dim]
    n_rows = math.prod(shape) // n_cols if n_cols else 0
    out_strides = _dim_last_strides(shape, dim)
    launch = None
    dy_view = None
    if n_rows and n_cols:
        dy_view = _rows_view(shape, dy_strides, dim, n_rows, n_cols)
        stride_dy = dy_view or (n_cols, 1)
        launch = _launch(_softmax_bwd_kernel, _softmax_bwd_chunked_kernel, launch_config(n_cols), n_rows, n_cols,
                         log, stride_y_row=n_cols, stride_dy_row=stride_dy[0], stride_dy_col=stride_dy[1],
                         stride_dx_row=n_cols)  # fmt: skip
    return SoftmaxPlan(
        launch=launch,
        shape=torch.Size(shape),
        out_strides=out_strides,
        out_like_in=True,
        rows=(n_rows, n_cols) if launch and dy_view is None else None,
        dim=dim,
    )


def softmax_backward(y: Tensor, dy: Tensor, dim: int, log: bool) -> Tuple[Tensor]:
    """(dx,) from the forward's output y (dim normalized) and the upstream gradient dy (any strides)."""
    plan = _backward_plan(y.shape, dy.stride(), y.device, dim, log)
    dx = torch.empty_like(y)
    if plan.launch is not None:
        plan.launch(y, _rows(dy, plan), dx)
    return (dx,)


def _softmax_backward_fake(y: Tensor, dy: Tensor, dim: int, log: bool) -> Tuple[Tensor]:
    return (torch.empty_like(y),)


def _setup_context(ctx, inputs, output):
    x, dim, ctx.log = inputs
    ctx.dim = dim % x.dim()
    ctx.save_for_backward(output[0])


def _backward_rule(ctx, grads, backward, eager):
    (y,) = ctx.saved_tensors
    return backward(y, grads[0], ctx.dim, ctx.log)[0], None, None


SoftmaxFunction, _softmax_apply = differentiable_op(
    "fused_norm_xent::softmax",
    forward=softmax_forward,
    fake_forward=_softmax_forward_fake,
    backward=softmax_backward,
    fake_backward=_softmax_backward_fake,
    setup_context=_setup_context,
    backward_rule=_backward_rule,
    n_differentiable_outputs=1,
    differentiable_args=(0,),
)


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax of `x` along `dim`, differentiable.

    x: any shape, fp32/fp16/bf16, any strides, on a CUDA device (the CPU under TRITON_INTERPRET=1).
    Returns a tensor of x's shape and dtype; statistics are computed in fp32. Rows that are all
    -inf give NaN, as torch.softmax does.
    """
    if not isinstance(x, Tensor):
        check_tensor("x", x)
    return _softmax_apply(x, dim, False)[0]


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Log-softmax of `x` along `dim`, differentiable; same contract as `softmax`."""
    if not isinstance(x, Tensor):
        check_tensor("x", x)
    return _softmax_apply(x, dim, True)[0]
