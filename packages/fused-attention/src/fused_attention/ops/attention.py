"""Autograd and the public functional API: flash_attention, flash_attention_varlen.

Where torch has `torch.library.custom_op` (torch >= 2.4) the forward and backward launchers are
registered as the custom ops `fused_attention::fwd` and `fused_attention::bwd`, with fake
implementations and registered autograd, so `torch.compile(fullgraph=True)` traces through them.
Eager calls (and older torch) run the same launchers inside `FlashAttentionFunction`, or call
the forward launcher directly when no input needs a gradient.

The eager host path is kept short (it is paid per layer per step, and at short sequences it
can exceed the kernels): the checks read each attribute once, and their outcome for a
combination of shapes, dtypes, devices and options is cached (`_dense_spec`), so a repeated call
costs one dictionary lookup before the launchers, which cache their launch plans likewise.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from .._compat import HAS_CUSTOM_OP, autocast_dtype, custom_bwd, custom_fwd, is_compiling
from .._validation import (
    check_alibi_slopes,
    check_bool,
    check_cu_seqlens,
    check_cu_seqlens_values,
    check_device,
    check_heads,
    check_layout,
    check_qkv_dtypes,
    check_seqlen_arg,
    check_softmax_scale,
    check_window,
)
from .launch import AttentionSpec, attention_bwd, attention_fwd, lse_shape


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd of the attention kernels: saves q, k, v, O and the fp32 LSE; differentiable in q, k, v
    and through both outputs (a gradient of the LSE enters the backward as delta -= dLSE)."""

    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec: AttentionSpec):
        out, lse = attention_fwd(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec)
        ctx.save_for_backward(q, k, v, out, lse)
        # Inputs without gradients, never modified by the kernels: kept on ctx directly (fewer
        # saved-tensor unpacks in the backward).
        ctx.extras = (alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @custom_bwd
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(dout, dlse, q, k, v, out, lse, *ctx.extras)
        return dq, dk, dv, None, None, None, None


def _backward(dout, dlse, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec):
    dout = torch.zeros_like(out) if dout is None else _addressable(dout, _seq_dim(spec))
    if dlse is not None and dlse.stride(-1) > _MAX_POSITION_STRIDE:  # positions are its last dim
        dlse = dlse.contiguous()
    return attention_bwd(dout, q, k, v, out, lse, dlse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec)


if HAS_CUSTOM_OP:

    @torch.library.custom_op("fused_attention::fwd", mutates_args=())
    def _fwd_op(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        alibi_slopes: Optional[torch.Tensor],
        cu_seqlens_q: Optional[torch.Tensor],
        cu_seqlens_k: Optional[torch.Tensor],
        spec_ints: List[int],
        softmax_scale: float,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        spec = AttentionSpec.from_op_args(spec_ints, softmax_scale)
        return attention_fwd(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec)

    @_fwd_op.register_fake
    def _fwd_fake(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec_ints, softmax_scale):
        spec = AttentionSpec.from_op_args(spec_ints, softmax_scale)
        lse = q.new_empty(lse_shape(spec, q.shape[0]), dtype=torch.float32)
        return torch.empty_like(q, memory_format=torch.contiguous_format), lse

    @torch.library.custom_op("fused_attention::bwd", mutates_args=())
    def _bwd_op(
        dout: torch.Tensor,
        dlse: Optional[torch.Tensor],
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        alibi_slopes: Optional[torch.Tensor],
        cu_seqlens_q: Optional[torch.Tensor],
        cu_seqlens_k: Optional[torch.Tensor],
        spec_ints: List[int],
        softmax_scale: float,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        spec = AttentionSpec.from_op_args(spec_ints, softmax_scale)
        return _backward(dout, dlse, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec)

    @_bwd_op.register_fake
    def _bwd_fake(dout, dlse, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec_ints, softmax_scale):
        return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))

    def _setup_context(ctx, inputs, output):
        q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec_ints, softmax_scale = inputs
        ctx.save_for_backward(q, k, v, output[0], output[1], alibi_slopes, cu_seqlens_q, cu_seqlens_k)
        ctx.spec = (spec_ints, softmax_scale)
        ctx.set_materialize_grads(False)

    def _op_backward(ctx, dout, dlse):
        q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        dq, dk, dv = _bwd_op(dout, dlse, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, *ctx.spec)
        return dq, dk, dv, None, None, None, None, None

    torch.library.register_autograd("fused_attention::fwd", _op_backward, setup_context=_setup_context)


def _apply(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec: AttentionSpec):
    """The custom op while torch.compile traces; in eager mode the autograd.Function, which runs
    the same launchers without the custom-op dispatch (tens of microseconds a call), or the
    forward launcher alone when no input needs a gradient (no autograd node)."""
    if is_compiling():
        if HAS_CUSTOM_OP:
            return _fwd_op(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, *spec.to_op_args())
    elif not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return attention_fwd(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec)
    return FlashAttentionFunction.apply(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec)


def _autocast_inputs(*tensors):
    """Under torch.autocast, fp32 q/k/v (or a packed qkv) are cast to the autocast dtype (as SDPA is)."""
    first = tensors[0]
    if isinstance(first, torch.Tensor) and first.dtype == torch.float32:
        dtype = autocast_dtype(first.device.type)
        if dtype in (torch.float16, torch.bfloat16):
            return tuple(
                t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t for t in tensors
            )
    return tensors


# The kernels add the offsets of a tile's rows (up to 127 rows past a block's start, plus the head
# dim's lanes) in int32: an input with a larger position stride is copied, as is one whose head dim
# lacks unit stride. (Outputs and gradients are allocated packed: their strides are small.)
_MAX_POSITION_STRIDE = (2**31 - 1 - 256) // 127


def _addressable(t: torch.Tensor, seq_dim: int) -> torch.Tensor:
    """t, or a contiguous copy where the kernels cannot address t through its strides."""
    return t if t.stride(-1) == 1 and t.stride(seq_dim) <= _MAX_POSITION_STRIDE else t.contiguous()


def _seq_dim(spec: AttentionSpec) -> int:
    """The position dim of q/k/v/O in the call's layout."""
    return 0 if spec.varlen else 2 if spec.bhsd else 1


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    return_lse: bool = False,
    layout: str = "bshd",
    deterministic: bool = False,
):
    """Scaled dot-product attention, FlashAttention-2 style, differentiable in q, k, v.

    q: (B, S_q, H, D) for layout="bshd" (FlashAttention's layout) or (B, H, S_q, D) for
        layout="bhsd" (PyTorch SDPA's); fp16 or bf16, any strides (copied only where the head dim
        lacks unit stride or positions lie more than 2^24 elements apart), on a CUDA device (the
        CPU under TRITON_INTERPRET=1).
    k, v: (B, S_k, H_kv, D) / (B, H_kv, S_k, D), q's dtype; H must be a multiple of H_kv (GQA,
        MQA). D in 16, 32, 64, 80, 96, 128, 160, 192, 256.
    causal: query i sees keys j <= i + S_k - S_q (aligned to the bottom-right corner).
    softmax_scale: positive; default 1 / sqrt(D).
    alibi_slopes: fp32 (H,) or (B, H): adds -slope * |i + S_k - S_q - j| to the scores.
    window_size: (left, right): query i sees keys i + S_k - S_q - left ... i + S_k - S_q + right;
        -1 leaves a side unbounded. Combines with causal (which sets right = 0).
    return_lse: also return the fp32 log-sum-exp of the scaled scores, (B, H, S_q) (differentiable).
    layout: "bshd" or "bhsd"; the output has q's shape, contiguous in that layout.
    deterministic: compute dQ in the backward without atomics (bit-reproducible gradients). On a
        GPU every call takes that path today, the faster one as measured (ops.configs); the flag
        guarantees it should the choice change. (An fp32-atomic dQ, FlashAttention-2's default,
        remains for head dims up to 64: its last bits may differ between runs.)

    Returns out, or (out, lse). A query that sees no key gets out = 0 and lse = -inf. Under
    torch.autocast, fp32 inputs are cast to the autocast dtype first.
    """
    if return_lse.__class__ is not bool:
        check_bool("return_lse", return_lse)
    q, k, v = _autocast_inputs(q, k, v)
    spec = _dense_spec(q, k, v, causal, softmax_scale, alibi_slopes, window_size, layout, deterministic)
    seq_dim = 2 if spec.bhsd else 1
    if (
        q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1
        or max(q.stride(seq_dim), k.stride(seq_dim), v.stride(seq_dim)) > _MAX_POSITION_STRIDE
    ):  # fmt: skip
        q, k, v = (_addressable(t, seq_dim) for t in (q, k, v))
    out, lse = _apply(q, k, v, alibi_slopes, None, None, spec)
    return (out, lse) if return_lse else out


# Specs of the argument combinations seen so far (bounded: cleared when full).
_SPECS: dict = {}
_MAX_SPECS = 4096


def _dense_spec(q, k, v, causal, softmax_scale, alibi_slopes, window_size, layout, deterministic) -> AttentionSpec:
    """flash_attention's checks and spec, cached by everything they read (the option types too,
    so that a bool where an int belongs is not let through by an equal cached key). While
    torch.compile traces, the checks run as they are (traced once; Dynamo cannot key a dict on
    types)."""
    if is_compiling():
        return _check_dense(q, k, v, causal, softmax_scale, alibi_slopes, window_size, layout, deterministic)
    try:
        key = (
            q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device,
            causal, causal.__class__, softmax_scale, softmax_scale.__class__, window_size, window_size.__class__,
            window_size[0].__class__, window_size[1].__class__, layout, deterministic, deterministic.__class__,
            None if alibi_slopes is None else (alibi_slopes.shape, alibi_slopes.dtype, alibi_slopes.device),
        )  # fmt: skip
        spec = _SPECS.get(key)
    except Exception:  # a non-tensor or an unhashable option: the checks below name the culprit
        key = spec = None
    if spec is None:
        spec = _check_dense(q, k, v, causal, softmax_scale, alibi_slopes, window_size, layout, deterministic)
        if key is not None:
            if len(_SPECS) >= _MAX_SPECS:
                _SPECS.clear()
            _SPECS[key] = spec
    return spec


def _check_dense(q, k, v, causal, softmax_scale, alibi_slopes, window_size, layout, deterministic) -> AttentionSpec:
    check_qkv_dtypes(q, k, v)
    bhsd = check_layout(layout)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            dims = "(B, H, S, D)" if bhsd else "(B, S, H, D)"
            raise ValueError(f"{name} must be 4-D {dims} for layout={layout!r}, got shape {tuple(t.shape)}")
    seq_dim, head_dim_index = (2, 1) if bhsd else (1, 2)
    batch, seqlen_q, n_heads, head_dim = q.shape[0], q.shape[seq_dim], q.shape[head_dim_index], q.shape[3]
    seqlen_k, n_kv_heads = k.shape[seq_dim], k.shape[head_dim_index]
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"q, k and v must share the batch size, got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    check_heads(n_heads, n_kv_heads, k.shape[3], v.shape[3])
    if head_dim != k.shape[3]:
        raise ValueError(f"q has head dim {head_dim} but k has {k.shape[3]}")
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    scale = check_softmax_scale(softmax_scale, head_dim)
    window_left, window_right = check_window(window_size, causal, seqlen_q, seqlen_k)
    check_alibi_slopes(alibi_slopes, batch, n_heads)
    check_bool("deterministic", deterministic)
    check_device(q=q, k=k, v=v, alibi_slopes=alibi_slopes)
    return AttentionSpec(
        batch, n_heads, n_kv_heads, head_dim, seqlen_q, seqlen_k, scale, window_left, window_right,
        alibi_slopes is not None, False, bhsd, deterministic,
    )  # fmt: skip


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    return_lse: bool = False,
    check_seqlens: bool = True,
    deterministic: bool = False,
):
    """flash_attention over a packed batch of variable-length sequences, differentiable in q, k, v.

    q: (total_q, H, D); k, v: (total_k, H_kv, D); dtypes, head dims and devices as flash_attention.
    cu_seqlens_q, cu_seqlens_k: int32 (B + 1,) offsets: sequence b is rows
        cu_seqlens[b] : cu_seqlens[b + 1] (lengths may be 0 or 1); on q's device.
    max_seqlen_q, max_seqlen_k: ints >= every sequence's length (they size the launch grid; a
        value above the packed length counts as the packed length).
    causal, softmax_scale, window_size: as flash_attention, per sequence (causal aligned to each
        sequence's bottom-right corner).
    alibi_slopes: fp32 (H,) or (B, H).
    return_lse: also return the fp32 LSE, (H, total_q).
    check_seqlens: read the offsets back to check them against the packed lengths and the
        max_seqlen arguments (one device sync per call; skipped while torch.compile traces).
        Unchecked offsets that are wrong (past the packed length, negative, decreasing, or a
        sequence longer than max_seqlen) never make the kernels read or write outside the
        tensors: a sequence that does not lie within the packed rows is treated as empty, and
        rows past max_seqlen are not computed. The values of every output and gradient row
        that such a sequence covers, or that no sequence covers, are unspecified; the rows of
        the other sequences are exact.
    deterministic: as flash_attention.

    Returns out (total_q, H, D), or (out, lse).
    """
    q, k, v = _autocast_inputs(q, k, v)
    check_qkv_dtypes(q, k, v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D (total, H, D) for a varlen batch, got shape {tuple(t.shape)}")
    total_q, n_heads, head_dim = q.shape
    total_k, n_kv_heads = k.shape[0], k.shape[1]
    check_heads(n_heads, n_kv_heads, k.shape[2], v.shape[2])
    if head_dim != k.shape[2]:
        raise ValueError(f"q has head dim {head_dim} but k has {k.shape[2]}")
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    max_seqlen_q = check_seqlen_arg("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = check_seqlen_arg("max_seqlen_k", max_seqlen_k)
    batch = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q)
    batch_k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k)
    if batch_k != batch:
        raise ValueError(f"cu_seqlens_q holds {batch} sequences but cu_seqlens_k holds {batch_k}")
    # No sequence is longer than its packed tensor (the kernels empty one that would be): a larger
    # bound would only add empty programs to the grid.
    max_seqlen_q, max_seqlen_k = min(max_seqlen_q, total_q), min(max_seqlen_k, total_k)
    scale = check_softmax_scale(softmax_scale, head_dim)
    window_left, window_right = check_window(window_size, causal, max_seqlen_q, max_seqlen_k)
    check_alibi_slopes(alibi_slopes, batch, n_heads)
    for name, flag in (("return_lse", return_lse), ("check_seqlens", check_seqlens), ("deterministic", deterministic)):
        check_bool(name, flag)
    check_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, alibi_slopes=alibi_slopes)
    if check_seqlens and not is_compiling():
        check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q, total_q, max_seqlen_q)
        check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k, total_k, max_seqlen_k)
    # The kernels read the offsets as a contiguous array.
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    spec = AttentionSpec(
        batch, n_heads, n_kv_heads, head_dim, max_seqlen_q, max_seqlen_k, scale, window_left, window_right,
        alibi_slopes is not None, True, False, deterministic,
    )  # fmt: skip
    q, k, v = (_addressable(t, 0) for t in (q, k, v))
    out, lse = _apply(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec)
    return (out, lse) if return_lse else out
