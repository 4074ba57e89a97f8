"""matmul / bmm with fused epilogues: validation, autocast, autograd.

Host path per call: the checks read each attribute once; without grad (inference, or no input
requiring grad) the forward launcher runs directly, with no autograd node; otherwise one
autograd.Function (the views to and from the kernels' 3-D operands taken inside it), whose
backward enters torch's autocast context only when the forward ran under autocast
(`_runtime.compat.custom_bwd`). The launchers then look up the problem's plan (ops.launch),
allocate the outputs and launch.

Autocast: operands of another dtype (fp32 parameters) enter GemmFunction as they are and are cast
inside it, so that each gradient is written in its operand's dtype by the kernel that computes
it: an fp32 weight's gradient is the matmul's fp32 accumulator, stored once, where a cast before
the Function would add a bf16 store and a cast-back kernel per parameter (autograd's ToCopy
backward). The bias joins the epilogue's fp32 sum unrounded.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from .._compat import tf32_allowed_by_torch
from .._runtime.compat import KERNEL_DEVICE_TYPE, autocast_dtype, custom_bwd, custom_fwd
from .._runtime.registration import eager_function_apply
from .._runtime.validation import check_device, check_same_dtype, check_tensor
from .._validation import check_activation, check_allow_tf32
from .custom_ops import gemm_backward_op, gemm_forward_op
from .gemm import SAVES_Z


def _as_3d(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """a and b as the kernels take them, in `dtype`: 3-D as given, or for matmul (b 2-D) a (..., K)
    as a (1, M, K) view (a copy only when its leading dims cannot be flattened into one stride)
    and b (K, N) as (1, K, N)."""
    a, b = _cast(a, dtype), _cast(b, dtype)
    if b.dim() == 3:
        return a, b
    a_shape = a.shape
    return a.reshape(1, math.prod(a_shape[:-1]), a_shape[-1]), b.unsqueeze(0)


class GemmFunction(torch.autograd.Function):
    """c = act(a @ b + bias) for a (batch, M, K), b (batch, K, N), bias (N,) or None; or, as matmul
    calls it, for a (..., K) and b (K, N) with c (..., N): the views between those shapes and the
    kernels' 3-D ones are taken inside the Function, so that autograd records one node.

    Saves a (when b needs a gradient), b, and what the backward needs for act'(Z): the
    pre-activation (GELU), the output (ReLU) or nothing; see ops.gemm.
    """

    @staticmethod
    @custom_fwd
    def forward(ctx, a, b, bias, activation: Optional[str], allow_tf32: bool, dtype: torch.dtype):
        # Gradients come back in each operand's own dtype and shape (the module docstring).
        ctx.grad_dtypes = (a.dtype, b.dtype, dtype if bias is None else bias.dtype)
        ctx.shapes = (a.shape, b.shape)
        a_shape = a.shape
        a, b = _as_3d(a, b, dtype)
        c, z = gemm_forward_op(a, b, bias, activation, True, allow_tf32)
        saved = z if activation in SAVES_Z else (c if activation == "relu" else None)
        # a only for db; b always (a weight, alive anyway; its layout shapes db).
        ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b, saved)
        ctx.activation = activation
        ctx.allow_tf32 = allow_tf32
        return c if len(ctx.shapes[1]) == 3 else c.view(*a_shape[:-1], c.shape[2])

    @staticmethod
    @custom_bwd
    def backward(ctx, dc):
        a, b, saved = ctx.saved_tensors
        need_da, need_db, need_dbias = ctx.needs_input_grad[:3]
        a_shape, b_shape = ctx.shapes
        if len(b_shape) == 2:
            dc = dc.reshape(1, math.prod(a_shape[:-1]), b_shape[1])
        da, db, dbias = gemm_backward_op(
            dc, a, b, saved, ctx.activation, need_da, need_db, need_dbias, ctx.allow_tf32, *ctx.grad_dtypes
        )
        if len(b_shape) == 2:
            da = da.view(a_shape) if need_da else None
            db = db[0] if need_db else None
        return (da if need_da else None, db if need_db else None, dbias if need_dbias else None, None, None, None)


_gemm_apply = eager_function_apply(GemmFunction)


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in `dtype` (itself when it has it: cheaper than Tensor.to's argument parsing)."""
    return t if t.dtype == dtype else t.to(dtype)


def _check_options(activation, allow_tf32) -> None:
    """The activation and TF32 arguments."""
    if activation is not None:
        check_activation(activation)
    if allow_tf32 is not None:
        check_allow_tf32(allow_tf32)


def _tf32(allow_tf32: Optional[bool], dtype: torch.dtype) -> bool:
    """Whether the product in `dtype` uses TF32: fp32 only (other dtypes do not read the flag, so
    they share one plan whatever it is), as asked, else as torch.backends.cuda.matmul.allow_tf32."""
    if dtype != torch.float32:
        return False
    return tf32_allowed_by_torch() if allow_tf32 is None else allow_tf32


def _check_bias(bias: Optional[torch.Tensor], n_out: int, what: str, name: str = "bias") -> None:
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != n_out):
        raise ValueError(f"{name} must have shape ({n_out},) ({what}), got {tuple(bias.shape)}")


def check_linear_operands(x, w, bias, names: Tuple[str, str, str] = ("x", "w", "bias")) -> None:
    """x (..., n), w (n, k) and bias (k,) or None, checked before any launch, each error naming
    its argument (`names`): tensors of a supported dtype, ranks, and the dims that must match."""
    x_name, w_name, bias_name = names
    check_tensor(x_name, x)
    check_tensor(w_name, w)
    if bias is not None:
        check_tensor(bias_name, bias)
    x_shape, w_shape = x.shape, w.shape
    if not x_shape:
        raise ValueError(f"{x_name} must have at least 1 dim (..., n), got a 0-dim tensor")
    if len(w_shape) != 2:
        raise ValueError(f"{w_name} must be 2-D (n, k), got shape {tuple(w_shape)}")
    if x_shape[-1] != w_shape[0]:
        raise ValueError(
            f"inner dimensions do not match: {x_name} has shape {tuple(x_shape)} (n = {x_shape[-1]}) but {w_name} "
            f"has shape {tuple(w_shape)} (n = {w_shape[0]}); pass an nn.Linear weight as weight.t()"
        )
    _check_bias(bias, w_shape[1], f"{w_name}.shape[1]", bias_name)


def _compute_dtype(**operands: Optional[torch.Tensor]) -> torch.dtype:
    """The dtype the kernels multiply in: autocast's where it is on (operands of other dtypes are
    cast to it), else the operands' one dtype (the first one's, by name); all on one device either way."""
    dtype = autocast_dtype(KERNEL_DEVICE_TYPE)
    if dtype is None:
        name, first = next(iter(operands.items()))
        check_same_dtype(name, first, **operands)
        dtype = first.dtype
    check_device(**operands)
    return dtype


def _apply(a, b, bias, activation, allow_tf32, dtype):
    """The forward through autograd when it must save for backward (grad mode on and an operand
    requiring grad), else the launcher alone; a and b in any dtype, multiplied in `dtype`, shaped
    as GemmFunction takes them."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad)):
        return _gemm_apply(a, b, bias, activation, allow_tf32, dtype)
    a_shape, linear = a.shape, b.dim() == 2
    a, b = _as_3d(a, b, dtype)
    c = gemm_forward_op(a, b, bias, activation, False, allow_tf32)[0]
    return c.view(*a_shape[:-1], c.shape[2]) if linear else c


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
    x, w and bias share one dtype (fp32, fp16, bf16); under torch.autocast x and w are multiplied
    in its dtype, as F.linear does, and each gradient comes back in its operand's dtype (an fp32
    weight's straight from the kernel). On a CUDA device (the CPU under TRITON_INTERPRET=1).
    Returns (..., k) in that dtype (autocast's under autocast); accumulation is fp32.
    """
    check_linear_operands(x, w, bias)
    _check_options(activation, allow_tf32)
    dtype = _compute_dtype(x=x, w=w, bias=bias)
    return _apply(x, w, bias, activation, _tf32(allow_tf32, dtype), dtype)


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
    check_tensor("a", a)
    check_tensor("b", b)
    if bias is not None:
        check_tensor("bias", bias)
    _check_options(activation, allow_tf32)
    a_shape, b_shape = a.shape, b.shape
    if len(a_shape) != 3 or len(b_shape) != 3:
        raise ValueError(
            f"a and b must be 3-D (batch, m, n) and (batch, n, k), got {tuple(a_shape)} and {tuple(b_shape)}"
        )
    if a_shape[0] != b_shape[0]:
        raise ValueError(f"batch sizes do not match: a has {a_shape[0]}, b has {b_shape[0]}")
    if a_shape[2] != b_shape[1]:
        raise ValueError(
            f"inner dimensions do not match: a has shape {tuple(a_shape)} (n = {a_shape[2]}) but b has shape "
            f"{tuple(b_shape)} (n = {b_shape[1]})"
        )
    _check_bias(bias, b_shape[2], "b.shape[2]")
    dtype = _compute_dtype(a=a, b=b, bias=bias)
    return _apply(a, b, bias, activation, _tf32(allow_tf32, dtype), dtype)
