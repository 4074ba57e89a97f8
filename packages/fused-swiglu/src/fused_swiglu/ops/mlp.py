"""FusedSwiGLUMLP: the LLaMA-style MLP, y = swiglu(x) @ w_down + b_down, forward and backward
(GeGLU, Gemma's MLP, with activation="gelu_tanh").

Forward: the fused gate/up/activation kernel writes h (and g, u for the backward); the down
projection is cuBLAS (torch.mm), the fastest honest choice for a plain matmul. h is not kept:
between forward and backward this MLP holds x, g and u (Liger-Kernel's MLP holds x, gate, up
and h), a quarter less activation memory.

Backward: dh = dy @ w_down^T is our kernel with the SwiGLU backward as its epilogue, so dh never
reaches memory: d_gate and d_up overwrite g and u, and h is rewritten for dw_down = h^T @ dy
(cuBLAS); then dx and (dw_gate, dw_up) as in FusedSwiGLU. Peak memory of a forward+backward is
then g, u, h and y, with no dh (Liger: gate, up, h, dh and y).

Autocast: as in FusedSwiGLU (ops/swiglu.py), the operands are cast inside the Function and the
gradients of w_gate, w_up and the biases are written in their parameters' dtypes; dw_down is
cuBLAS's, in the autocast dtype (autograd casts it to an fp32 w_down's dtype).
"""

from __future__ import annotations

from typing import Optional

import torch

from .._runtime.compat import custom_bwd, custom_fwd
from .._runtime.registration import eager_function_apply
from .._runtime.validation import FLOAT_DTYPES, check_device, check_optional_tensor, check_same_dtype, check_tensor
from .._validation import autocast_inputs, check_activation, check_vector
from .launchers import mlp_down_grad_, swiglu_input_grad
from .swiglu import (
    check_swiglu_operands,
    column_major,
    flat_rows,
    forward_launch,
    grad_dtypes,
    needs_autograd,
    weight_and_bias_grads,
    with_leading,
)


def check_down_projection(x, w_down, b_down, n: int) -> None:
    """w_down (d_intermediate, d_out >= 1) and b_down (d_out,) or None, in x's dtype."""
    check_tensor("w_down", w_down)
    check_optional_tensor("b_down", b_down)
    check_same_dtype("x", x, w_down=w_down, b_down=b_down)
    if w_down.dim() != 2 or w_down.shape[0] != n or w_down.shape[1] == 0:
        raise ValueError(
            f"w_down has shape {tuple(w_down.shape)}; expected (d_intermediate, d_out) with "
            f"d_intermediate = {n} and d_out >= 1"
        )
    if b_down is not None:
        check_vector("b_down", b_down, w_down.shape[1], "d_out")


def mlp_forward(ctx, x, w_gate, w_up, w_down, b_gate, b_up, b_down, activation) -> torch.Tensor:
    """FusedSwiGLUMLP's forward, and that of a call without autograd (ctx None)."""
    code = check_activation(activation)
    xc, wg, wu, wd, bg, bu, bd = autocast_inputs(x, w_gate, w_up, w_down, b_gate, b_up, b_down)
    has_bias = check_swiglu_operands(xc, wg, wu, bg, bu, FLOAT_DTYPES)
    check_down_projection(xc, wd, bd, wg.shape[1])
    check_device(x=xc, w_gate=wg, w_up=wu, w_down=wd, b_gate=bg, b_up=bu, b_down=bd)
    x2d = flat_rows(xc)
    save = ctx is not None and any(ctx.needs_input_grad)
    h, g, u = forward_launch(x2d, wg, wu, bg, bu, save, False, code)
    y = torch.mm(h, wd) if bd is None else torch.addmm(bd, h, wd)
    if save:
        ctx.save_for_backward(x2d, wg, wu, wd, g, u)
        ctx.activation = code
        # Before autocast's casts: the dtypes the weight and bias gradients are written in.
        ctx.grad_dtypes = grad_dtypes(w_gate, w_up, b_gate, b_up)
        ctx.weights_column_major = column_major(w_gate) and column_major(w_up)
        ctx.down_column_major = column_major(w_down)
        ctx.b_down_dtype = None if b_down is None else b_down.dtype
        ctx.leading, ctx.has_bias, ctx.has_down_bias = xc.shape[:-1], has_bias, bd is not None
    return with_leading(y, xc.shape[:-1])


class FusedSwiGLUMLP(torch.autograd.Function):
    """(act(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down. See `swiglu_mlp`."""

    @staticmethod
    @custom_fwd
    def forward(ctx, x, w_gate, w_up, w_down, b_gate=None, b_up=None, b_down=None, activation="silu"):
        return mlp_forward(ctx, x, w_gate, w_up, w_down, b_gate, b_up, b_down, activation)

    @staticmethod
    @custom_bwd
    def backward(ctx, dy):
        x2d, w_gate, w_up, w_down, g, u = ctx.saved_tensors
        need = ctx.needs_input_grad
        dy2d = flat_rows(dy)
        h = mlp_down_grad_(dy2d, w_down, g, u, ctx.activation)  # g, u now hold d_gate, d_up
        # In h's dtype, cast by autograd for an fp32 w_down: torch.mm's out_dtype is recent torch's, and not on CPU.
        # In w_down's layout when it is an nn.Linear weight's transposed view (column_major).
        dw_down = None
        if need[3]:
            dw_down = torch.mm(dy2d.t(), h).t() if ctx.down_column_major else torch.mm(h.t(), dy2d)
        del h
        db_down = dy2d.sum(0, dtype=ctx.b_down_dtype) if ctx.has_down_bias and need[6] else None
        dx = None
        if need[0]:
            dx = with_leading(swiglu_input_grad(g, u, w_gate, w_up, False), ctx.leading)
        grads = weight_and_bias_grads(ctx, x2d, g, u, need[1] or need[2], ctx.has_bias and (need[4] or need[5]))
        dw_gate, dw_up, db_gate, db_up = grads
        return dx, dw_gate, dw_up, dw_down, db_gate, db_up, db_down, None


_swiglu_mlp_apply = eager_function_apply(FusedSwiGLUMLP)


def swiglu_mlp(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    b_gate: Optional[torch.Tensor] = None,
    b_up: Optional[torch.Tensor] = None,
    b_down: Optional[torch.Tensor] = None,
    activation: str = "silu",
) -> torch.Tensor:
    """LLaMA-style MLP: (act(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down.

    x: (..., d_model), any leading dims, any strides.
    w_gate, w_up: (d_model, d_intermediate); w_down: (d_intermediate, d_out) (usually d_out =
    d_model); any strides. b_gate, b_up: (d_intermediate,) or None (both or neither);
    b_down: (d_out,) or None. activation: "silu" (SwiGLU, LLaMA) or "gelu_tanh" (GeGLU, Gemma), as
    for `swiglu`. dtypes and devices as for `swiglu`. Returns (..., d_out).
    """
    if needs_autograd(x, w_gate, w_up, w_down, b_gate, b_up, b_down):
        return _swiglu_mlp_apply(x, w_gate, w_up, w_down, b_gate, b_up, b_down, activation)
    return mlp_forward(None, x, w_gate, w_up, w_down, b_gate, b_up, b_down, activation)
