"""mlp: y = act(x @ w1 + b1) @ w2 + b2 as one autograd Function, the activation's backward fused
into the product that feeds it.

Forward: the two products as matmul runs them (fc1 with its activation in the epilogue, saving z
for a GELU). Backward, for the upstream gradient dY, with H = act(Z1) the hidden activations:

    d(b2), dW2       dY's column sums; dW2^T = dY^T @ H            (as GemmFunction)
    dZ1, d(b1)       dY @ W2^T times act'(Z1), and its column sums: one launch, the TMA
                     kernel's GRAD_Z epilogue (ops.launch.launch_matmul_activation_grad)
    dX, dW1          dZ1 @ W1^T; dW1^T = dZ1^T @ X                 (as GemmFunction)

Two GemmFunctions in a row would write dH = dY @ W2^T, then read it back with Z1 in a separate
pass to write dZ1: two (tokens x d_hidden) memory passes more per MLP (kernels.grad).
Saved between forward and backward: X, Z1 (GELUs only) and H, as for the two Linears.
Autocast, gradient dtypes and torch.compile: as ops.matmul (custom ops while compiling).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .._runtime.compat import custom_bwd, custom_fwd
from .._runtime.registration import custom_op, eager_function_apply
from .._runtime.validation import check_tensor
from ..kernels.common import ACTIVATION_CODES
from .custom_ops import gemm_forward_op
from .gemm import SAVES_Z, _empty, _or_empty, gemm_backward, gemm_bwd_fake
from .launch import launch_activation_grad, launch_matmul_activation_grad
from .matmul import _as_3d, _cast, _check_bias, _check_options, _compute_dtype, _tf32, check_linear_operands


def mlp_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    w1: torch.Tensor,
    saved: torch.Tensor,
    h: torch.Tensor,
    w2: torch.Tensor,
    activation: Optional[str],
    need_dx: bool,
    need_dw1: bool,
    need_db1: bool,
    need_dw2: bool,
    need_db2: bool,
    allow_tf32: bool,
    x_dtype: torch.dtype,
    w1_dtype: torch.dtype,
    b1_dtype: torch.dtype,
    w2_dtype: torch.dtype,
    b2_dtype: torch.dtype,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dw1, db1, dw2, db2) for the upstream gradient dy (1, M, d_out); x (1, M, d_in), w1
    (1, d_in, d_hidden), h (1, M, d_hidden), w2 (1, d_hidden, d_out) as the forward multiplied them;
    saved: what act' needs (z for the GELUs, h for ReLU, unused without activation). Gradients
    not asked for are empty placeholders; the others in the given dtypes (module docstring)."""
    _, dw2, db2 = gemm_backward(
        dy, h, w2, None, None, False, need_dw2, need_db2, allow_tf32, dy.dtype, w2_dtype, b2_dtype
    )
    dx = dw1 = db1 = None
    if need_dx or need_dw1 or need_db1:
        code = ACTIVATION_CODES[activation]
        if code:
            dz1, db1 = launch_matmul_activation_grad(dy, w2.transpose(1, 2), saved, code, need_db1)
        else:  # dZ1 = dH: the plain product, then its column sums alone
            dz1, _, _ = gemm_backward(
                dy, None, w2, None, None, True, False, False, allow_tf32, dy.dtype, dy.dtype, dy.dtype
            )
            db1 = launch_activation_grad(dz1, None, 0, False, True, torch.float32)[1] if need_db1 else None
        db1 = None if db1 is None else _cast(db1, b1_dtype)
        dx, dw1, _ = gemm_backward(
            dz1, x, w1, None, None, need_dx, need_dw1, False, allow_tf32, x_dtype, w1_dtype, b1_dtype
        )
    return _or_empty(dy, dx, dw1, db1, dw2, db2)


def mlp_bwd_fake(dy, x, w1, saved, h, w2, activation, need_dx, need_dw1, need_db1, need_dw2, need_db2, allow_tf32,
                 x_dtype, w1_dtype, b1_dtype, w2_dtype, b2_dtype):  # fmt: skip
    _, dw2, db2 = gemm_bwd_fake(dy, h, w2, None, None, False, need_dw2, need_db2, allow_tf32, dy.dtype, w2_dtype,
                                b2_dtype)  # fmt: skip
    dz1 = torch.empty((1, dy.shape[1], w2.shape[1]), dtype=dy.dtype, device=dy.device)
    dx, dw1, _ = gemm_bwd_fake(dz1, x, w1, None, None, need_dx, need_dw1, False, allow_tf32, x_dtype, w1_dtype,
                               b1_dtype)  # fmt: skip
    db1 = torch.empty((w1.shape[2],), dtype=b1_dtype, device=dy.device) if need_db1 else _empty(dy)
    return dx, dw1, db1, dw2, db2


mlp_bwd_op = custom_op("fused_gemm::mlp_bwd", mlp_bwd_fake)(mlp_bwd)


def _forward(x, w1, b1, w2, b2, activation, save_z: bool, allow_tf32: bool):
    """(y, h, z): h = act(x @ w1 + b1) and y = h @ w2 + b2 for x (1, M, d_in), w1 (1, d_in, d_hidden)
    and w2 (1, d_hidden, d_out) in the compute dtype; z = x @ w1 + b1 when save_z and a GELU, else
    None (an empty placeholder while torch.compile traces)."""
    h, z = gemm_forward_op(x, w1, b1, activation, save_z, allow_tf32)
    y, _ = gemm_forward_op(h, w2, b2, None, False, allow_tf32)
    return y, h, z


class MLPFunction(torch.autograd.Function):
    """y = act(x @ w1 + b1) @ w2 + b2 for x (..., d_in), w1 (d_in, d_hidden), w2 (d_hidden, d_out),
    y (..., d_out); the kernels' 3-D views are taken inside, so that autograd records one node."""

    @staticmethod
    @custom_fwd
    def forward(ctx, x, w1, b1, w2, b2, activation: Optional[str], allow_tf32: bool, dtype: torch.dtype):
        ctx.grad_dtypes = tuple(
            dtype if t is None else t.dtype for t in (x, w1, b1, w2, b2)
        )  # gradients in each operand's own dtype (ops.matmul)
        ctx.x_shape = x_shape = x.shape
        x, w1 = _as_3d(x, w1, dtype)
        w2 = _cast(w2, dtype).unsqueeze(0)
        y, h, z = _forward(x, w1, b1, w2, b2, activation, True, allow_tf32)
        saved = z if activation in SAVES_Z else h
        ctx.save_for_backward(x, w1, saved if activation else None, h, w2)
        ctx.activation, ctx.allow_tf32 = activation, allow_tf32
        return y.view(*x_shape[:-1], y.shape[2])

    @staticmethod
    @custom_bwd
    def backward(ctx, dy):
        x, w1, saved, h, w2 = ctx.saved_tensors
        need = ctx.needs_input_grad
        dy = dy.reshape(x.shape[0], x.shape[1], dy.shape[-1])  # (1, M, d_out), as the kernels multiplied
        dx, dw1, db1, dw2, db2 = mlp_bwd_op(
            dy, x, w1, saved if saved is not None else h, h, w2, ctx.activation,
            need[0], need[1], need[2], need[3], need[4], ctx.allow_tf32, *ctx.grad_dtypes,
        )  # fmt: skip
        grads = (dx.view(ctx.x_shape) if need[0] else None, dw1[0] if need[1] else None, db1,
                 dw2[0] if need[3] else None, db2)  # fmt: skip
        return (*(g if n else None for g, n in zip(grads, need[:5])), None, None, None)


_mlp_apply = eager_function_apply(MLPFunction)


def mlp(
    x: torch.Tensor,
    w1: torch.Tensor,
    b1: Optional[torch.Tensor],
    w2: torch.Tensor,
    b2: Optional[torch.Tensor],
    activation: Optional[str] = "gelu",
    *,
    allow_tf32: Optional[bool] = None,
) -> torch.Tensor:
    """act(x @ w1 + b1) @ w2 + b2, differentiable in every operand; the activation's backward is
    fused into the second product's input gradient (module docstring).

    x: (..., d_in), any strides; w1: (d_in, d_hidden) and w2: (d_hidden, d_out), any strides
    (nn.Linear weights as weight.t(), no copy); b1: (d_hidden,) or None; b2: (d_out,) or None.
    activation, allow_tf32, dtypes, autocast and devices: as `matmul`. Returns (..., d_out).
    """
    check_linear_operands(x, w1, b1, ("x", "w1", "b1"))
    check_tensor("w2", w2)
    if w2.dim() != 2:
        raise ValueError(f"w2 must be 2-D (d_hidden, d_out), got shape {tuple(w2.shape)}")
    if w1.shape[1] != w2.shape[0]:
        raise ValueError(f"hidden dimensions do not match: w1 has shape {tuple(w1.shape)} but w2 has shape "
                         f"{tuple(w2.shape)}")  # fmt: skip
    if b2 is not None:
        check_tensor("b2", b2)
    _check_bias(b2, w2.shape[1], "w2.shape[1]", "b2")
    _check_options(activation, allow_tf32)
    dtype = _compute_dtype(x=x, w1=w1, b1=b1, w2=w2, b2=b2)
    tf32 = _tf32(allow_tf32, dtype)
    operands = (x, w1, b1, w2, b2)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in operands):
        return _mlp_apply(*operands, activation, tf32, dtype)
    x_shape = x.shape
    a, w1_3d = _as_3d(x, w1, dtype)
    y, _, _ = _forward(a, w1_3d, b1, _cast(w2, dtype).unsqueeze(0), b2, activation, False, tf32)
    return y.view(*x_shape[:-1], y.shape[2])
