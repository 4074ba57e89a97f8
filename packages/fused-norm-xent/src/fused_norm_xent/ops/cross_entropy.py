"""Cross-entropy plans, launchers, autograd and functional API.

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

A forward is the cross-entropy kernel and, for "mean" / "sum", a one-program kernel that sums the
per-program partial sums (a mean's divisor is counted on the device, by the kernels themselves):
no host synchronization. Targets outside [0, V) that are not ignored give NaN losses and gradients;
check_targets=True rejects them with a ValueError first, at the cost of one host synchronization.
Per call, a launcher looks up one plan (cached per shapes, strides, dtypes, device and options;
building it checks the arguments), allocates what it returns and calls the plan's launches.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import _compat
from .._runtime.compat import INTERPRETING, autocast_dtype, is_compiling, mark_modified, multiprocessor_count
from .._runtime.launch import Launch
from .._runtime.registration import differentiable_op
from .._validation import (
    cached_plan,
    check_bool,
    check_choice,
    check_device,
    check_float,
    check_int,
    check_shape,
    check_target,
    check_tensor,
    stand_in,
)
from ..kernels.cross_entropy import _cross_entropy_kernel, _loss_finalize_kernel, _scale_kernel

REDUCTIONS = ("mean", "sum", "none")
# Widest chunk of a row one program reads per step (16 KB of bf16); narrower rows share programs.
MAX_BLOCK_N = 8192
ELEMENTS_PER_TILE = 4096
CE_PROGRAMS_PER_SM = 2
# The in-place scaling kernel: tile shape and warps, and programs per SM.
SCALE_TILE = (4, 1024)
SCALE_PROGRAMS_PER_SM = 8
# Partial sums per step of the finalizing kernel, and fp64 entries per program: (loss, z-loss, count).
FINALIZE_BLOCK = 256
PARTIAL_ENTRIES = 3


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


def cross_entropy_programs(n_rows: int, n_cols: int, device: torch.device) -> int:
    """Persistent grid: CE_PROGRAMS_PER_SM row tiles in flight per SM (for 50k-wide bf16 rows,
    26 MB of rows being read twice), fewer when there are fewer tiles."""
    tiles = -(-n_rows // cross_entropy_config(n_cols).block_m)
    return max(1, min(tiles, multiprocessor_count(device) * CE_PROGRAMS_PER_SM))


def check_target_range(target: Tensor, n_classes: int, ignore_index: int) -> None:
    """Raise ValueError if a target that is not ignore_index lies outside [0, n_classes): one host
    synchronization. Under CUDA-graph capture there is nothing to read back, and no check."""
    if target.numel() == 0 or (not INTERPRETING and torch.cuda.is_current_stream_capturing()):
        return
    low, high = torch.aminmax(torch.where(target != ignore_index, target, 0))
    low, high = torch.stack((low, high)).tolist()
    if low < 0 or high >= n_classes:
        raise ValueError(
            f"target holds class index {low if low < 0 else high}, outside [0, {n_classes}) "
            f"and not ignore_index={ignore_index}"
        )


def rows_and_strides(shape, strides) -> Tuple[int, int, int, int]:
    """(rows, cols, row stride, col stride) of a 2-D tensor, or of a 1-D one as a single row."""
    if len(shape) == 1:
        return 1, shape[0], 0, strides[0]
    return shape[0], shape[1], strides[0], strides[1]


def cross_entropy_launch(
    programs: int, n_rows: int, n_cols: int, logits_strides, grad_strides, *, stride_target: int,
    stride_row_scale: int = 0, n_targets: int = 0, ignore_index: int, label_smoothing: float,
    lse_square_scale: float, softcap: float, compute_loss: bool, reduce: bool, store_z_loss: bool, compute_grad: bool,
    mean_scale: bool, row_scale: bool, prefetch: bool, n_classes: Optional[int] = None,
) -> Launch:  # fmt: skip
    """The cross-entropy kernel over (n_rows, n_cols) logits on `programs` programs.

    n_classes given (a gradient from saved lse, without compute_loss): the n_cols columns are
    a slice of n_classes classes, and the call passes the first one's index after all_targets.

    Called with (logits, target, grad, loss, z_loss, partial, lse, row_scale, all_targets), None
    for those not used: loss (and z_loss) per row, or partial ((programs, 3) fp64: per program
    (loss, z-loss, valid rows)) with reduce; grad with compute_grad (divided by the number of
    valid rows among the n_targets all_targets with mean_scale, times row_scale[row] with
    row_scale); lse written with compute_loss, else read. softcap > 0 caps the logits at
    softcap * tanh(logits / softcap) inside the kernel (0: off, the kernel compiled without it).
    """
    cfg = cross_entropy_config(n_cols)
    if n_classes is None:
        fixed = {"col_start": 0, "n_classes": n_cols}
    elif compute_loss:
        raise ValueError("a launch over a slice of the classes cannot compute the loss")
    else:
        fixed = {"n_classes": n_classes}
    return Launch(
        _cross_entropy_kernel, (programs,), **fixed, stride_logits_row=logits_strides[0],
        stride_logits_col=logits_strides[1],
        stride_grad_row=grad_strides[0], stride_grad_col=grad_strides[1], stride_target=stride_target,
        stride_row_scale=stride_row_scale, n_rows=n_rows, n_cols=n_cols, n_targets=n_targets,
        ignore_index=ignore_index, label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
        softcap=softcap, grad_scale=1.0, COMPUTE_LOSS=compute_loss, REDUCE=reduce, STORE_Z_LOSS=store_z_loss,
        COMPUTE_GRAD=compute_grad, MEAN_SCALE=mean_scale, HAS_SMOOTHING=label_smoothing != 0.0,
        HAS_Z_LOSS=lse_square_scale != 0.0, HAS_SOFTCAP=softcap != 0.0, HAS_ROW_SCALE=row_scale, PREFETCH=prefetch,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps,
    )  # fmt: skip


@functools.lru_cache(maxsize=1024)
def finalize_launch(n_partials: int, mean: bool, store_z_loss: bool) -> Launch:
    """Sums the (n_partials, 3) fp64 partials into loss (and z_loss), a mean over their counts;
    called with (partial, loss, z_loss or None)."""
    return Launch(
        _loss_finalize_kernel, (1,), n_partials=n_partials, MEAN=mean, STORE_Z_LOSS=store_z_loss,
        BLOCK_P=FINALIZE_BLOCK, num_warps=4,
    )  # fmt: skip


@functools.lru_cache(maxsize=1024)
def scale_launch(shape, strides, device, stride_target: int, n_targets: int, ignore_index: int, row_targets: bool):
    """x *= scale in place (x (rows, cols) or (cols,), any strides; scale a one-element tensor),
    free when scale is 1; called with (x, scale, target). None when x is empty.

    x is a gradient for an upstream 1 that ignored rows do not reach; those keep their part of it
    whatever the scale (NaN, inf). row_targets: row i of x belongs to target i, whose ignore_index
    rows keep their values; else x sums over every row of the n_targets targets and is left as it
    is when none is valid.
    """
    n_rows, n_cols, stride_row, stride_col = rows_and_strides(shape, strides)
    if n_rows * n_cols == 0:
        return None
    block_m, block_n = SCALE_TILE
    tiles = -(-n_rows // block_m) * -(-n_cols // block_n)
    return Launch(
        _scale_kernel, (min(tiles, multiprocessor_count(device) * SCALE_PROGRAMS_PER_SM),), stride_x_row=stride_row,
        stride_x_col=stride_col, stride_target=stride_target, n_rows=n_rows, n_cols=n_cols, n_targets=n_targets,
        ignore_index=ignore_index, ROW_TARGETS=row_targets, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=8,
    )  # fmt: skip


def scale_(x: Tensor, scale: Tensor, target: Tensor, ignore_index: int, row_targets: bool) -> None:
    """scale_launch's scaling of x by the one-element scale, for the (N,) or () targets."""
    launch = cached_plan(
        scale_launch,
        (x.shape, x.stride(), x.device, _target_stride(target), target.numel(), ignore_index, row_targets),
    )
    if launch is not None:
        launch(x, scale, target)


def _target_stride(target: Tensor) -> int:
    return target.stride(0) if target.dim() else 0


def keep_ignored_rows(grad: Tensor, scaled: Tensor, target: Tensor, ignore_index: int) -> Tensor:
    """scaled (grad times the upstream gradient) with the rows of ignored targets taken from grad:
    scale_ with row targets, in torch ops (for the compiled backward)."""
    return torch.where((target == ignore_index).unsqueeze(-1), grad, scaled)


def loss_dtype_for(dtype: torch.dtype, device_type: str) -> torch.dtype:
    """The loss's dtype: fp32 under autocast (as F.cross_entropy, which autocast runs in fp32),
    else the dtype of the logits (or of the linear layer's compute)."""
    return torch.float32 if autocast_dtype(device_type) is not None else dtype


def check_loss_options(
    ignore_index, reduction, label_smoothing, lse_square_scale, softcap
) -> Tuple[float, float, float]:
    check_int("ignore_index", ignore_index)
    check_choice("reduction", reduction, REDUCTIONS)
    label_smoothing = check_float("label_smoothing", label_smoothing, 0.0, 1.0)
    lse_square_scale = check_float("lse_square_scale", lse_square_scale, 0.0, include_high=False)
    softcap = check_float("softcap", softcap, 0.0, include_high=False)
    return label_smoothing, lse_square_scale, softcap


# Forward --------------------------------------------------------------------------------------


class ForwardPlan(NamedTuple):
    """One forward call's launches and allocations."""

    launch: Optional[Launch]  # None without rows
    finalize: Optional[Launch]  # "mean" / "sum"
    n_classes: int
    loss_shape: Tuple[int, ...]
    lse_shape: Tuple[int, ...]
    partial_numel: int
    new_grad: bool  # the gradient goes into a new buffer (else into the logits, or nowhere)
    writes_logits: bool


@functools.lru_cache(maxsize=1024)
def _forward_plan(
    shape, strides, dtype, device, target_shape, target_strides, target_dtype, target_device, ignore_index,
    label_smoothing, lse_square_scale, softcap, reduction, return_z_loss, compute_grad, inplace, prefetch,
) -> ForwardPlan:  # fmt: skip
    """The plan of a forward call; raises on invalid arguments (never cached then)."""
    check_tensor("logits", stand_in((), dtype))
    check_target("target", stand_in((), target_dtype))
    label_smoothing, lse_square_scale, softcap = check_loss_options(
        ignore_index, reduction, label_smoothing, lse_square_scale, softcap
    )
    if len(shape) not in (1, 2) or shape[-1] == 0:
        raise ValueError(
            f"logits has shape {tuple(shape)}; expected (N, V) or (V,) with V >= 1 (flatten leading dims; "
            "torch's (N, V, d1, ...) layout is not supported)"
        )
    check_shape("target", stand_in(target_shape, target_dtype), shape[:-1], "logits' shape without the class dim")
    check_device(logits=device, target=target_device)
    n_rows, n_cols, *logits_strides = rows_and_strides(shape, strides)
    reduce = reduction != "none"
    grad_in_forward = compute_grad and reduce
    if inplace:
        grad_strides = logits_strides
    else:
        grad_strides = rows_and_strides(shape, torch.empty_like(_stand_in_strided(shape, strides)).stride())[2:]
    programs = cross_entropy_programs(n_rows, n_cols, device)
    launch = None
    if n_rows:
        launch = cross_entropy_launch(
            programs, n_rows, n_cols, logits_strides, grad_strides if grad_in_forward else (0, 0),
            stride_target=target_strides[0] if target_strides else 0, n_targets=n_rows, ignore_index=ignore_index,
            label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap, compute_loss=True,
            reduce=reduce, store_z_loss=return_z_loss and not reduce, compute_grad=grad_in_forward,
            mean_scale=reduction == "mean", row_scale=False, prefetch=prefetch,
        )  # fmt: skip
    return ForwardPlan(
        launch=launch,
        finalize=finalize_launch(programs, reduction == "mean", return_z_loss) if reduce else None,
        n_classes=n_cols,
        loss_shape=tuple(target_shape) if not reduce else (),
        lse_shape=tuple(shape[:-1]),
        partial_numel=programs * PARTIAL_ENTRIES if reduce else 0,
        new_grad=grad_in_forward and not inplace,
        writes_logits=grad_in_forward and inplace,
    )


def _stand_in_strided(shape, strides) -> Tensor:
    return torch.empty_strided(tuple(shape), tuple(strides), device="meta")


def cross_entropy_forward(
    logits: Tensor,
    target: Tensor,
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float,
    reduction: str,
    return_z_loss: bool,
    compute_grad: bool,
    inplace: bool,
    loss_dtype: torch.dtype,
    check_targets: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, z_loss, lse, grad) of (N, V) or (V,) logits.

    grad: the logits gradient for an upstream gradient of 1 when compute_grad and the reduction is
    "mean" or "sum" (empty when inplace: it is in the logits buffer then), else empty. z_loss is
    empty unless return_z_loss. lse: fp32 per row. loss and z_loss in loss_dtype.
    """
    device = logits.device
    plan = cached_plan(_forward_plan, (
        logits.shape, logits.stride(), logits.dtype, device, target.shape, target.stride(), target.dtype,
        target.device, ignore_index, label_smoothing, lse_square_scale, softcap, reduction, return_z_loss,
        compute_grad, inplace, _compat.PREFETCH_CHUNKS,
    ))  # fmt: skip
    if check_targets:
        check_target_range(target, plan.n_classes, ignore_index)
    loss = torch.empty(plan.loss_shape, dtype=loss_dtype, device=device)
    z_loss = torch.empty(plan.loss_shape if return_z_loss else 0, dtype=loss_dtype, device=device)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=device)
    grad = torch.empty_like(logits) if plan.new_grad else torch.empty(0, dtype=logits.dtype, device=device)
    partial = torch.empty(plan.partial_numel, dtype=torch.float64, device=device) if plan.finalize else None
    if plan.launch is not None:
        per_row = partial is None
        plan.launch(
            logits, target, logits if plan.writes_logits else (grad if plan.new_grad else None),
            loss if per_row else None, z_loss if per_row and return_z_loss else None, partial, lse, None, target,
        )  # fmt: skip
    elif partial is not None:
        partial.zero_()
    if plan.finalize is not None:
        plan.finalize(partial, loss, z_loss if return_z_loss else None)
    if plan.writes_logits:
        mark_modified(logits)
    return loss, z_loss, lse, grad


def _cross_entropy_forward_fake(
    logits, target, ignore_index, label_smoothing, lse_square_scale, softcap, reduction, return_z_loss, compute_grad,
    inplace, loss_dtype, check_targets,
):  # fmt: skip
    loss_shape = target.shape if reduction == "none" else ()
    new_grad = compute_grad and reduction != "none" and not inplace
    return (
        logits.new_empty(loss_shape, dtype=loss_dtype),
        logits.new_empty(loss_shape if return_z_loss else (0,), dtype=loss_dtype),
        logits.new_empty(logits.shape[:-1], dtype=torch.float32),
        torch.empty_like(logits) if new_grad else logits.new_empty((0,)),
    )


# Backward -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _backward_launch(
    shape, strides, grad_strides, device, stride_target, stride_row_scale, ignore_index, label_smoothing,
    lse_square_scale, softcap, prefetch,
) -> Optional[Launch]:  # fmt: skip
    """The per-row ("none") backward: the gradient from the logits, lse and the upstream gradients."""
    n_rows, n_cols, *logits_strides = rows_and_strides(shape, strides)
    if n_rows == 0:
        return None
    return cross_entropy_launch(
        cross_entropy_programs(n_rows, n_cols, device), n_rows, n_cols, logits_strides,
        rows_and_strides(shape, grad_strides)[2:], stride_target=stride_target, stride_row_scale=stride_row_scale,
        ignore_index=ignore_index, label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
        softcap=softcap, compute_loss=False, reduce=False, store_z_loss=False, compute_grad=True, mean_scale=False,
        row_scale=True, prefetch=prefetch,
    )  # fmt: skip


def cross_entropy_backward(
    grad_loss: Tensor,
    grad: Tensor,
    logits: Optional[Tensor],
    target: Optional[Tensor],
    lse: Optional[Tensor],
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float,
) -> None:
    """Writes the logits gradient into `grad`.

    With logits, target and lse (reduction "none"): grad = d loss / d logits * grad_loss[row].
    Without (mean / sum): grad already holds the gradient for an upstream 1; it is scaled by the
    one-element grad_loss in place, but for the rows of ignored targets.
    """
    if logits is None:
        scale_(grad, grad_loss, target, ignore_index, True)
        return
    launch = cached_plan(_backward_launch, (
        logits.shape, logits.stride(), grad.stride(), logits.device, _target_stride(target), _target_stride(grad_loss),
        ignore_index, label_smoothing, lse_square_scale, softcap, _compat.PREFETCH_CHUNKS,
    ))  # fmt: skip
    if launch is not None:
        launch(logits, target, grad, None, None, None, lse, grad_loss, None)


def _cross_entropy_backward_fake(
    grad_loss, grad, logits, target, lse, ignore_index, label_smoothing, lse_square_scale, softcap
):
    return None


def _setup_context(ctx, inputs, output):
    logits, target, ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale, ctx.softcap, reduction = inputs[:7]
    inplace = inputs[9]
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
    options = (ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale, ctx.softcap)
    if ctx.per_row:
        logits, target, lse = ctx.saved_tensors
        grad = logits if ctx.inplace else torch.empty_like(logits)
        backward(grad_loss, grad, logits, target, lse, *options)
    elif eager:
        grad, target = (ctx.grad_buffer, *ctx.saved_tensors) if ctx.inplace else ctx.saved_tensors
        backward(grad_loss, grad, None, target, None, *options)
    else:
        grad, target = ctx.saved_tensors
        grad = keep_ignored_rows(grad, grad * grad_loss, target, ctx.ignore_index)
    if ctx.inplace:
        # A new alias of the logits buffer: nothing else holds it, so autograd hands it on (or makes
        # it a leaf's .grad) as it is instead of copying the (N, V) buffer.
        grad = grad.detach()
    return (grad, *([None] * 11))


CrossEntropyFunction, _cross_entropy_apply = differentiable_op(
    "fused_norm_xent::cross_entropy",
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


def cross_entropy(
    logits: Tensor,
    target: Tensor,
    weight: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    lse_square_scale: float = 0.0,
    softcap: float = 0.0,
    return_z_loss: bool = False,
    inplace_backward: bool = False,
    check_targets: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Cross-entropy of class logits against class indices, differentiable (F.cross_entropy).

    logits: (N, V) or (V,), fp32/fp16/bf16, any strides, V up to any size (rows stream in chunks).
    target: (N,) or (), int64 or int32 class indices in [0, V), or ignore_index.
    weight: class weights are not supported (must be None).
    reduction: "mean" (over the rows not ignored; NaN when all are, as torch), "sum" or "none".
    label_smoothing: in [0, 1], as torch. lse_square_scale: z-loss coefficient, adds
    lse_square_scale * logsumexp(row)^2 to each row's loss.
    softcap: > 0 computes the loss (and its gradient, through the cap) on softcap * tanh(logits /
    softcap), Gemma-2's final_logit_softcapping, in fp32 inside the kernel; 0 (default): off.
    return_z_loss: also return the z-loss part (reduced the same way; its gradient flows
    through the loss, the returned z-loss is for logging).
    inplace_backward: write the logits gradient into the logits buffer instead of a new one (no
    (N, V) allocation). The logits then hold the gradient: with reduction "mean" or "sum" from
    this call on (the gradient is computed in the forward), with "none" after the backward. Use
    it only when nothing else reads the logits (their autograd version is bumped, so a backward
    that saved them raises). Ignored while torch.compile traces.
    check_targets: raise ValueError, before anything is launched, if a target that is not
    ignore_index lies outside [0, V) (one host synchronization; none under CUDA-graph capture).
    Unchecked (the default: no synchronization), such a row's loss and gradient are NaN, so a
    mean or sum is NaN too.
    Returns the loss (and the z-loss) computed in fp32 (sums in fp64), in the logits' dtype, or in
    fp32 under torch.autocast as F.cross_entropy.
    """
    if not isinstance(logits, Tensor):
        check_tensor("logits", logits)
    if not isinstance(target, Tensor):
        check_target("target", target)
    if weight is not None:
        raise ValueError("weight: class weights are not supported (pass None)")
    compute_grad = logits.requires_grad and torch.is_grad_enabled()
    loss, z_loss, _, _ = _cross_entropy_apply(
        logits, target, ignore_index, label_smoothing, lse_square_scale, softcap, reduction, return_z_loss,
        compute_grad, inplace_backward and not is_compiling(), loss_dtype_for(logits.dtype, logits.device.type),
        check_bool("check_targets", check_targets),
    )  # fmt: skip
    return (loss, z_loss) if return_z_loss else loss
