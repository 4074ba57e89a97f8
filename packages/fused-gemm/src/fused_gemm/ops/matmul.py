"""matmul / bmm with fused epilogues: validation, autocast, autograd."""

from __future__ import annotations

import math
from typing import Optional

import torch

from .._compat import KERNEL_DEVICE_TYPE, autocast_dtype, custom_bwd, custom_fwd, tf32_allowed_by_torch
from .._validation import check_activation, check_allow_tf32, check_device, check_same_dtype, check_tensor
from .custom_ops import gemm_bwd_op, gemm_fwd_op
from .gemm import SAVES_DERIVATIVE


class GemmFunction(torch.autograd.Function):
    """c = act(a @ b + bias) for a (batch, M, K), b (batch, K, N), bias (N,) or None.

    Saves a, b and what the backward needs for act'(Z): the saved derivative (GELU), the output
    (ReLU) or nothing; see ops.gemm.
    """

    @staticmethod
    @custom_fwd
    def forward(ctx, a, b, bias, activation: Optional[str], allow_tf32: bool, training: bool):
        # training: grad mode is on and an input requires grad (inside forward, grad mode is always
        # off and needs_input_grad ignores torch.no_grad, so the caller decides).
        c, aux = gemm_fwd_op(a, b, bias, activation, training, allow_tf32)
        saved = aux if activation in SAVES_DERIVATIVE else (c if activation == "relu" else None)
        # a only for db; b always (a weight, alive anyway; its layout shapes db).
        ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b, saved)
        ctx.activation = activation
        ctx.allow_tf32 = allow_tf32
        return c

    @staticmethod
    @custom_bwd
    def backward(ctx, dc):
        a, b, saved = ctx.saved_tensors
        need_da, need_db, need_dbias = ctx.needs_input_grad[:3]
        da, db, dbias = gemm_bwd_op(dc, a, b, saved, ctx.activation, need_da, need_db, need_dbias, ctx.allow_tf32)
        return (da if need_da else None, db if need_db else None, dbias if need_dbias else None, None, None, None)


def _resolve_tf32(allow_tf32: Optional[bool]) -> bool:
    return tf32_allowed_by_torch() if allow_tf32 is None else allow_tf32


def _training(*tensors: Optional[torch.Tensor]) -> bool:
    """The forward must save for backward: grad mode is on and some operand requires grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _check_arguments(named: dict, activation, allow_tf32) -> None:
    """Type checks shared by matmul and bmm (the shape checks follow, the device check comes last)."""
    for name, t in named.items():
        if t is not None or name != "bias":
            check_tensor(name, t)
    check_activation(activation)
    check_allow_tf32(allow_tf32)


def _cast_and_check(named: dict) -> dict:
    """Under autocast every operand is cast to its dtype (as F.linear), else all must share one dtype."""
    dtype = autocast_dtype(KERNEL_DEVICE_TYPE)
    if dtype is not None:
        named = {name: (t.to(dtype) if t is not None else None) for name, t in named.items()}
    else:
        check_same_dtype(**named)
    check_device(**named)
    return named


def _check_bias(bias: Optional[torch.Tensor], n_out: int, what: str) -> None:
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n_out):
        raise ValueError(f"bias must have shape ({n_out},) ({what}), got {tuple(bias.shape)}")


def matmul(
    x: torch.Tensor,
    w: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    *,
    allow_tf32: Optional[bool] = None,
) -> torch.Tensor:
    """act(x @ w + bias), differentiable in x, w and bias.

    x: (..., n): any number of leading dims (flattened into the token dim M, so the weight
       gradient's reduction over all of them happens inside one kernel), any strides.
    w: (n, k), any strides: an nn.Linear weight (k, n) is passed as `weight.t()`, with no copy.
    bias: (k,) or None.
    activation: None, "relu", "gelu" (exact, erf) or "gelu_tanh" (tanh approximation).
    allow_tf32: fp32 inputs only: True multiplies through TF32 tensor cores, False in full fp32;
       None (default) follows torch.backends.cuda.matmul.allow_tf32 (False unless set).
    x, w and bias share one dtype (fp32, fp16, bf16); under torch.autocast they are cast to its
    dtype, as F.linear is. On a CUDA device (the CPU under TRITON_INTERPRET=1).
    Returns (..., k) in that dtype; accumulation is fp32.
    """
    _check_arguments({"x": x, "w": w, "bias": bias}, activation, allow_tf32)
    if x.dim() < 1:
        raise ValueError("x must have at least 1 dim (..., n), got a 0-dim tensor")
    if w.dim() != 2:
        raise ValueError(f"w must be 2-D (n, k), got shape {tuple(w.shape)}")
    if x.shape[-1] != w.shape[0]:
        raise ValueError(
            f"inner dimensions do not match: x has shape {tuple(x.shape)} (n = {x.shape[-1]}) but w has shape "
            f"{tuple(w.shape)} (n = {w.shape[0]}); pass an nn.Linear weight as weight.t()"
        )
    _check_bias(bias, w.shape[1], "w.shape[1]")
    ops = _cast_and_check({"x": x, "w": w, "bias": bias})
    x, w, bias = ops["x"], ops["w"], ops["bias"]
    tokens = math.prod(x.shape[:-1])
    # (1, M, n) view of x (a copy only when its leading dims cannot be flattened into one stride).
    a = x.reshape(1, tokens, x.shape[-1])
    training = _training(a, w, bias)
    c = GemmFunction.apply(a, w.unsqueeze(0), bias, activation, _resolve_tf32(allow_tf32), training)
    return c.view(*x.shape[:-1], w.shape[1])


def bmm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    *,
    allow_tf32: Optional[bool] = None,
) -> torch.Tensor:
    """act(a @ b + bias) per batch, differentiable in a, b and bias.

    a: (batch, m, n), b: (batch, n, k), any strides (transposed views included); bias: (k,) or None,
    added to every batch. activation, allow_tf32, dtypes and devices: as `matmul`.
    Returns (batch, m, k).
    """
    _check_arguments({"a": a, "b": b, "bias": bias}, activation, allow_tf32)
    if a.dim() != 3 or b.dim() != 3:
        raise ValueError(
            f"a and b must be 3-D (batch, m, n) and (batch, n, k), got {tuple(a.shape)} and {tuple(b.shape)}"
        )
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"batch sizes do not match: a has {a.shape[0]}, b has {b.shape[0]}")
    if a.shape[2] != b.shape[1]:
        raise ValueError(
            f"inner dimensions do not match: a has shape {tuple(a.shape)} (n = {a.shape[2]}) but b has shape "
            f"{tuple(b.shape)} (n = {b.shape[1]})"
        )
    _check_bias(bias, b.shape[2], "b.shape[2]")
    ops = _cast_and_check({"a": a, "b": b, "bias": bias})
    a, b, bias = ops["a"], ops["b"], ops["bias"]
    return GemmFunction.apply(a, b, bias, activation, _resolve_tf32(allow_tf32), _training(a, b, bias))
