"""FusedSwiGLU / FastAccumFusedSwiGLU autograd Functions and the functional `swiglu`.

Forward: one kernel, h = act(x @ w_gate) * (x @ w_up); x is read once for both matmuls. act is
silu (SwiGLU) or, with activation="gelu_tanh", the tanh-approximate GELU (GeGLU, as Gemma's MLP).
It saves g = x @ w_gate and u = x @ w_up (operand dtype) for the backward, not h.

Why save g and u rather than recompute them (H100, bf16, e.g. 16384 x 2048 -> 5632): writing
them costs two extra (M, N) stores in the forward epilogue and two reads in the backward, about
0.74 GB of traffic, ~0.25 ms at 3 TB/s; recomputing costs another 4*M*N*K flops (0.76 TFLOP,
~1.1 ms at ~700 TFLOP/s). Memory-wise, g and u are what Liger-Kernel keeps too (its
LigerSiLUMulFunction saves both gate and up), and the backward overwrites them in place with
d_gate and d_up, so the backward allocates no (M, N) buffer at all.

Backward: (1) d_gate, d_up from dh, g, u in one elementwise pass, written over g and u;
(2) dx = d_gate @ w_gate^T + d_up @ w_up^T as one matmul over a 2N reduction; (3) dw_gate,
dw_up = x^T @ (d_gate, d_up) in one kernel reducing over every leading dim. Only the
gradients that are needed are computed. Because g and u are overwritten, backpropagating twice
through the same graph (retain_graph=True) raises autograd's in-place modification error.

Autocast: the Functions take the operands as they are and cast them inside, so each weight's
and bias's gradient comes back in that operand's own dtype, written there by the kernel (or
the sum) that computes it: an fp32 weight's gradient is the weight-gradient kernel's fp32
accumulator, stored once, where a bf16 gradient would cost autograd a cast-back kernel per
parameter. dx is computed in the autocast dtype (autograd casts it to an fp32 x's dtype).
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from .._runtime.compat import custom_bwd, custom_fwd, is_compiling
from .._runtime.registration import eager_function_apply
from .._runtime.validation import (
    FLOAT_DTYPES,
    check_bool,
    check_device,
    check_optional_tensor,
    check_same_dtype,
    check_tensor,
)
from .._validation import autocast_inputs, check_activation, check_bias_pair, check_matrix
from .launchers import forward_outputs, swiglu_fwd, swiglu_grad_, swiglu_input_grad, swiglu_weight_grad


def needs_autograd(*tensors) -> bool:
    """Whether a call must go through its autograd Function: torch.compile traces it, or grad mode
    is on and an input requires grad (anything else runs the forward alone, saving nothing)."""
    if is_compiling():
        return True
    return torch.is_grad_enabled() and any(t is not None and getattr(t, "requires_grad", False) for t in tensors)


def check_swiglu_operands(x, w_gate, w_up, b_gate, b_up, dtypes: Sequence[torch.dtype]) -> bool:
    """Types, dtypes and shapes of the SwiGLU operands (after autocast's casts; not their devices).
    Returns whether there are biases."""
    check_tensor("x", x, dtypes)
    check_tensor("w_gate", w_gate)
    check_tensor("w_up", w_up)
    check_optional_tensor("b_gate", b_gate)
    check_optional_tensor("b_up", b_up)
    check_same_dtype("x", x, w_gate=w_gate, w_up=w_up, b_gate=b_gate, b_up=b_up)
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dim (..., d_model); got a 0-dim tensor")
    d_model = x.shape[-1]
    if d_model == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}: d_model (its last dim) must be >= 1")
    check_matrix("w_gate", w_gate, d_model, "d_model")
    check_matrix("w_up", w_up, d_model, "d_model", w_gate.shape[1])
    return check_bias_pair(b_gate, b_up, w_gate.shape[1])


def flat_rows(x: torch.Tensor) -> torch.Tensor:
    """x (..., d) as (M, d), every leading dim (none included) flattened into M; a 2-D x as is."""
    if x.dim() == 2:
        return x
    d = x.shape[-1]
    return x.reshape(x.numel() // d, d)


def with_leading(y2d: torch.Tensor, leading) -> torch.Tensor:
    """y2d (M, n) as (*leading, n), the inverse of flat_rows; as is for one leading dim."""
    return y2d if len(leading) == 1 else y2d.view(*leading, y2d.shape[1])


def forward_launch(x2d, w_gate, w_up, b_gate, b_up, save: bool, fp16_accumulate: bool, activation: int):
    """(h, g, u) of the fused forward: the launcher itself in eager mode, its custom op while
    torch.compile traces. `activation`: the ACTIVATION code (check_activation's)."""
    if is_compiling():
        return swiglu_fwd(x2d, w_gate, w_up, b_gate, b_up, save, fp16_accumulate, activation)
    return forward_outputs(x2d, w_gate, w_up, b_gate, b_up, save, fp16_accumulate, activation)


def grad_dtypes(w_gate, w_up, b_gate, b_up):
    """(dw dtype, db_gate dtype, db_up dtype) of the operands as passed (before autocast's casts):
    both weight gradients come from one kernel in one dtype, the wider of the two weights' (where
    they differ, autograd casts the other one down); each bias gradient in its bias's dtype."""
    dw = torch.promote_types(w_gate.dtype, w_up.dtype)
    return dw, *(None if b is None else b.dtype for b in (b_gate, b_up))


def column_major(w: torch.Tensor) -> bool:
    """Whether w (k, n) has strides (1, k): the transposed view of an nn.Linear's (n, k) weight.
    Its gradient is written in that layout, so that autograd hands the Linear's weight a
    contiguous gradient instead of copying a transposed one."""
    return w.shape[1] > 1 and w.stride(0) == 1 and w.stride(1) == w.shape[0]


def weight_and_bias_grads(ctx, x2d, d_gate, d_up, need_w: bool, need_b: bool):
    """(dw_gate, dw_up, db_gate, db_up) in the dtypes of ctx.grad_dtypes, None where not needed;
    the weight gradients in the weights' layout where both are column-major (column_major)."""
    dw_dtype, db_gate_dtype, db_up_dtype = ctx.grad_dtypes
    dw_gate, dw_up = (
        swiglu_weight_grad(x2d, d_gate, d_up, dw_dtype, ctx.weights_column_major) if need_w else (None, None)
    )
    if not need_b:
        return dw_gate, dw_up, None, None
    # Summed straight into the bias's dtype (in fp32 for an fp32 bias: no cast kernel after).
    return dw_gate, dw_up, d_gate.sum(0, dtype=db_gate_dtype), d_up.sum(0, dtype=db_up_dtype)


def swiglu_forward(ctx, x, w_gate, w_up, b_gate, b_up, fp16_accumulate: bool, dtypes, activation) -> torch.Tensor:
    """The forward of both Functions, and of a call without autograd (ctx None): autocast,
    checks, one kernel, and what the backward needs."""
    code = check_activation(activation)
    xc, wg, wu, bg, bu = autocast_inputs(x, w_gate, w_up, b_gate, b_up)
    has_bias = check_swiglu_operands(xc, wg, wu, bg, bu, dtypes)
    check_device(x=xc, w_gate=wg, w_up=wu, b_gate=bg, b_up=bu)
    x2d = flat_rows(xc)
    save = ctx is not None and any(ctx.needs_input_grad)
    h, g, u = forward_launch(x2d, wg, wu, bg, bu, save, fp16_accumulate, code)
    if save:
        ctx.save_for_backward(x2d, wg, wu, g, u)
        ctx.activation = code
        # Before autocast's casts: the dtypes the weight and bias gradients are written in.
        ctx.grad_dtypes = grad_dtypes(w_gate, w_up, b_gate, b_up)
        ctx.weights_column_major = column_major(w_gate) and column_major(w_up)
        ctx.leading, ctx.has_bias, ctx.fp16_accumulate = xc.shape[:-1], has_bias, fp16_accumulate
    return with_leading(h, xc.shape[:-1])


def swiglu_backward(ctx, dh: torch.Tensor, need_x: bool, need_w: bool, need_b: bool):
    """(dx, dw_gate, dw_up, db_gate, db_up), None where not needed."""
    x2d, w_gate, w_up, g, u = ctx.saved_tensors
    swiglu_grad_(flat_rows(dh), g, u, ctx.activation)  # g, u now hold d_gate, d_up
    dx = None
    if need_x:
        dx = with_leading(swiglu_input_grad(g, u, w_gate, w_up, ctx.fp16_accumulate), ctx.leading)
    return (dx, *weight_and_bias_grads(ctx, x2d, g, u, need_w, need_b))


class FusedSwiGLU(torch.autograd.Function):
    """act(x @ w_gate + b_gate) * (x @ w_up + b_up); fp32 accumulation. See `swiglu`."""

    @staticmethod
    @custom_fwd
    def forward(ctx, x, w_gate, w_up, b_gate=None, b_up=None, activation="silu"):
        return swiglu_forward(ctx, x, w_gate, w_up, b_gate, b_up, False, FLOAT_DTYPES, activation)

    @staticmethod
    @custom_bwd
    def backward(ctx, dh):
        need = ctx.needs_input_grad
        dx, dw_gate, dw_up, db_gate, db_up = swiglu_backward(
            ctx, dh, need[0], need[1] or need[2], ctx.has_bias and (need[3] or need[4])
        )
        return dx, dw_gate, dw_up, db_gate, db_up, None


_swiglu_apply = eager_function_apply(FusedSwiGLU)


class FastAccumFusedSwiGLU(torch.autograd.Function):
    """FusedSwiGLU on fp16 operands, optionally accumulating in fp16 (consumer GPUs).

    fp16_accumulate=True accumulates the forward matmuls and the input-gradient matmul in fp16
    (`tl.dot(..., out_dtype=tl.float16)`): on GPUs whose fp16-accumulate tensor-core rate is
    twice the fp32-accumulate one (GeForce), that is the fast path. The weight gradients,
    which reduce over every token, always accumulate in fp32. Precision: see the README.
    """

    @staticmethod
    @custom_fwd
    def forward(ctx, x, w_gate, w_up, fp16_accumulate=False, b_gate=None, b_up=None, activation="silu"):
        check_bool("fp16_accumulate", fp16_accumulate)
        return swiglu_forward(ctx, x, w_gate, w_up, b_gate, b_up, fp16_accumulate, (torch.float16,), activation)

    @staticmethod
    @custom_bwd
    def backward(ctx, dh):
        need = ctx.needs_input_grad
        dx, dw_gate, dw_up, db_gate, db_up = swiglu_backward(
            ctx, dh, need[0], need[1] or need[2], ctx.has_bias and (need[4] or need[5])
        )
        return dx, dw_gate, dw_up, None, db_gate, db_up, None


def swiglu(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    b_gate: Optional[torch.Tensor] = None,
    b_up: Optional[torch.Tensor] = None,
    activation: str = "silu",
) -> torch.Tensor:
    """act(x @ w_gate + b_gate) * (x @ w_up + b_up), differentiable, gate/up/activation fused.

    x: (..., d_model), any leading dims (none included), any strides.
    w_gate, w_up: (d_model, d_intermediate), any strides.
    b_gate, b_up: (d_intermediate,) or None (both or neither).
    activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU: torch.nn.functional.gelu(g, approximate="tanh"),
    transformers' gelu_pytorch_tanh, as in Gemma's MLP).
    All of one dtype: bf16 or fp16 (fp32 accumulation), or fp32 (fp32 matmuls; TF32 only when
    torch.backends.cuda.matmul.allow_tf32 is set, as for torch's own). Under torch.autocast the
    inputs are cast to its dtype first, as F.linear's are. On a CUDA device (the CPU under
    TRITON_INTERPRET=1). Returns (..., d_intermediate) in that dtype. Under autocast each weight
    and bias gradient comes back in its parameter's dtype (fp32 for an fp32 parameter), written
    in it by the kernel that computes it (the module docstring).
    """
    if needs_autograd(x, w_gate, w_up, b_gate, b_up):
        return _swiglu_apply(x, w_gate, w_up, b_gate, b_up, activation)
    return swiglu_forward(None, x, w_gate, w_up, b_gate, b_up, False, FLOAT_DTYPES, activation)
