"""Cross-entropy launchers, autograd and functional API.

How the gradient is produced depends on the reduction:
- "mean" / "sum": the forward computes the logits gradient in the same kernel as the loss (the
  row is re-read from L2, not from memory) for an upstream gradient of 1, into a new buffer or,
  with inplace_backward, into the logits buffer itself. The backward multiplies it by the actual
  upstream gradient with a kernel that exits at once when that gradient is 1 (a plain
  loss.backward()), so the common step costs one read and one write of the logits in all. The
  rows of ignored targets keep their zeros there, whatever the upstream gradient (NaN, inf).
- "none": the upstream gradient differs per row, so the forward saves the logits and the fp32
  log-sum-exp of each row and the backward computes the gradient (into the logits buffer with
  inplace_backward).

Targets are checked by a small kernel (rows not ignored, lowest and highest label) whose result
the host reads to raise on a label outside [0, V). The host read waits for the GPU, but it is
issued after the cross-entropy kernels are queued (before them only when the forward writes into
the logits), so the GPU is never left idle by it; the mean's divisor is read from the device.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import _compat
from .._autograd import differentiable_op
from .._compat import INTERPRETING, autocast_dtype, is_compiling, mark_modified, sm_count
from .._validation import (
    check_choice,
    check_device,
    check_float,
    check_int,
    check_shape,
    check_target,
    check_tensor,
)
from ..kernels.cross_entropy import _cross_entropy_kernel, _loss_finalize_kernel, _scale_kernel, _target_stats_kernel

REDUCTIONS = ("mean", "sum", "none")
# Widest chunk of a row one program reads per step (16 KB of bf16); narrower rows share programs.
MAX_BLOCK_N = 8192
ELEMENTS_PER_TILE = 4096
CE_PROGRAMS_PER_SM = 2
# The in-place scaling kernel: tile shape and warps, and programs per SM.
SCALE_TILE = (4, 1024)
SCALE_PROGRAMS_PER_SM = 8
# Targets per program of the statistics kernel, and the partial sums per step of the finalizing one.
STATS_BLOCK = 4096
FINALIZE_BLOCK = 256


class CrossEntropyConfig(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int


@functools.cache
def cross_entropy_config(n_cols: int) -> CrossEntropyConfig:
    """Rows of up to 8192 classes share a program (one chunk); wider rows stream 8192 at a time."""
    block_n = min(1 << max(n_cols - 1, 0).bit_length(), MAX_BLOCK_N)
    block_m = max(1, min(ELEMENTS_PER_TILE // block_n, 64))
    return CrossEntropyConfig(block_m, block_n, max(1, min(block_m * block_n // 512, 16)))


@functools.lru_cache(maxsize=1024)
def cross_entropy_programs(n_rows: int, n_cols: int, device_index: int) -> int:
    """Persistent grid: CE_PROGRAMS_PER_SM row tiles in flight per SM (for 50k-wide bf16 rows,
    26 MB of rows being read twice), fewer when there are fewer tiles."""
    tiles = -(-n_rows // cross_entropy_config(n_cols).block_m)
    return max(1, min(tiles, sm_count(device_index) * CE_PROGRAMS_PER_SM))


class TargetStats(NamedTuple):
    """Per block of targets: (rows not ignored, lowest label, highest label), on the device, and
    the same on the host once `ready` has completed (a pinned copy in flight on CUDA)."""

    device: Tensor
    host: Optional[Tensor]
    ready: Optional[torch.cuda.Event]


def target_counts(target: Tensor, ignore_index: int) -> Tensor:
    """The statistics kernel's (blocks, 3) int64 result over the (N,) targets, on the device."""
    n_blocks = max(1, -(-target.shape[0] // STATS_BLOCK))
    stats = torch.empty((n_blocks, 3), dtype=torch.int64, device=target.device)
    _target_stats_kernel[(n_blocks,)](target, stats, target.stride(0), target.shape[0], ignore_index, BLOCK=STATS_BLOCK)
    return stats


def target_stats(target: Tensor, ignore_index: int) -> TargetStats:
    """Launch the statistics kernel over the (N,) targets and start copying its result to the host
    (not while a CUDA graph is being captured: there is no host read then, and no label check)."""
    stats = target_counts(target, ignore_index)
    n_blocks = stats.shape[0]
    if INTERPRETING:
        return TargetStats(stats, stats, None)
    if torch.cuda.is_current_stream_capturing():
        return TargetStats(stats, None, None)
    host = torch.empty((n_blocks, 3), dtype=torch.int64, pin_memory=True)
    host.copy_(stats, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return TargetStats(stats, host, ready)


def check_target_range(stats: TargetStats, n_classes: int, ignore_index: int) -> None:
    """Wait for the statistics (a host synchronization) and raise ValueError if a label that is
    not ignore_index is outside [0, n_classes). Nothing to check under CUDA-graph capture."""
    if stats.host is None:
        return
    if stats.ready is not None:
        stats.ready.synchronize()
    blocks = stats.host.tolist()
    low, high = min(block[1] for block in blocks), max(block[2] for block in blocks)
    if low < 0 or high >= n_classes:
        raise ValueError(
            f"target holds class index {low if low < 0 else high}, outside [0, {n_classes}) "
            f"and not ignore_index={ignore_index}"
        )


def launch_cross_entropy(
    logits: Tensor,
    target: Tensor,
    stats: Optional[Tensor],
    *,
    grad: Optional[Tensor] = None,
    loss_rows: Optional[Tensor] = None,
    z_loss_rows: Optional[Tensor] = None,
    partial: Optional[Tensor] = None,
    lse: Tensor,
    row_scale: Optional[Tensor] = None,
    mean: bool = False,
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    programs: Optional[int] = None,
) -> None:
    """One launch of the cross-entropy kernel on (rows, classes) logits (any strides).

    loss_rows or partial given: pass 1 computes the losses and lse, into loss_rows (and
    z_loss_rows) per row, or summed into partial ((programs, 2) fp64, one (loss, z-loss) pair per
    program); else lse is read. grad given: pass 2 writes the gradient (times 1 / the number of
    valid rows in `stats`, target_stats' device tensor, if mean; times row_scale[row] if given);
    grad may be logits itself.
    programs: the persistent grid (default: by size); with partial, every program writes its pair.
    """
    n_rows, n_cols = logits.shape
    if programs is None:
        if n_rows == 0:
            return
        programs = cross_entropy_programs(n_rows, n_cols, logits.device.index or 0)
    cfg = cross_entropy_config(n_cols)
    compute_loss = loss_rows is not None or partial is not None
    mean_scale = mean and grad is not None
    stats = stats if mean_scale else None
    _cross_entropy_kernel[(programs,)](
        logits, target, grad, loss_rows, z_loss_rows, partial, lse, row_scale, stats,
        *logits.stride(), *((0, 0) if grad is None else grad.stride()),
        target.stride(0), 0 if row_scale is None else row_scale.stride(0),
        n_rows, n_cols, 0 if stats is None else stats.shape[0], ignore_index, label_smoothing, lse_square_scale, 1.0,
        COMPUTE_LOSS=compute_loss, REDUCE=partial is not None, STORE_Z_LOSS=z_loss_rows is not None,
        COMPUTE_GRAD=grad is not None, MEAN_SCALE=mean_scale, HAS_SMOOTHING=label_smoothing != 0.0,
        HAS_Z_LOSS=lse_square_scale != 0.0, HAS_ROW_SCALE=row_scale is not None, PREFETCH=_compat.PREFETCH_CHUNKS,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
    )  # fmt: skip


def finalize_loss(partial: Tensor, stats: Tensor, loss: Tensor, z_loss: Optional[Tensor], mean: bool) -> None:
    """loss (and z_loss) = the sum of the fp64 partial pairs, over the valid rows if mean."""
    _loss_finalize_kernel[(1,)](
        partial, stats if mean else None, loss, z_loss, partial.shape[0], stats.shape[0] if mean else 0,
        MEAN=mean, STORE_Z_LOSS=z_loss is not None, BLOCK_P=FINALIZE_BLOCK, num_warps=4,
    )  # fmt: skip


def scale_(
    x: Tensor, scale: Tensor, *, target: Optional[Tensor] = None, stats: Optional[Tensor] = None, ignore_index: int = 0
) -> None:
    """x *= scale in place (x 2-D, any strides; scale a one-element tensor), free when scale is 1.

    x is a gradient for an upstream 1 that ignored rows do not reach; those keep their part of it
    whatever the scale (NaN, inf). Pass one of: target ((rows,): row i of x belongs to target i),
    whose ignore_index rows keep their values; stats (target_counts' result, when x sums over the
    rows), with which x is left as it is when no row is valid.
    """
    n_rows, n_cols = x.shape
    if x.numel() == 0:
        return
    block_m, block_n = SCALE_TILE
    tiles = -(-n_rows // block_m) * -(-n_cols // block_n)
    programs = min(tiles, sm_count(x.device.index or 0) * SCALE_PROGRAMS_PER_SM)
    _scale_kernel[(programs,)](
        x, scale, target, stats, *x.stride(), 0 if target is None else target.stride(0), n_rows, n_cols,
        0 if stats is None else stats.shape[0], ignore_index, ROW_TARGETS=target is not None, BLOCK_M=block_m,
        BLOCK_N=block_n, num_warps=8,
    )  # fmt: skip


def keep_ignored_rows(grad: Tensor, scaled: Tensor, target: Tensor, ignore_index: int) -> Tensor:
    """scaled (grad times the upstream gradient) with the rows of ignored targets taken from grad:
    scale_ with a target, in torch ops (for the compiled backward)."""
    return torch.where((target == ignore_index).unsqueeze(-1), grad, scaled)


def loss_dtype_for(dtype: torch.dtype, device_type: str) -> torch.dtype:
    """The loss's dtype: fp32 under autocast (as F.cross_entropy, which autocast runs in fp32),
    else the dtype of the logits (or of the linear layer's compute)."""
    return torch.float32 if autocast_dtype(device_type) is not None else dtype


def _empty(like: Tensor, dtype: torch.dtype) -> Tensor:
    return torch.empty(0, dtype=dtype, device=like.device)


def _alloc_forward(logits, reduction, return_z_loss, grad_in_forward, loss_dtype):
    n_rows = logits.shape[0]
    loss_shape = (n_rows,) if reduction == "none" else ()
    loss = torch.empty(loss_shape, dtype=loss_dtype, device=logits.device)
    z_loss = torch.empty(loss_shape, dtype=loss_dtype, device=logits.device) if return_z_loss else None
    z_loss = _empty(logits, loss_dtype) if z_loss is None else z_loss
    lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    grad = torch.empty_like(logits) if grad_in_forward else _empty(logits, logits.dtype)
    return loss, z_loss, lse, grad


def cross_entropy_forward(
    logits: Tensor,
    target: Tensor,
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    reduction: str,
    return_z_loss: bool,
    compute_grad: bool,
    inplace: bool,
    loss_dtype: torch.dtype,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, z_loss, lse, grad) of (rows, classes) logits.

    grad: the logits gradient for an upstream gradient of 1 when compute_grad and the reduction is
    "mean" or "sum" (empty when inplace: it is in the logits buffer then), else empty. z_loss is
    empty unless return_z_loss. lse: fp32 per row. loss and z_loss in loss_dtype.
    """
    n_rows, n_cols = logits.shape
    stats = target_stats(target, ignore_index)
    grad_in_forward = compute_grad and reduction != "none"
    writes_logits = grad_in_forward and inplace
    if writes_logits:  # nothing may touch the caller's logits before the labels are known to be good
        check_target_range(stats, n_cols, ignore_index)
    loss, z_loss, lse, grad = _alloc_forward(
        logits, reduction, return_z_loss, grad_in_forward and not inplace, loss_dtype
    )
    reduce = reduction != "none"
    programs = cross_entropy_programs(n_rows, n_cols, logits.device.index or 0)
    partial = torch.empty((programs, 2), dtype=torch.float64, device=logits.device) if reduce else None
    if n_rows:
        launch_cross_entropy(
            logits, target, stats.device, grad=(logits if inplace else grad) if grad_in_forward else None,
            loss_rows=None if reduce else loss, z_loss_rows=z_loss if return_z_loss and not reduce else None,
            partial=partial, lse=lse, mean=reduction == "mean", ignore_index=ignore_index,
            label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, programs=programs,
        )  # fmt: skip
    elif reduce:
        partial.zero_()
    if reduce:
        finalize_loss(partial, stats.device, loss, z_loss if return_z_loss else None, reduction == "mean")
    if writes_logits:
        mark_modified(logits)
    else:
        check_target_range(stats, n_cols, ignore_index)
    return loss, z_loss, lse, grad


def _cross_entropy_forward_fake(
    logits, target, ignore_index, label_smoothing, lse_square_scale, reduction, return_z_loss, compute_grad, inplace,
    loss_dtype,
):  # fmt: skip
    grad_in_forward = compute_grad and reduction != "none" and not inplace
    return _alloc_forward(logits, reduction, return_z_loss, grad_in_forward, loss_dtype)


def cross_entropy_backward(
    grad_loss: Tensor,
    grad: Tensor,
    logits: Optional[Tensor],
    target: Optional[Tensor],
    lse: Optional[Tensor],
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
) -> None:
    """Writes the logits gradient into `grad`.

    With logits, target and lse (reduction "none"): grad = d loss / d logits * grad_loss[row].
    Without (mean / sum): grad already holds the gradient for an upstream 1; it is scaled by the
    one-element grad_loss in place, but for the rows of ignored targets.
    """
    if logits is None:
        scale_(grad, grad_loss.reshape(1), target=target, ignore_index=ignore_index)
        return
    launch_cross_entropy(
        logits, target, None, grad=grad, lse=lse, row_scale=grad_loss, ignore_index=ignore_index,
        label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
    )  # fmt: skip


def _cross_entropy_backward_fake(grad_loss, grad, logits, target, lse, ignore_index, label_smoothing, lse_square_scale):
    return None


def _setup_context(ctx, inputs, output):
    logits, target, ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale, reduction, _, _, inplace, _ = inputs
    _, _, lse, grad = output
    ctx.per_row = reduction == "none"
    ctx.inplace = inplace
    if ctx.per_row:
        ctx.save_for_backward(logits, target, lse)
    elif inplace:
        # The gradient lives in the logits buffer, whose version the forward bumped: kept as a plain
        # reference, not a saved tensor.
        ctx.grad_buffer = logits
        ctx.save_for_backward(target)
    else:
        ctx.save_for_backward(grad, target)


def _backward_rule(ctx, grads, backward, eager):
    grad_loss = grads[0]
    if ctx.per_row:
        logits, target, lse = ctx.saved_tensors
        grad = logits if ctx.inplace else torch.empty_like(logits)
        backward(grad_loss, grad, logits, target, lse, ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale)
    elif eager:
        grad, target = (ctx.grad_buffer, *ctx.saved_tensors) if ctx.inplace else ctx.saved_tensors
        backward(grad_loss, grad, None, target, None, ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale)
    else:
        grad, target = ctx.saved_tensors
        grad = keep_ignored_rows(grad, grad * grad_loss, target, ctx.ignore_index)
    if ctx.inplace:
        # A new alias of the logits buffer: nothing else holds it, so autograd hands it on (or makes
        # it a leaf's .grad) as it is instead of copying the (N, V) buffer.
        grad = grad.detach()
    return (grad, *([None] * 9))


CrossEntropyFunction, _cross_entropy_apply = differentiable_op(
    "cross_entropy",
    forward=cross_entropy_forward,
    fake_forward=_cross_entropy_forward_fake,
    backward=cross_entropy_backward,
    fake_backward=_cross_entropy_backward_fake,
    setup_context=_setup_context,
    backward_rule=_backward_rule,
    n_differentiable_outputs=1,
    differentiable_args=(0,),
    backward_mutates=("grad",),
)


def check_loss_options(ignore_index, reduction, label_smoothing, lse_square_scale) -> Tuple[float, float]:
    check_int("ignore_index", ignore_index)
    check_choice("reduction", reduction, REDUCTIONS)
    label_smoothing = check_float("label_smoothing", label_smoothing, 0.0, 1.0)
    lse_square_scale = check_float("lse_square_scale", lse_square_scale, 0.0, float("inf"), include_high=False)
    return label_smoothing, lse_square_scale


def cross_entropy(
    logits: Tensor,
    target: Tensor,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    lse_square_scale: float = 0.0,
    return_z_loss: bool = False,
    inplace_backward: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Cross-entropy of class logits against class indices, differentiable (F.cross_entropy).

    logits: (N, V) or (V,), fp32/fp16/bf16, any strides, V up to any size (rows stream in chunks).
    target: (N,) or (), int64 or int32 class indices in [0, V), or ignore_index.
    weight: class weights are not supported (must be None).
    reduction: "mean" (over the rows not ignored; NaN when all are, as torch), "sum" or "none".
    label_smoothing: in [0, 1], as torch. lse_square_scale: z-loss coefficient, adds
    lse_square_scale * logsumexp(row)^2 to each row's loss.
    return_z_loss: also return the z-loss part (reduced the same way; its gradient flows
    through the loss, the returned z-loss is for logging).
    inplace_backward: write the logits gradient into the logits buffer instead of a new one (no
    (N, V) allocation). The logits then hold the gradient: with reduction "mean" or "sum" from
    this call on (the gradient is computed in the forward), with "none" after the backward. Use
    it only when nothing else reads the logits (their autograd version is bumped, so a backward
    that saved them raises). Ignored while torch.compile traces.
    Returns the loss (and the z-loss) computed in fp32 (sums in fp64), in the logits' dtype, or in
    fp32 under torch.autocast as F.cross_entropy.
    A non-ignored target outside [0, V) raises ValueError (one host synchronization, which waits
    for a small kernel queued before the cross-entropy: the GPU is not left idle by it), before
    the logits are written when inplace_backward.
    """
    check_tensor("logits", logits)
    check_target("target", target)
    if weight is not None:
        raise ValueError("weight: class weights are not supported (pass None)")
    label_smoothing, lse_square_scale = check_loss_options(ignore_index, reduction, label_smoothing, lse_square_scale)
    if logits.dim() not in (1, 2) or logits.shape[-1] == 0:
        raise ValueError(
            f"logits has shape {tuple(logits.shape)}; expected (N, V) or (V,) with V >= 1 (flatten leading dims; "
            "torch's (N, V, d1, ...) layout is not supported)"
        )
    check_shape("target", target, logits.shape[:-1], "logits' shape without the class dim")
    check_device(logits=logits, target=target)
    unbatched = logits.dim() == 1
    if unbatched:
        logits, target = logits.unsqueeze(0), target.unsqueeze(0)
    compute_grad = logits.requires_grad and torch.is_grad_enabled()
    loss, z_loss, _, _ = _cross_entropy_apply(
        logits, target, ignore_index, label_smoothing, lse_square_scale, reduction, return_z_loss, compute_grad,
        inplace_backward and not is_compiling(), loss_dtype_for(logits.dtype, logits.device.type),
    )  # fmt: skip
    if unbatched and reduction == "none":
        loss, z_loss = loss.squeeze(0), (z_loss.squeeze(0) if return_z_loss else z_loss)
    return (loss, z_loss) if return_z_loss else loss
