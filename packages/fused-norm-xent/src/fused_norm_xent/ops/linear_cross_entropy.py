"""Fused linear + cross-entropy: the loss of `hidden @ weight.T + bias` without the (N, V) logits.

Tokens are processed in chunks of C rows. Per chunk, with cuBLAS matmuls through torch:
    logits_c = hidden_c @ weight.T (+ bias)                       (C, V) in the compute dtype
    cross-entropy kernel: loss, lse and d loss / d logits_c, written over logits_c in place
    grad_hidden_c = grad_logits_c @ weight                          one matmul, K = V
    grad_weight  += grad_logits_c.T @ hidden_c                      accumulated across chunks
    grad_bias    += column sums of grad_logits_c                    fp32
so the memory beyond the inputs and the gradients is one (C, V) buffer. The gradients are
computed in the forward for an upstream gradient of 1 ("mean" / "sum"; the backward scales them,
at no cost when the upstream gradient is 1). With reduction="none" the upstream gradient differs
per row: the forward computes only the loss and the backward recomputes the chunk logits
(one more matmul of the size of the first). Either way an ignored token contributes exactly 0,
as in torch, whatever its upstream gradient (NaN or inf included).

grad_weight accumulates across N / C chunks. In fp32 (fp32_accumulation=True, the default) it
is as accurate as one unchunked matmul, at the cost of an fp32 (V, H) accumulator when the
weight is bf16/fp16 (none when the weight is fp32, e.g. fp32 master weights under autocast).
In the weight's dtype it rounds once per chunk, as Liger-Kernel does: half the memory, an error
that grows with the number of chunks.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple, Union

import torch
from torch import Tensor

from .. import _compat
from .._compat import addmm_into
from .._runtime.compat import autocast_dtype
from .._runtime.launch import Launch
from .._runtime.registration import differentiable_op
from .._validation import (
    cached_plan,
    check_bool,
    check_device,
    check_int,
    check_optional_tensor,
    check_shape,
    check_target,
    check_tensor,
)
from .cross_entropy import (
    PARTIAL_ENTRIES,
    check_loss_options,
    check_target_range,
    cross_entropy_launch,
    cross_entropy_programs,
    finalize_launch,
    keep_ignored_rows,
    loss_dtype_for,
    scale_,
)

# Chunk bounds (tokens); the default chunk is the largest power of two <= hidden size in them,
# so the chunk logits buffer is no larger than the weight.
MIN_CHUNK = 256
MAX_CHUNK = 8192


def default_chunk_size(n_tokens: int, hidden_size: int) -> int:
    chunk = 1 << (max(hidden_size, 1).bit_length() - 1)
    chunk = min(max(chunk, MIN_CHUNK), MAX_CHUNK)
    return max(1, min(chunk, 1 << max(n_tokens - 1, 0).bit_length()))


def _accumulator_dtype(weight: Tensor, compute_dtype: torch.dtype, fp32_accumulation: bool) -> torch.dtype:
    return torch.float32 if fp32_accumulation or weight.dtype == torch.float32 else compute_dtype


class ChunkPlan(NamedTuple):
    """The cross-entropy launches of the chunk loop."""

    rows: int  # of the chunk logits buffer
    padded: int  # its row stride: rows padded to a multiple of 64 elements
    programs: int  # of each chunk's launch
    full: Optional[Launch]  # a chunk of `rows` rows
    tail: Optional[Launch]  # the last chunk, where it is shorter


@functools.lru_cache(maxsize=256)
def _chunk_plan(
    n_tokens, vocab, chunk_size, device, stride_target, stride_row_scale, ignore_index, label_smoothing,
    lse_square_scale, softcap, compute_loss, reduce, store_z_loss, compute_grad, mean, row_scale, prefetch,
) -> ChunkPlan:  # fmt: skip
    rows = min(chunk_size, n_tokens)
    # Rows padded to a multiple of 64 elements: aligned vector loads in the kernel and aligned
    # leading dimensions for cuBLAS whatever V is (50257, GPT-2's, is odd).
    padded = -(-vocab // 64) * 64
    # Every chunk launches the programs of a full chunk, so that each writes its partial sums.
    programs = cross_entropy_programs(rows, vocab, device) if rows else 1

    def launch(n_rows: int) -> Optional[Launch]:
        if n_rows == 0:
            return None
        return cross_entropy_launch(
            programs, n_rows, vocab, (padded, 1), (padded, 1) if compute_grad else (0, 0), stride_target=stride_target,
            stride_row_scale=stride_row_scale, n_targets=n_tokens, ignore_index=ignore_index,
            label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap,
            compute_loss=compute_loss, reduce=reduce, store_z_loss=store_z_loss, compute_grad=compute_grad,
            mean_scale=mean, row_scale=row_scale, prefetch=prefetch,
        )  # fmt: skip

    tail = n_tokens % chunk_size if n_tokens > chunk_size else 0
    return ChunkPlan(rows, padded, programs, launch(rows), launch(tail))


def _chunks(
    hidden: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    target: Tensor,
    lse: Tensor,
    loss_rows: Optional[Tensor],
    z_rows: Optional[Tensor],
    partial: Optional[Tensor],
    row_scale: Optional[Tensor],
    grads: Optional[Tuple[Tensor, Tensor, Optional[Tensor]]],
    mean: bool,
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float,
    chunk_size: int,
) -> None:
    """The chunk loop (hidden, weight, bias already in the compute dtype).

    loss_rows given: computes loss, lse (and z-loss) per row; partial given (chunks * P * 3 fp64,
    P = the kernel's programs for one full chunk): sums them (and counts the valid rows) per
    program instead; neither: reads lse. grads = (grad_hidden, grad_weight_acc, grad_bias_acc)
    given: writes grad_hidden and accumulates the weight and bias gradients, over the valid rows'
    count if mean, times row_scale[row] if given.
    """
    n_tokens = hidden.shape[0]
    if n_tokens == 0 and grads is not None:
        grads[1].zero_()  # no chunk writes the weight gradient
    vocab = weight.shape[0]
    plan = cached_plan(_chunk_plan, (
        n_tokens, vocab, chunk_size, hidden.device, target.stride(0), 0 if row_scale is None else row_scale.stride(0),
        ignore_index, label_smoothing, lse_square_scale, softcap, loss_rows is not None or partial is not None,
        partial is not None, z_rows is not None, grads is not None, mean, row_scale is not None,
        _compat.PREFETCH_CHUNKS,
    ))  # fmt: skip
    logits = torch.empty((plan.rows, plan.padded), dtype=hidden.dtype, device=hidden.device)[:, :vocab]
    weight_t = weight.t()
    partial_step = plan.programs * PARTIAL_ENTRIES
    # The operands are already in the compute dtype: autocast must not recast them.
    with torch.autocast(hidden.device.type, enabled=False):
        for index, start in enumerate(range(0, n_tokens, chunk_size)):
            end = min(start + chunk_size, n_tokens)
            hidden_c, logits_c = hidden[start:end], logits[: end - start]
            if bias is None:
                torch.mm(hidden_c, weight_t, out=logits_c)
            else:
                torch.addmm(bias, hidden_c, weight_t, out=logits_c)
            launch = plan.full if end - start == plan.rows else plan.tail
            launch(
                logits_c, target[start:end], logits_c if grads is not None else None,
                None if loss_rows is None else loss_rows[start:end], None if z_rows is None else z_rows[start:end],
                None if partial is None else partial[index * partial_step :], lse[start:end],
                None if row_scale is None else row_scale[start:end], target,
            )  # fmt: skip
            if grads is None:
                continue
            grad_hidden, grad_weight, grad_bias = grads
            torch.mm(logits_c, weight, out=grad_hidden[start:end])
            addmm_into(grad_weight, logits_c.t(), hidden_c, accumulate=start > 0)
            if grad_bias is not None:
                grad_bias += logits_c.sum(0, dtype=torch.float32)


def _partial_sums(n_tokens: int, chunk_size: int, vocab: int, device: torch.device) -> Tensor:
    """The chunks * P * 3 fp64 per-program sums that _chunks fills (3 zeros without chunks)."""
    rows = min(chunk_size, n_tokens)
    if rows == 0:
        return torch.zeros(PARTIAL_ENTRIES, dtype=torch.float64, device=device)
    programs = cross_entropy_programs(rows, vocab, device)
    return torch.empty(-(-n_tokens // chunk_size) * programs * PARTIAL_ENTRIES, dtype=torch.float64, device=device)


def _alloc_grads(hidden, weight, bias, compute_dtype, fp32_accumulation):
    """Accumulators: grad_hidden in the compute dtype, grad_weight per fp32_accumulation, grad_bias fp32."""
    acc_dtype = _accumulator_dtype(weight, compute_dtype, fp32_accumulation)
    grad_hidden = torch.empty(hidden.shape, dtype=compute_dtype, device=hidden.device)
    grad_weight = torch.empty(weight.shape, dtype=acc_dtype, device=weight.device)
    grad_bias = None if bias is None else torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
    return grad_hidden, grad_weight, grad_bias


def _empty(like: Tensor) -> Tensor:
    return torch.empty(0, dtype=like.dtype, device=like.device)


def _alloc_forward(hidden, weight, bias, reduction, return_z_loss, grads_in_forward, loss_dtype):
    n_tokens = hidden.shape[0]
    loss_shape = (n_tokens,) if reduction == "none" else ()
    loss = torch.empty(loss_shape, dtype=loss_dtype, device=hidden.device)
    z_loss = torch.empty(loss_shape, dtype=loss_dtype, device=hidden.device) if return_z_loss else _empty(hidden)
    lse = torch.empty(n_tokens, dtype=torch.float32, device=hidden.device)
    if grads_in_forward:
        grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
        grad_weight = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
        grad_bias = _empty(hidden) if bias is None else torch.empty(bias.shape, dtype=bias.dtype, device=bias.device)
    else:
        grad_hidden, grad_weight, grad_bias = _empty(hidden), _empty(weight), _empty(hidden)
    return loss, z_loss, lse, grad_hidden, grad_weight, grad_bias


def _finish_grads(grads, hidden, weight, bias):
    """The accumulators in the parameters' own dtypes (a copy only where they differ)."""
    grad_hidden, grad_weight, grad_bias = grads
    return (
        grad_hidden.to(hidden.dtype),
        grad_weight.to(weight.dtype),
        _empty(hidden) if bias is None else grad_bias.to(bias.dtype),
    )


def linear_cross_entropy_forward(
    hidden: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    target: Tensor,
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float,
    reduction: str,
    return_z_loss: bool,
    compute_grad: bool,
    chunk_size: int,
    fp32_accumulation: bool,
    compute_dtype: torch.dtype,
    loss_dtype: torch.dtype,
    check_targets: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, z_loss, lse, grad_hidden, grad_weight, grad_bias) for hidden (N, H), weight (V, H).

    The gradients (for an upstream gradient of 1) are computed when compute_grad and the
    reduction is "mean" or "sum", else they are empty; grad_bias is empty without a bias.
    check_targets: first reject targets outside [0, V) that are not ignored (a host read).
    """
    n_tokens = hidden.shape[0]
    if check_targets:
        check_target_range(target, weight.shape[0], ignore_index)
    grads_in_forward = compute_grad and reduction != "none"
    h, w = hidden.to(compute_dtype), weight.to(compute_dtype)
    b = None if bias is None else bias.to(compute_dtype)
    loss, z_loss, lse, grad_hidden, grad_weight, grad_bias = _alloc_forward(
        hidden, weight, bias, reduction, return_z_loss, False, loss_dtype
    )
    reduce = reduction != "none"
    partial = _partial_sums(n_tokens, chunk_size, weight.shape[0], hidden.device) if reduce else None
    grads = _alloc_grads(h, weight, bias, compute_dtype, fp32_accumulation) if grads_in_forward else None
    _chunks(
        h, w, b, target, lse, None if reduce else loss, z_loss if return_z_loss and not reduce else None,
        partial, None, grads, reduction == "mean", ignore_index, label_smoothing, lse_square_scale, softcap, chunk_size,
    )  # fmt: skip
    if grads is not None:
        grad_hidden, grad_weight, grad_bias = _finish_grads(grads, hidden, weight, bias)
    if reduce:
        finalize = finalize_launch(partial.numel() // PARTIAL_ENTRIES, reduction == "mean", return_z_loss)
        finalize(partial, loss, z_loss if return_z_loss else None)
    return loss, z_loss, lse, grad_hidden, grad_weight, grad_bias


def _linear_cross_entropy_forward_fake(
    hidden, weight, bias, target, ignore_index, label_smoothing, lse_square_scale, softcap, reduction, return_z_loss,
    compute_grad, chunk_size, fp32_accumulation, compute_dtype, loss_dtype, check_targets,
):  # fmt: skip
    grads_in_forward = compute_grad and reduction != "none"
    return _alloc_forward(hidden, weight, bias, reduction, return_z_loss, grads_in_forward, loss_dtype)


def linear_cross_entropy_backward(
    grad_loss: Tensor,
    grad_hidden: Tensor,
    grad_weight: Tensor,
    grad_bias: Optional[Tensor],
    hidden: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    target: Optional[Tensor],
    lse: Optional[Tensor],
    ignore_index: int,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float,
    chunk_size: int,
    fp32_accumulation: bool,
    compute_dtype: torch.dtype,
) -> None:
    """Writes the gradients into grad_hidden, grad_weight (and grad_bias).

    With hidden (reduction "none"): recomputes the chunks with the per-row upstream gradient.
    Without: the buffers hold the gradients for an upstream 1; they are scaled in place by the
    one-element grad_loss (no traffic when it is 1), but for the ignored tokens' rows of
    grad_hidden, and not at all grad_weight and grad_bias when every token is ignored.
    """
    if hidden is None:
        scale_(grad_hidden, grad_loss, target, ignore_index, True)
        scale_(grad_weight, grad_loss, target, ignore_index, False)
        if grad_bias is not None:
            scale_(grad_bias, grad_loss, target, ignore_index, False)
        return
    h, w = hidden.to(compute_dtype), weight.to(compute_dtype)
    b = None if bias is None else bias.to(compute_dtype)
    # Accumulate straight into the outputs where their dtypes allow it (grad_bias sums in fp32).
    acc_dtype = _accumulator_dtype(weight, compute_dtype, fp32_accumulation)
    acc_hidden = (
        grad_hidden if grad_hidden.dtype == compute_dtype else torch.empty_like(grad_hidden, dtype=compute_dtype)
    )
    acc_weight = grad_weight if grad_weight.dtype == acc_dtype else torch.empty_like(grad_weight, dtype=acc_dtype)
    acc_bias = None if bias is None else torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
    _chunks(
        h, w, b, target, lse, None, None, None, grad_loss, (acc_hidden, acc_weight, acc_bias), False, ignore_index,
        label_smoothing, lse_square_scale, softcap, chunk_size,
    )  # fmt: skip
    for out, acc in ((grad_hidden, acc_hidden), (grad_weight, acc_weight), (grad_bias, acc_bias)):
        if out is not None and out is not acc:
            out.copy_(acc)


def _linear_cross_entropy_backward_fake(
    grad_loss, grad_hidden, grad_weight, grad_bias, hidden, weight, bias, target, lse, ignore_index,
    label_smoothing, lse_square_scale, softcap, chunk_size, fp32_accumulation, compute_dtype,
):  # fmt: skip
    return None


def _setup_context(ctx, inputs, output):
    hidden, weight, bias, target, ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale, ctx.softcap = inputs[:8]
    reduction = inputs[8]
    ctx.chunk_size, ctx.fp32_accumulation, ctx.compute_dtype = inputs[11:14]
    _, _, lse, grad_hidden, grad_weight, grad_bias = output
    ctx.per_row = reduction == "none"
    ctx.has_bias = bias is not None
    if ctx.per_row:
        ctx.save_for_backward(hidden, weight, bias, target, lse)
    else:
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias if bias is not None else None, target)


def _backward_rule(ctx, grads, backward, eager):
    grad_loss = grads[0]
    options = (ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale, ctx.softcap)
    settings = (ctx.chunk_size, ctx.fp32_accumulation, ctx.compute_dtype)
    if ctx.per_row:
        hidden, weight, bias, target, lse = ctx.saved_tensors
        grad_hidden, grad_weight = torch.empty_like(hidden), torch.empty_like(weight)
        grad_bias = None if bias is None else torch.empty_like(bias)
        backward(grad_loss, grad_hidden, grad_weight, grad_bias, hidden, weight, bias, target, lse, *options, *settings)
    elif eager:
        grad_hidden, grad_weight, grad_bias, target = ctx.saved_tensors
        backward(grad_loss, grad_hidden, grad_weight, grad_bias, None, None, None, target, None, *options, *settings)
    else:
        grad_hidden, grad_weight, grad_bias, target = ctx.saved_tensors
        grad_hidden = keep_ignored_rows(grad_hidden, grad_hidden * grad_loss, target, ctx.ignore_index)
        any_valid = (target != ctx.ignore_index).any()
        grad_weight, grad_bias = (
            None if t is None else torch.where(any_valid, t * grad_loss, t) for t in (grad_weight, grad_bias)
        )
    return (grad_hidden, grad_weight, grad_bias if ctx.has_bias else None, *([None] * 13))


LinearCrossEntropyFunction, _linear_cross_entropy_apply = differentiable_op(
    "fused_norm_xent::linear_cross_entropy",
    forward=linear_cross_entropy_forward,
    fake_forward=_linear_cross_entropy_forward_fake,
    backward=linear_cross_entropy_backward,
    fake_backward=_linear_cross_entropy_backward_fake,
    setup_context=_setup_context,
    backward_rule=_backward_rule,
    n_differentiable_outputs=1,
    differentiable_args=(0, 1, 2),
    backward_mutates=("grad_hidden", "grad_weight", "grad_bias"),
)


def linear_cross_entropy(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    bias: Optional[Tensor] = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    lse_square_scale: float = 0.0,
    softcap: float = 0.0,
    return_z_loss: bool = False,
    chunk_size: Optional[int] = None,
    fp32_accumulation: bool = True,
    check_targets: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """cross_entropy(hidden @ weight.T + bias, target) without materializing the logits.

    hidden: (..., H) fp32/fp16/bf16; weight: (V, H) and bias: (V,) (optional), the same dtype as
    hidden (under torch.autocast all three are cast to the autocast dtype, as F.linear does, and
    the gradients come back in their own dtypes). target: hidden's leading shape, int64 or int32.
    ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss, check_targets:
    as cross_entropy (the cap applies to each chunk's logits inside the kernel).
    chunk_size: tokens per chunk (default: the largest power of two <= H, clamped to
    [256, 8192], so the (chunk, V) logits buffer is no larger than the weight).
    fp32_accumulation: accumulate grad_weight across chunks in fp32 (accurate; an fp32 (V, H)
    buffer when the weight is bf16/fp16) or in the weight's dtype (less memory, one rounding per
    chunk, as Liger-Kernel).
    Returns the loss (and the z-loss) in hidden's dtype, or in fp32 under torch.autocast (as
    F.cross_entropy there).
    """
    check_tensor("hidden", hidden)
    check_tensor("weight", weight)
    check_target("target", target)
    check_optional_tensor("bias", bias)
    label_smoothing, lse_square_scale, softcap = check_loss_options(
        ignore_index, reduction, label_smoothing, lse_square_scale, softcap
    )
    if hidden.dim() < 1 or weight.dim() != 2:
        raise ValueError(
            f"hidden has shape {tuple(hidden.shape)} and weight {tuple(weight.shape)}; expected (..., H) and (V, H)"
        )
    check_shape("weight", weight, (weight.shape[0], hidden.shape[-1]), "(V, H) with H = hidden.shape[-1]")
    if weight.shape[0] == 0:
        raise ValueError("weight has no rows: V must be >= 1")
    if bias is not None:
        check_shape("bias", bias, weight.shape[:1], "(V,) with V = weight.shape[0]")
    check_shape("target", target, hidden.shape[:-1], "hidden's shape without the last dim")
    compute_dtype = autocast_dtype(hidden.device.type)
    if compute_dtype is None:  # under autocast all three are cast to the autocast dtype, as F.linear does
        compute_dtype = hidden.dtype
        for name, value in (("weight", weight), ("bias", bias)):
            if value is not None and value.dtype != hidden.dtype:
                raise TypeError(f"{name} has dtype {value.dtype} but hidden has {hidden.dtype}; they must match")
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, 1)
    check_device(hidden=hidden, weight=weight, bias=bias, target=target)
    hidden_2d = hidden.reshape(-1, hidden.shape[-1]) if hidden.dim() != 2 else hidden
    chunk = chunk_size or default_chunk_size(hidden_2d.shape[0], hidden.shape[-1])
    compute_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    loss, z_loss, *_ = _linear_cross_entropy_apply(
        hidden_2d, weight, bias, target.reshape(-1), ignore_index, label_smoothing, lse_square_scale, softcap,
        reduction, return_z_loss, compute_grad, chunk, fp32_accumulation, compute_dtype,
        loss_dtype_for(compute_dtype, hidden.device.type), check_bool("check_targets", check_targets),
    )  # fmt: skip
    if reduction == "none":
        loss = loss.view(target.shape)
        z_loss = z_loss.view(target.shape) if return_z_loss else z_loss
    return (loss, z_loss) if return_z_loss else loss
