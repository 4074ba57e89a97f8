"""Fused linear + cross-entropy: the loss of `hidden @ weight.T + bias` without the (N, V) logits.

A token pass goes over the N tokens in chunks of C rows. Per chunk, with cuBLAS matmuls through torch:
    logits_c = hidden_c @ weight.T (+ bias)                       (C, V) in the compute dtype
    cross-entropy kernel: loss, lse and d loss / d logits_c, written over logits_c in place
    grad_hidden_c = grad_logits_c @ weight                          one matmul, K = V
    grad_bias    += column sums of grad_logits_c                    fp32
    grad_weight  += grad_logits_c.T @ hidden_c                      weight_grad "fp32" or "chunked"
With weight_grad="exact" (the default) a vocabulary pass follows, over the V classes in chunks of
Cv, each as wide as fits the token pass's buffer, with every token's lse known:
    logits_v = hidden @ weight_v.T (+ bias_v)                       (N, Cv), the buffer again
    cross-entropy kernel: d loss / d logits_v from the saved lse, in place
    grad_weight_v = grad_logits_v.T @ hidden                        one matmul, K = N
so each weight-gradient row is summed over all tokens inside one matmul's fp32 accumulator and
rounded once, with no buffer of the weight's size, at the price of one more matmul pass of the
size of the first (four instead of three). The three modes, memory beyond the inputs, the
gradients and the (C, V) buffer (b bytes per element of the compute dtype: C * V * b, or
N * 64 * b when that is larger):
    "exact"    nothing; grad_weight rounded once; four matmul passes.
    "fp32"     grad_weight accumulated across the N / C chunks in an fp32 (V, H) buffer (V * H * 4
               bytes), rounded once; three passes.
    "chunked"  grad_weight accumulated in the weight's dtype, rounded once per chunk as
               Liger-Kernel does: the error grows with N / C; three passes.
An fp32 weight (fp32 master weights under autocast) accumulates in place: every mode is then
"fp32" at no cost in memory. The gradients are computed in the forward for an upstream gradient
of 1 ("mean" / "sum"; the backward scales them, at no cost when the upstream gradient is 1).
With reduction="none" the upstream gradient differs per row: the forward computes only the loss
and the backward recomputes the passes (one more matmul pass). Either way an ignored token
contributes exactly 0, as in torch, whatever its upstream gradient (NaN or inf included).
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
    check_choice,
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

WEIGHT_GRAD_MODES = ("exact", "fp32", "chunked")
# Token chunk bounds of the default chunk size: with the vocabulary pass, and without it (where
# each chunk adds its share into the weight gradient, a read and a write of it, so larger chunks).
MIN_CHUNK, MIN_ACCUMULATING_CHUNK = 64, 256
MAX_CHUNK = 8192
# Rows of the logits buffer are padded to a multiple of this many elements (aligned vector loads in
# the kernel, aligned leading dimensions for cuBLAS whatever V is: GPT-2's 50257 is odd), and the
# vocabulary pass's chunks are a multiple of it wide.
ALIGN = 64


def default_chunk_size(n_tokens: int, hidden_size: int, vocab: int, vocab_pass: bool) -> int:
    """Tokens per chunk. With the vocabulary pass: N / ceil(V / H) rounded up to a power of two, in
    [64, 8192], so that the (chunk, V) logits buffer is under twice the size of the hidden states.
    Without it (grad_weight accumulated chunk by chunk): the largest power of two <= H, in
    [256, 8192], so that the buffer is no larger than the weight while the accumulation's traffic
    (a read and a write of grad_weight per chunk) stays small beside the chunk's matmuls."""
    if vocab_pass:
        per_chunk = -(-max(n_tokens, 1) // -(-vocab // max(hidden_size, 1)))
        chunk = min(max(1 << (per_chunk - 1).bit_length(), MIN_CHUNK), MAX_CHUNK)
    else:
        chunk = min(max(1 << (max(hidden_size, 1).bit_length() - 1), MIN_ACCUMULATING_CHUNK), MAX_CHUNK)
    return max(1, min(chunk, 1 << max(n_tokens - 1, 0).bit_length()))


def _padded(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _vocab_pass_used(weight: Tensor, compute_dtype: torch.dtype, weight_grad: str) -> bool:
    """Whether the exact mode's vocabulary pass computes grad_weight: for a low-precision weight in
    the compute dtype (an fp32 weight accumulates in place; one of a third dtype goes through fp32)."""
    return weight_grad == "exact" and weight.dtype == compute_dtype and compute_dtype != torch.float32


def _weight_grad_dtype(weight: Tensor, compute_dtype: torch.dtype, weight_grad: str) -> torch.dtype:
    """The dtype the passes write grad_weight in."""
    if weight.dtype == torch.float32:
        return torch.float32
    if weight_grad == "chunked" or _vocab_pass_used(weight, compute_dtype, weight_grad):
        return compute_dtype
    return torch.float32


def _buffer(n_tokens: int, vocab: int, chunk_size: int, vocab_pass: bool, dtype, device) -> Tensor:
    """The logits buffer, flat: (C, V padded) for the token pass, (N, Cv) for the vocabulary pass."""
    elements = min(chunk_size, n_tokens) * _padded(vocab)
    if vocab_pass:
        elements = max(elements, n_tokens * ALIGN)
    return torch.empty(elements, dtype=dtype, device=device)


class ChunkPlan(NamedTuple):
    """The cross-entropy launches of a pass over chunks."""

    width: int  # of a chunk: rows (token pass) or classes (vocabulary pass)
    stride: int  # the buffer's row stride
    programs: int  # of each chunk's launch
    full: Optional[Launch]  # a chunk `width` wide
    tail: Optional[Launch]  # the last chunk, where it is narrower


@functools.lru_cache(maxsize=256)
def _token_plan(
    n_tokens, vocab, chunk_size, device, stride_target, stride_row_scale, ignore_index, label_smoothing,
    lse_square_scale, softcap, compute_loss, reduce, store_z_loss, compute_grad, mean, row_scale, prefetch,
) -> ChunkPlan:  # fmt: skip
    rows = min(chunk_size, n_tokens)
    padded = _padded(vocab)
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


@functools.lru_cache(maxsize=256)
def _vocab_plan(
    n_tokens, vocab, buffer_elements, device, stride_target, stride_row_scale, ignore_index, label_smoothing,
    lse_square_scale, softcap, mean, row_scale, prefetch,
) -> ChunkPlan:  # fmt: skip
    # As many classes as fill the buffer, a multiple of ALIGN (or all of them).
    width = min(vocab, max(ALIGN, buffer_elements // n_tokens // ALIGN * ALIGN))
    stride = _padded(width)
    programs = cross_entropy_programs(n_tokens, width, device)

    def launch(n_cols: int) -> Optional[Launch]:
        if n_cols == 0:
            return None
        return cross_entropy_launch(
            programs, n_tokens, n_cols, (stride, 1), (stride, 1), stride_target=stride_target,
            stride_row_scale=stride_row_scale, n_targets=n_tokens, ignore_index=ignore_index,
            label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap, compute_loss=False,
            reduce=False, store_z_loss=False, compute_grad=True, mean_scale=mean, row_scale=row_scale,
            prefetch=prefetch, n_classes=vocab,
        )  # fmt: skip

    return ChunkPlan(width, stride, programs, launch(width), launch(vocab % width))


class _Options(NamedTuple):
    """What the passes take besides the tensors."""

    ignore_index: int
    label_smoothing: float
    lse_square_scale: float
    softcap: float
    mean: bool


def _token_pass(
    hidden: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    target: Tensor,
    lse: Tensor,
    loss_rows: Optional[Tensor],
    z_rows: Optional[Tensor],
    partial: Optional[Tensor],
    row_scale: Optional[Tensor],
    grads: Optional[Tuple[Tensor, Optional[Tensor], Optional[Tensor]]],
    buffer: Tensor,
    options: _Options,
    chunk_size: int,
) -> None:
    """The token pass (hidden, weight, bias already in the compute dtype).

    loss_rows given: computes loss, lse (and z-loss) per row; partial given (chunks * P * 3 fp64,
    P = the kernel's programs for one full chunk): sums them (and counts the valid rows) per
    program instead; neither: reads lse. grads = (grad_hidden, grad_weight_acc or None,
    grad_bias_acc or None) given: writes grad_hidden and accumulates the weight and bias gradients,
    over the valid rows' count if options.mean, times row_scale[row] if given.
    """
    n_tokens, vocab = hidden.shape[0], weight.shape[0]
    if n_tokens == 0 and grads is not None and grads[1] is not None:
        grads[1].zero_()  # no chunk writes the weight gradient
    plan = cached_plan(_token_plan, (
        n_tokens, vocab, chunk_size, hidden.device, target.stride(0), 0 if row_scale is None else row_scale.stride(0),
        options.ignore_index, options.label_smoothing, options.lse_square_scale, options.softcap,
        loss_rows is not None or partial is not None, partial is not None, z_rows is not None, grads is not None,
        options.mean, row_scale is not None, _compat.PREFETCH_CHUNKS,
    ))  # fmt: skip
    logits = buffer[: plan.width * plan.stride].view(plan.width, plan.stride)[:, :vocab]
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
            launch = plan.full if end - start == plan.width else plan.tail
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
            if grad_weight is not None:
                addmm_into(grad_weight, logits_c.t(), hidden_c, accumulate=start > 0)
            if grad_bias is not None:
                grad_bias += logits_c.sum(0, dtype=torch.float32)


def _vocab_pass(
    hidden: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    target: Tensor,
    lse: Tensor,
    row_scale: Optional[Tensor],
    grad_weight: Tensor,
    buffer: Tensor,
    options: _Options,
) -> None:
    """grad_weight (in the compute dtype, as hidden and weight) from the saved lse, one chunk of
    classes at a time, each row summed over every token in one matmul."""
    n_tokens, vocab = hidden.shape[0], weight.shape[0]
    if n_tokens == 0:
        grad_weight.zero_()
        return
    plan = cached_plan(_vocab_plan, (
        n_tokens, vocab, buffer.numel(), hidden.device, target.stride(0),
        0 if row_scale is None else row_scale.stride(0), options.ignore_index, options.label_smoothing,
        options.lse_square_scale, options.softcap, options.mean, row_scale is not None, _compat.PREFETCH_CHUNKS,
    ))  # fmt: skip
    logits = buffer[: n_tokens * plan.stride].view(n_tokens, plan.stride)
    with torch.autocast(hidden.device.type, enabled=False):
        for start in range(0, vocab, plan.width):
            end = min(start + plan.width, vocab)
            logits_v, weight_t = logits[:, : end - start], weight[start:end].t()
            if bias is None:
                torch.mm(hidden, weight_t, out=logits_v)
            else:
                torch.addmm(bias[start:end], hidden, weight_t, out=logits_v)
            launch = plan.full if end - start == plan.width else plan.tail
            launch(logits_v, target, logits_v, None, None, None, lse, row_scale, target, start)
            torch.mm(logits_v.t(), hidden, out=grad_weight[start:end])


def _passes(
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
    options: _Options,
    chunk_size: int,
    vocab_pass: bool,
) -> None:
    """The token pass (arguments as _token_pass's), then with grads and vocab_pass the vocabulary
    pass for grads[1], both in one logits buffer."""
    vocab_pass = vocab_pass and grads is not None
    buffer = _buffer(hidden.shape[0], weight.shape[0], chunk_size, vocab_pass, hidden.dtype, hidden.device)
    token_grads = (grads[0], None, grads[2]) if vocab_pass else grads
    _token_pass(
        hidden, weight, bias, target, lse, loss_rows, z_rows, partial, row_scale, token_grads, buffer, options,
        chunk_size,
    )  # fmt: skip
    if vocab_pass:
        _vocab_pass(hidden, weight, bias, target, lse, row_scale, grads[1], buffer, options)


def _partial_sums(n_tokens: int, chunk_size: int, vocab: int, device: torch.device) -> Tensor:
    """The chunks * P * 3 fp64 per-program sums that the token pass fills (3 zeros without chunks)."""
    rows = min(chunk_size, n_tokens)
    if rows == 0:
        return torch.zeros(PARTIAL_ENTRIES, dtype=torch.float64, device=device)
    programs = cross_entropy_programs(rows, vocab, device)
    return torch.empty(-(-n_tokens // chunk_size) * programs * PARTIAL_ENTRIES, dtype=torch.float64, device=device)


def _alloc_grads(hidden, weight, bias, compute_dtype, weight_grad):
    """What the passes write: grad_hidden in the compute dtype, grad_weight per weight_grad, grad_bias fp32."""
    acc_dtype = _weight_grad_dtype(weight, compute_dtype, weight_grad)
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
    weight_grad: str,
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
    grads = _alloc_grads(h, weight, bias, compute_dtype, weight_grad) if grads_in_forward else None
    _passes(
        h, w, b, target, lse, None if reduce else loss, z_loss if return_z_loss and not reduce else None, partial,
        None, grads, _Options(ignore_index, label_smoothing, lse_square_scale, softcap, reduction == "mean"),
        chunk_size, _vocab_pass_used(weight, compute_dtype, weight_grad),
    )  # fmt: skip
    if grads is not None:
        grad_hidden, grad_weight, grad_bias = _finish_grads(grads, hidden, weight, bias)
    if reduce:
        finalize = finalize_launch(partial.numel() // PARTIAL_ENTRIES, reduction == "mean", return_z_loss)
        finalize(partial, loss, z_loss if return_z_loss else None)
    return loss, z_loss, lse, grad_hidden, grad_weight, grad_bias


def _linear_cross_entropy_forward_fake(
    hidden, weight, bias, target, ignore_index, label_smoothing, lse_square_scale, softcap, reduction, return_z_loss,
    compute_grad, chunk_size, weight_grad, compute_dtype, loss_dtype, check_targets,
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
    weight_grad: str,
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
    acc_dtype = _weight_grad_dtype(weight, compute_dtype, weight_grad)
    acc_hidden = (
        grad_hidden if grad_hidden.dtype == compute_dtype else torch.empty_like(grad_hidden, dtype=compute_dtype)
    )
    acc_weight = grad_weight if grad_weight.dtype == acc_dtype else torch.empty_like(grad_weight, dtype=acc_dtype)
    acc_bias = None if bias is None else torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
    _passes(
        h, w, b, target, lse, None, None, None, grad_loss, (acc_hidden, acc_weight, acc_bias),
        _Options(ignore_index, label_smoothing, lse_square_scale, softcap, False), chunk_size,
        _vocab_pass_used(weight, compute_dtype, weight_grad),
    )  # fmt: skip
    for out, acc in ((grad_hidden, acc_hidden), (grad_weight, acc_weight), (grad_bias, acc_bias)):
        if out is not None and out is not acc:
            out.copy_(acc)


def _linear_cross_entropy_backward_fake(
    grad_loss, grad_hidden, grad_weight, grad_bias, hidden, weight, bias, target, lse, ignore_index,
    label_smoothing, lse_square_scale, softcap, chunk_size, weight_grad, compute_dtype,
):  # fmt: skip
    return None


def _setup_context(ctx, inputs, output):
    hidden, weight, bias, target, ctx.ignore_index, ctx.label_smoothing, ctx.lse_square_scale, ctx.softcap = inputs[:8]
    reduction = inputs[8]
    ctx.chunk_size, ctx.weight_grad, ctx.compute_dtype = inputs[11:14]
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
    settings = (ctx.chunk_size, ctx.weight_grad, ctx.compute_dtype)
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
    weight_grad: str = "exact",
    check_targets: bool = False,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """cross_entropy(hidden @ weight.T + bias, target) without materializing the logits.

    hidden: (..., H) fp32/fp16/bf16; weight: (V, H) and bias: (V,) (optional), the same dtype as
    hidden (under torch.autocast all three are cast to the autocast dtype, as F.linear does, and
    the gradients come back in their own dtypes). target: hidden's leading shape, int64 or int32.
    ignore_index, reduction, label_smoothing, lse_square_scale, softcap, return_z_loss, check_targets:
    as cross_entropy (the cap applies to each chunk's logits inside the kernel).
    chunk_size: tokens per chunk of the token pass, which sets the size of the one logits buffer,
    (chunk, V) (default: with the vocabulary pass, N / ceil(V / H) rounded up to a power of two,
    in [64, 8192], so that the buffer is under twice the size of hidden; without it, the largest
    power of two <= H, in [256, 8192]).
    weight_grad: how a bf16/fp16 weight's gradient is summed over the tokens. "exact": each
    element in fp32 over all tokens, rounded once, no extra memory, one more matmul pass over
    the vocabulary (four instead of three). "fp32": as accurate, three passes, an fp32 (V, H)
    buffer. "chunked": three passes, no extra memory, rounded in the weight's dtype once per
    chunk, as Liger-Kernel (less accurate as chunks grow in number). An fp32 weight
    accumulates in place, exactly, in three passes whatever the mode.
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
    check_choice("weight_grad", weight_grad, WEIGHT_GRAD_MODES)
    check_device(hidden=hidden, weight=weight, bias=bias, target=target)
    hidden_2d = hidden.reshape(-1, hidden.shape[-1]) if hidden.dim() != 2 else hidden
    vocab_pass = _vocab_pass_used(weight, compute_dtype, weight_grad)
    chunk = chunk_size or default_chunk_size(hidden_2d.shape[0], hidden.shape[-1], weight.shape[0], vocab_pass)
    compute_grad = torch.is_grad_enabled() and (
        hidden.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    loss, z_loss, *_ = _linear_cross_entropy_apply(
        hidden_2d, weight, bias, target.reshape(-1), ignore_index, label_smoothing, lse_square_scale, softcap,
        reduction, return_z_loss, compute_grad, chunk, weight_grad, compute_dtype,
        loss_dtype_for(compute_dtype, hidden.device.type), check_bool("check_targets", check_targets),
    )  # fmt: skip
    if reduction == "none":
        loss = loss.view(target.shape)
        z_loss = z_loss.view(target.shape) if return_z_loss else z_loss
    return (loss, z_loss) if return_z_loss else loss
