"""Autograd and the public functional API: flash_attention, flash_attention_varlen.

Eager host path, per call: one plan lookup, keyed by everything the checks and the kernels'
launches read (shapes, strides, dtypes, devices, 16-byte alignment, options and their types);
building a plan runs the checks, so a cached plan stands for checks that passed. The plan holds
the forward plan of that layout (ops/launch.py), which allocates O and the LSE and launches;
`FlashAttentionFunction` runs it and, in the backward, the backward plan of the gradient's
layout; without an input that needs a gradient the forward runs with no autograd node.

While torch.compile traces, the checks run as they are and the launchers are reached through
the custom ops `fused_attention::attention_fwd` and `fused_attention::attention_bwd` (fake
implementations and registered autograd, the runtime's differentiable_op), so
`torch.compile(fullgraph=True)` sees no graph break.

(No typing-from-the-future import here: torch infers the custom ops' schemas from the
annotations of their launchers.)
"""

from typing import List, NamedTuple, Optional, Tuple

import torch
from torch.autograd.function import once_differentiable

from .._runtime.compat import autocast_dtype, custom_bwd, custom_fwd, is_compiling
from .._runtime.dropout import check_seed, dropout_rng
from .._runtime.registration import differentiable_op, eager_function_apply
from .._validation import (
    check_alibi_slopes,
    check_bool,
    check_cu_seqlens,
    check_cu_seqlens_values,
    check_device,
    check_dropout_p,
    check_heads,
    check_int,
    check_layout,
    check_qkv_dtypes,
    check_softcap,
    check_softmax_scale,
    check_window,
)
from .launch import (
    AttentionSpec,
    ForwardPlan,
    addressable,
    attention_bwd,
    attention_fwd,
    call_plan_cache,
    contiguous_strides,
    layout_plan,
    lse_shape,
)


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd of the attention kernels on inputs laid out as `plan` (ops.launch.forward_plan)
    says: saves q, k, v, O and the fp32 LSE; differentiable in q, k, v and through both outputs (a
    gradient of the LSE enters the backward as delta -= dLSE)."""

    @staticmethod
    @custom_fwd
    def forward(ctx, q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng, plan: ForwardPlan):
        out, lse = plan.forward(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng)
        ctx.save_for_backward(q, k, v, out, lse)
        # Inputs without gradients, never modified by the kernels, and the plan: kept on ctx
        # directly (fewer saved-tensor unpacks in the backward).
        ctx.extras = (alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng, plan)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @custom_bwd
    def backward(ctx, dout, dlse):
        if torch.is_grad_enabled():  # create_graph=True: a second backward through this one must raise
            return _backward_once(ctx, dout, dlse)
        return _backward(ctx, dout, dlse)


_attention_apply = eager_function_apply(FlashAttentionFunction)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng, plan = ctx.extras
    dq, dk, dv = plan.backward(dout, dlse, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng=rng)
    return dq, dk, dv, None, None, None, None, None


_backward_once = once_differentiable(_backward)


# The launchers as custom ops, for torch.compile: the spec travels as ints and floats.


def _op_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alibi_slopes: Optional[torch.Tensor],
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    rng: Optional[torch.Tensor],
    spec_ints: List[int],
    spec_floats: List[float],
) -> Tuple[torch.Tensor, torch.Tensor]:
    spec = AttentionSpec.from_op_args(spec_ints, spec_floats)
    return attention_fwd(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec, rng=rng)


def _op_forward_fake(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng, spec_ints, spec_floats):
    spec = AttentionSpec.from_op_args(spec_ints, spec_floats)
    lse = q.new_empty(lse_shape(spec, q.shape[0]), dtype=torch.float32)
    return torch.empty_like(q, memory_format=torch.contiguous_format), lse


def _op_backward(
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
    rng: Optional[torch.Tensor],
    spec_ints: List[int],
    spec_floats: List[float],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    spec = AttentionSpec.from_op_args(spec_ints, spec_floats)
    return attention_bwd(dout, q, k, v, out, lse, dlse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, spec, rng=rng)


def _op_backward_fake(dout, dlse, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng, ints, floats):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _op_setup_context(ctx, inputs, output):
    q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng, spec_ints, spec_floats = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng)
    ctx.spec = (spec_ints, spec_floats)


def _op_backward_rule(ctx, grads, backward, eager):
    dout, dlse = grads
    q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = backward(dout, dlse, q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng, *ctx.spec)
    return dq, dk, dv, None, None, None, None, None, None


AttentionOpFunction, _attention_op = differentiable_op(
    "fused_attention::attention",
    forward=_op_forward,
    fake_forward=_op_forward_fake,
    backward=_op_backward,
    fake_backward=_op_backward_fake,
    setup_context=_op_setup_context,
    backward_rule=_op_backward_rule,
    n_differentiable_outputs=2,
    differentiable_args=(0, 1, 2),
)


def _addressable(t: torch.Tensor, seq_dim: int) -> torch.Tensor:
    """t, or a contiguous copy where the kernels cannot address t through its strides
    (launch.addressable: a unit-stride head dim, positions at most 2^24 elements apart)."""
    return t if addressable(t.stride(), seq_dim) else t.contiguous()


def _traced(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng, spec: AttentionSpec):
    """(out, lse) through the custom op, while torch.compile traces (checks already run)."""
    q, k, v = (_addressable(t, spec.seq_dim) for t in (q, k, v))
    return _attention_op(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng, *spec.to_op_args())


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


class CallPlan(NamedTuple):
    """What a public function's checks decided for one argument key: the forward plan, and which
    inputs (q, k, v; or the packed qkv) are copied first (None: none; see launch.addressable)."""

    forward: ForwardPlan
    copies: Optional[Tuple[bool, ...]]


def call_plan(tensors, alibi_slopes, spec: AttentionSpec, shapes=None, strides=None) -> CallPlan:
    """The CallPlan of validated q, k, v (`tensors`): the forward plan of their layout once each
    tensor the kernels cannot address is copied. shapes, strides: the tensors' (views of a packed
    tensor that is copied whole pass their shapes and the copy's strides)."""
    shapes = shapes or [t.shape for t in tensors]
    strides = strides or [t.stride() for t in tensors]
    copies = tuple(not addressable(s, spec.seq_dim) for s in strides)
    strides = [contiguous_strides(shape) if copy else s for shape, s, copy in zip(shapes, strides, copies)]
    aligned = all(copy or t.data_ptr() % 16 == 0 for t, copy in zip(tensors, copies))
    q = tensors[0]
    plan = layout_plan(
        spec, q.dtype, q.device, tuple(shapes[0]), tuple(shapes[1]), *strides,
        None if alibi_slopes is None else alibi_slopes.stride(), aligned, None,
    )  # fmt: skip
    return CallPlan(plan, copies if any(copies) else None)


def _copied(copies: Tuple[bool, ...], *tensors) -> tuple:
    return tuple(t.contiguous() if copy else t for t, copy in zip(tensors, copies))


def _option_key(causal, softmax_scale, window_size, deterministic, softcap, dropout_p) -> tuple:
    """The options with their types (an equal value of the wrong type must reach the checks: 1 for
    True, (True, 0) for (1, 0)); raises for options that no check would pass."""
    return (
        causal, causal.__class__, softmax_scale, softmax_scale.__class__, tuple(window_size),
        window_size[0].__class__, window_size[1].__class__, deterministic, deterministic.__class__, softcap,
        softcap.__class__, dropout_p, dropout_p.__class__,
    )  # fmt: skip


def _slopes_key(alibi_slopes):
    if alibi_slopes is None:
        return None
    return alibi_slopes.shape, alibi_slopes.stride(), alibi_slopes.dtype, alibi_slopes.device


def publish(cache, key, build_fn, *args):
    """build_fn(*args) (which runs the checks), published in `cache` under `key` (None: a key could
    not be made of the arguments, whose checks then raise; nothing is published)."""
    plan = build_fn(*args)
    return plan if key is None else cache.publish(key, plan)


def lookup(cache, key_fn, build_fn, *args):
    """cache's plan for key_fn(*args), or build_fn(*args) published there. Arguments that no key
    can be made of (a non-tensor, an unhashable option) go straight to build_fn, whose checks name
    them."""
    try:
        key = key_fn(*args)
        plan = cache.get(key)
    except Exception:
        key = plan = None
    return publish(cache, key, build_fn, *args) if plan is None else plan


# ---------------------------------------------------------------------------------------------
# flash_attention


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
    softcap: float = 0.0,
    dropout_p: float = 0.0,
    seed: Optional[int] = None,
    seed_offset: int = 0,
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
    softcap: 0 for none; positive: the scaled scores are capped as Gemma-2's attention does,
        softcap * tanh(q.k * softmax_scale / softcap), before the ALiBi bias and the masks.
    dropout_p: in [0, 1): each attention weight is dropped with this probability and the kept ones
        scaled by 1 / (1 - p) (applied whenever positive, as FlashAttention's; pass 0 in eval).
        The LSE stays that of the undropped softmax.
    seed, seed_offset: the dropout mask's Philox key. seed None: drawn from torch's generator on
        q's device (torch.manual_seed repeats it; a CUDA-graph replay draws a new one); an int in
        [0, 2^63) fixes the mask, and seed_offset (in [0, 2^32)) selects another for the same seed.
        The backward regenerates the mask; nothing of the size of the scores is stored.

    Returns out, or (out, lse). A query that sees no key gets out = 0 and lse = -inf. Under
    torch.autocast, fp32 inputs are cast to the autocast dtype first.
    """
    if return_lse.__class__ is not bool:
        check_bool("return_lse", return_lse)
    check_seed(seed, seed_offset)
    q, k, v = _autocast_inputs(q, k, v)
    if is_compiling():
        spec = _check_dense(
            q, k, v, causal, softmax_scale, alibi_slopes, window_size, layout, deterministic, softcap, dropout_p
        )
        rng = dropout_rng(q.device, seed, seed_offset) if spec.dropout_p else None
        out, lse = _traced(q, k, v, alibi_slopes, None, None, rng, spec)
    else:
        try:  # the plan key, built inline (the hot path): _dense_key's
            key = (
                q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
                k.device, v.device, not (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15,
                None if alibi_slopes is None else _slopes_key(alibi_slopes), layout, causal, causal.__class__,
                softmax_scale, softmax_scale.__class__, tuple(window_size), window_size[0].__class__,
                window_size[1].__class__, deterministic, deterministic.__class__, softcap, softcap.__class__,
                dropout_p, dropout_p.__class__,
            )  # fmt: skip
            plan = _DENSE_PLANS.get(key)
        except Exception:  # a non-tensor or an unhashable option: the checks name the culprit
            key = plan = None
        if plan is None:
            plan = publish(_DENSE_PLANS, key, _dense_plan, q, k, v, causal, softmax_scale, alibi_slopes,
                           window_size, layout, deterministic, softcap, dropout_p)  # fmt: skip
        rng = dropout_rng(q.device, seed, seed_offset) if plan.forward.spec.dropout_p else None
        if plan.copies is not None:
            q, k, v = _copied(plan.copies, q, k, v)
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            out, lse = _attention_apply(q, k, v, alibi_slopes, None, None, rng, plan.forward)
        else:
            out, lse = plan.forward.forward(q, k, v, alibi_slopes, None, None, rng)
    return (out, lse) if return_lse else out


_DENSE_PLANS = call_plan_cache()


def _dense_plan(
    q, k, v, causal, softmax_scale, alibi_slopes, window_size, layout, deterministic, softcap, dropout_p
) -> CallPlan:  # fmt: skip
    spec = _check_dense(
        q, k, v, causal, softmax_scale, alibi_slopes, window_size, layout, deterministic, softcap, dropout_p
    )
    return call_plan((q, k, v), alibi_slopes, spec)


def _check_dense(
    q, k, v, causal, softmax_scale, alibi_slopes, window_size, layout, deterministic, softcap, dropout_p
) -> AttentionSpec:  # fmt: skip
    """flash_attention's checks, in order (the device last); returns the call's spec."""
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
    softcap = check_softcap(softcap, scale)
    dropout_p = check_dropout_p(dropout_p)
    check_device(q=q, k=k, v=v, alibi_slopes=alibi_slopes)
    return AttentionSpec(
        batch, n_heads, n_kv_heads, head_dim, seqlen_q, seqlen_k, scale, window_left, window_right,
        alibi_slopes is not None, False, bhsd, deterministic, softcap, dropout_p,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# flash_attention_varlen


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
    softcap: float = 0.0,
    dropout_p: float = 0.0,
    seed: Optional[int] = None,
    seed_offset: int = 0,
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
    deterministic, softcap, dropout_p, seed, seed_offset: as flash_attention (the dropout mask of
        sequence b is that of batch row b of a dense call).

    Returns out (total_q, H, D), or (out, lse).
    """
    q, k, v = _autocast_inputs(q, k, v)
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, alibi_slopes,
            window_size, return_lse, check_seqlens, deterministic, softcap, dropout_p)  # fmt: skip
    check_seed(seed, seed_offset)
    if is_compiling():
        spec = _check_varlen(*args)
        rng = dropout_rng(q.device, seed, seed_offset) if spec.dropout_p else None
        out, lse = _traced(q, k, v, alibi_slopes, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), rng, spec)
        return (out, lse) if return_lse else out
    plan = lookup(_VARLEN_PLANS, _varlen_key, _varlen_plan, *args)
    forward = plan.forward
    if check_seqlens:  # after every other check, the device's included
        spec = forward.spec
        check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q, forward.q_shape[0], spec.max_seqlen_q)
        check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k, forward.k_shape[0], spec.max_seqlen_k)
    # The kernels read the offsets as a contiguous array.
    cu_seqlens_q, cu_seqlens_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    if plan.copies is not None:
        q, k, v = _copied(plan.copies, q, k, v)
    rng = dropout_rng(q.device, seed, seed_offset) if forward.spec.dropout_p else None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        out, lse = _attention_apply(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng, forward)
    else:
        out, lse = forward.forward(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng)
    return (out, lse) if return_lse else out


_VARLEN_PLANS = call_plan_cache()


def _offsets_key(t) -> tuple:
    return t.shape, t.dtype, t.device


def _varlen_key(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, alibi_slopes,
    window_size, return_lse, check_seqlens, deterministic, softcap, dropout_p,
) -> tuple:  # fmt: skip
    return (
        q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device, k.device,
        v.device, not (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15, _offsets_key(cu_seqlens_q),
        _offsets_key(cu_seqlens_k), max_seqlen_q, max_seqlen_q.__class__, max_seqlen_k, max_seqlen_k.__class__,
        _slopes_key(alibi_slopes), return_lse.__class__, check_seqlens.__class__,
        *_option_key(causal, softmax_scale, window_size, deterministic, softcap, dropout_p),
    )  # fmt: skip


def _varlen_plan(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, alibi_slopes,
    window_size, return_lse, check_seqlens, deterministic, softcap, dropout_p,
) -> CallPlan:  # fmt: skip
    spec = _check_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, alibi_slopes,
        window_size, return_lse, check_seqlens, deterministic, softcap, dropout_p,
    )  # fmt: skip
    return call_plan((q, k, v), alibi_slopes, spec)


def _check_varlen(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale, alibi_slopes,
    window_size, return_lse, check_seqlens, deterministic, softcap, dropout_p,
) -> AttentionSpec:  # fmt: skip
    """flash_attention_varlen's checks, in order (the device last; the offsets' values are read by
    the caller after them); returns the call's spec."""
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
    max_seqlen_q = check_int("max_seqlen_q", max_seqlen_q, 0)
    max_seqlen_k = check_int("max_seqlen_k", max_seqlen_k, 0)
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
    softcap = check_softcap(softcap, scale)
    dropout_p = check_dropout_p(dropout_p)
    check_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, alibi_slopes=alibi_slopes)
    return AttentionSpec(
        batch, n_heads, n_kv_heads, head_dim, max_seqlen_q, max_seqlen_k, scale, window_left, window_right,
        alibi_slopes is not None, True, False, deterministic, softcap, dropout_p,
    )  # fmt: skip
