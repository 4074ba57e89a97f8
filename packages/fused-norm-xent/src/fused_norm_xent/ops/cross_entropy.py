"""Cross-entropy launchers, autograd and functional API.

How the gradient is produced depends on the reduction:
- "mean" / "sum": the forward computes the logits gradient in the same kernel as the loss (the
  row is re-read from L2, not from memory) for an upstream gradient of 1, into a new buffer or,
  with inplace_backward, into the logits buffer itself. The backward multiplies it by the actual
  upstream gradient with a kernel that exits at once when that gradient is 1 (a plain
  loss.backward()), so the common step costs one read and one write of the logits in all.
- "none": the upstream gradient differs per row, so the forward saves the logits and the fp32
  log-sum-exp of each row and the backward computes the gradient (into the logits buffer with
  inplace_backward).
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import _compat
from .._autograd import differentiable_op
from .._compat import is_compiling, mark_modified, sm_count
from .._validation import (
    check_choice,
    check_device,
    check_float,
    check_int,
    check_shape,
    check_target,
    check_tensor,
)
from ..kernels.cross_entropy import _cross_entropy_kernel, _scale_kernel

REDUCTIONS = ("mean", "sum", "none")
# Widest chunk of a row one program reads per step (16 KB of bf16); narrower rows share programs.
MAX_BLOCK_N = 8192
ELEMENTS_PER_TILE = 4096
CE_PROGRAMS_PER_SM = 2
# The in-place scaling kernel: tile shape and warps, and programs per SM.
SCALE_TILE = (4, 1024)
SCALE_PROGRAMS_PER_SM = 8


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
def _programs(n_rows: int, block_m: int, device_index: int) -> int:
    """Persistent grid: CE_PROGRAMS_PER_SM row tiles in flight per SM (for 50k-wide bf16 rows,
    26 MB of rows being read twice: the second read stays in the 50 MB L2)."""
    return max(1, min(-(-n_rows // block_m), sm_count(device_index) * CE_PROGRAMS_PER_SM))


def count_valid_targets(target: Tensor, n_classes: int, ignore_index: int) -> int:
    """Number of targets other than ignore_index; raises ValueError if any of those is outside
    [0, n_classes). One host synchronization, before any launch."""
    if target.numel() == 0:
        return 0
    ignored = target == ignore_index
    low, high = torch.aminmax(target.masked_fill(ignored, 0))
    low, high, n_ignored = torch.stack((low.long(), high.long(), ignored.sum())).tolist()
    if low < 0 or high >= n_classes:
        raise ValueError(
            f"target holds class index {low if low < 0 else high}, outside [0, {n_classes}) "
            f"and not ignore_index={ignore_index}"
        )
    return target.numel() - n_ignored


def launch_cross_entropy(
    logits: Tensor,
    target: Tensor,
    grad: Optional[Tensor],
    loss_rows: Optional[Tensor],
    lse: Tensor,
    z_loss_rows: Optional[Tensor],
    row_scale: Optional[Tensor],
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    grad_scale: float,
) -> None:
    """One launch of the kernel on (rows, classes) logits (any strides).

    loss_rows given: pass 1 writes loss_rows, lse (and z_loss_rows); else lse is read.
    grad given: pass 2 writes the gradient times grad_scale (times row_scale[row] if given);
    grad may be logits itself.
    """
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    cfg = cross_entropy_config(n_cols)
    compute_loss = loss_rows is not None
    _cross_entropy_kernel[(_programs(n_rows, cfg.block_m, logits.device.index or 0),)](
        logits, target, grad, loss_rows, lse, z_loss_rows, row_scale,
        logits.stride(0), logits.stride(1),
        0 if grad is None else grad.stride(0), 0 if grad is None else grad.stride(1),
        target.stride(0), 0 if row_scale is None else row_scale.stride(0),
        n_rows, n_cols, ignore_index, label_smoothing, lse_square_scale, grad_scale,
        COMPUTE_LOSS=compute_loss, COMPUTE_GRAD=grad is not None, HAS_SMOOTHING=label_smoothing != 0.0,
        HAS_Z_LOSS=lse_square_scale != 0.0 and (compute_loss or grad is not None), HAS_ROW_SCALE=row_scale is not None,
        PREFETCH=_compat.PREFETCH_CHUNKS, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
    )  # fmt: skip


def scale_(x: Tensor, scale: Tensor) -> None:
    """x *= scale in place (x 2-D, any strides; scale a one-element tensor), free when scale is 1."""
    n_rows, n_cols = x.shape
    if x.numel() == 0:
        return
    block_m, block_n = SCALE_TILE
    tiles = -(-n_rows // block_m) * -(-n_cols // block_n)
    programs = min(tiles, sm_count(x.device.index or 0) * SCALE_PROGRAMS_PER_SM)
    _scale_kernel[(programs,)](
        x, scale, x.stride(0), x.stride(1), n_rows, n_cols, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=8
    )


def _empty(like: Tensor) -> Tensor:
    return torch.empty(0, dtype=like.dtype, device=like.device)


def _alloc_forward(logits, reduction, return_z_loss, grad_in_forward):
    n_rows = logits.shape[0]
    loss_shape = (n_rows,) if reduction == "none" else ()
    loss = torch.empty(loss_shape, dtype=logits.dtype, device=logits.device)
    z_loss = torch.empty(loss_shape, dtype=logits.dtype, device=logits.device) if return_z_loss else _empty(logits)
    lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    grad = torch.empty_like(logits) if grad_in_forward else _empty(logits)
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
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, z_loss, lse, grad) of (rows, classes) logits.

    grad: the logits gradient for an upstream gradient of 1 when compute_grad and the reduction is
    "mean" or "sum" (empty when inplace: it is in the logits buffer then), else empty. z_loss is
    empty unless return_z_loss. lse: fp32 per row.
    """
    n_rows, n_cols = logits.shape
    n_valid = count_valid_targets(target, n_cols, ignore_index)
    grad_in_forward = compute_grad and reduction != "none"
    loss, z_loss, lse, grad = _alloc_forward(logits, reduction, return_z_loss, grad_in_forward and not inplace)
    if reduction == "none":
        loss_rows, z_rows = loss, (z_loss if return_z_loss else None)
    else:
        loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        z_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device) if return_z_loss else None
    if return_z_loss and lse_square_scale == 0.0:
        z_rows.zero_()
    divisor = n_valid if reduction == "mean" else 1
    launch_cross_entropy(
        logits, target, (logits if inplace else grad) if grad_in_forward else None, loss_rows, lse, z_rows, None,
        ignore_index, label_smoothing, lse_square_scale, 1.0 / divisor if divisor else float("inf"),
    )  # fmt: skip
    if grad_in_forward and inplace:
        mark_modified(logits)
    if reduction != "none":
        # A mean over no valid row is 0 / 0 = NaN, as in torch.
        loss.copy_(loss_rows.sum() / divisor)
        if return_z_loss:
            z_loss.copy_(z_rows.sum() / divisor)
    return loss, z_loss, lse, grad


def _cross_entropy_forward_fake(
    logits, target, ignore_index, label_smoothing, lse_square_scale, reduction, return_z_loss, compute_grad, inplace
):
    grad_in_forward = compute_grad and reduction != "none" and not inplace
    return _alloc_forward(logits, reduction, return_z_loss, grad_in_forward)


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
    one-element grad_loss in place.
    """
    if logits is None:
        scale_(grad, grad_loss.reshape(1))
        return
    launch_cross_entropy(
        logits, target, grad, None, lse, None, grad_loss, ignore_index, label_smoothing, lse_square_scale, 1.0
    )


def _cross_entropy_backward_fake(grad_loss, grad, logits, target, lse, ignore_index, label_smoothing, lse_square_scale):
    return None


def _setup_context(ctx, inputs, output):
    logits, target, ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale, reduction, _, _, inplace = inputs
    _, _, lse, grad = output
    ctx.per_row = reduction == "none"
    ctx.inplace = inplace
    if ctx.per_row:
        ctx.save_for_backward(logits, target, lse)
    elif inplace:
        # The gradient lives in the logits buffer, whose version the forward bumped: kept as a plain
        # reference, not a saved tensor.
        ctx.grad_buffer = logits
    else:
        ctx.save_for_backward(grad)


def _backward_rule(ctx, grads, backward, eager):
    grad_loss = grads[0]
    if ctx.per_row:
        logits, target, lse = ctx.saved_tensors
        grad = logits if ctx.inplace else torch.empty_like(logits)
        backward(grad_loss, grad, logits, target, lse, ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale)
    elif eager:
        grad = ctx.grad_buffer if ctx.inplace else ctx.saved_tensors[0]
        backward(grad_loss, grad, None, None, None, ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale)
    else:
        grad = ctx.saved_tensors[0] * grad_loss
    return (grad, *([None] * 8))


CrossEntropyFunction, _cross_entropy_apply = differentiable_op(
    "cross_entropy",
    forward=cross_entropy_forward,
    fake_forward=_cross_entropy_forward_fake,
    backward=cross_entropy_backward,
    fake_backward=_cross_entropy_backward_fake,
    setup_context=_setup_context,
    backward_rule=_backward_rule,
    n_differentiable_outputs=1,
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
    Returns the loss in the logits' dtype (and the z-loss), computed in fp32.
    A non-ignored target outside [0, V) raises ValueError before any launch (one host sync).
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
        inplace_backward and not is_compiling(),
    )  # fmt: skip
    if unbatched and reduction == "none":
        loss, z_loss = loss.squeeze(0), (z_loss.squeeze(0) if return_z_loss else z_loss)
    return (loss, z_loss) if return_z_loss else loss
