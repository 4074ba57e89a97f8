"""nn.Module wrappers of the functional API."""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ._validation import check_choice, check_float, normalized_shape_tuple
from .ops.cross_entropy import cross_entropy
from .ops.linear_cross_entropy import WEIGHT_GRAD_MODES, linear_cross_entropy
from .ops.norm import add_dropout_norm, layer_norm, rms_norm
from .ops.softmax import log_softmax, softmax


class Softmax(torch.nn.Module):
    """Drop-in for torch.nn.Softmax(dim) on the fused kernel."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """Drop-in for torch.nn.LogSoftmax(dim) on the fused kernel."""

    def forward(self, x: Tensor) -> Tensor:
        return log_softmax(x, self.dim)


class LayerNorm(torch.nn.LayerNorm):
    """Drop-in for torch.nn.LayerNorm: same arguments, parameters and state_dict keys."""

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(torch.nn.Module):
    """Drop-in for torch.nn.RMSNorm (normalized_shape, eps=None, elementwise_affine=True,
    device=None, dtype=None): same parameters and state_dict keys.

    offset (ours): y = x * rstd * (offset + weight); the weight starts at 1 - offset, so the
    layer starts as a plain RMS normalization whatever the offset (offset=1: Gemma's `1 + w`).
    """

    def __init__(
        self,
        normalized_shape: Union[int, Sequence[int]],
        eps: Optional[float] = None,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
        *,
        offset: float = 0.0,
    ):
        super().__init__()
        self.normalized_shape = normalized_shape_tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.offset = check_float("offset", offset, -math.inf, math.inf)
        if elementwise_affine:
            self.weight = torch.nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.constant_(self.weight, 1.0 - self.offset)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, offset=self.offset)

    def extra_repr(self) -> str:
        offset = f", offset={self.offset}" if self.offset else ""
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}{offset}"


class AddDropoutNorm(torch.nn.Module):
    """`y, residual = norm(dropout(x) + residual)` in one kernel, for pre-norm and post-norm blocks.

    forward(x, residual=None, seed=None) -> (y, new_residual), as add_dropout_norm: new_residual
    is the sum (prenorm) or y (post-norm). Dropout applies in training mode only. Parameters
    (weight, and bias for LayerNorm) have the state_dict keys of torch.nn.LayerNorm / RMSNorm.
    """

    def __init__(
        self,
        hidden_size: int,
        norm: str = "layernorm",
        p: float = 0.0,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        prenorm: bool = True,
        residual_in_fp32: bool = False,
        offset: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.norm = check_choice("norm", norm, ("layernorm", "rmsnorm"))
        self.hidden_size = hidden_size
        self.p = check_float("p", p, 0.0, 1.0)
        self.eps = eps
        self.prenorm = prenorm
        self.residual_in_fp32 = residual_in_fp32
        self.offset = offset
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, **factory)) if elementwise_affine else None
        has_bias = elementwise_affine and bias and norm == "layernorm"
        self.bias = torch.nn.Parameter(torch.empty(hidden_size, **factory)) if has_bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            torch.nn.init.constant_(self.weight, 1.0 - self.offset)
        if self.bias is not None:
            torch.nn.init.zeros_(self.bias)

    def forward(
        self, x: Tensor, residual: Optional[Tensor] = None, seed: Optional[int] = None
    ) -> Tuple[Tensor, Tensor]:
        return add_dropout_norm(
            x, residual, self.weight, self.bias, self.p if self.training else 0.0, prenorm=self.prenorm,
            norm=self.norm, eps=self.eps, offset=self.offset, residual_in_fp32=self.residual_in_fp32, seed=seed,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"{self.hidden_size}, norm={self.norm!r}, p={self.p}, eps={self.eps}, prenorm={self.prenorm}, "
            f"residual_in_fp32={self.residual_in_fp32}"
        )


def _reject_unsupported(weight, size_average, reduce) -> None:
    if weight is not None:
        raise ValueError("weight: class weights are not supported (pass None)")
    if size_average is not None or reduce is not None:
        raise ValueError("size_average and reduce are deprecated in torch; pass reduction instead")


class CrossEntropyLoss(torch.nn.Module):
    """Drop-in for torch.nn.CrossEntropyLoss with class-index targets (ignore_index, reduction,
    label_smoothing), plus z-loss (lse_square_scale, return_z_loss), softcap, inplace_backward and
    check_targets, as cross_entropy. Class weights and the deprecated size_average / reduce raise ValueError."""

    def __init__(
        self,
        weight: Optional[Tensor] = None,
        size_average=None,
        ignore_index: int = -100,
        reduce=None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        *,
        lse_square_scale: float = 0.0,
        softcap: float = 0.0,
        return_z_loss: bool = False,
        inplace_backward: bool = False,
        check_targets: bool = False,
    ):
        super().__init__()
        _reject_unsupported(weight, size_average, reduce)
        self.ignore_index = ignore_index
        self.reduction = check_choice("reduction", reduction, ("mean", "sum", "none"))
        self.label_smoothing = label_smoothing
        self.lse_square_scale = lse_square_scale
        self.softcap = softcap
        self.return_z_loss = return_z_loss
        self.inplace_backward = inplace_backward
        self.check_targets = check_targets

    def forward(self, input: Tensor, target: Tensor) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        return cross_entropy(
            input, target, None, self.ignore_index, self.reduction, self.label_smoothing,
            lse_square_scale=self.lse_square_scale, softcap=self.softcap, return_z_loss=self.return_z_loss,
            inplace_backward=self.inplace_backward, check_targets=self.check_targets,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, label_smoothing={self.label_smoothing}, "
            f"lse_square_scale={self.lse_square_scale}, softcap={self.softcap}"
        )


class LinearCrossEntropyLoss(torch.nn.Module):
    """Cross-entropy of `hidden @ weight.T + bias` without the logits, as linear_cross_entropy.

    forward(hidden, weight, target, bias=None): the weight is an argument, so that a model's
    output layer (possibly tied to its embedding) keeps owning it.
    """

    def __init__(
        self,
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
    ):
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = check_choice("reduction", reduction, ("mean", "sum", "none"))
        self.label_smoothing = label_smoothing
        self.lse_square_scale = lse_square_scale
        self.softcap = softcap
        self.return_z_loss = return_z_loss
        self.chunk_size = chunk_size
        self.weight_grad = check_choice("weight_grad", weight_grad, WEIGHT_GRAD_MODES)
        self.check_targets = check_targets

    def forward(
        self, hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor] = None
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        return linear_cross_entropy(
            hidden, weight, target, bias, self.ignore_index, self.reduction, self.label_smoothing,
            lse_square_scale=self.lse_square_scale, softcap=self.softcap, return_z_loss=self.return_z_loss,
            chunk_size=self.chunk_size, weight_grad=self.weight_grad, check_targets=self.check_targets,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, label_smoothing={self.label_smoothing}, "
            f"lse_square_scale={self.lse_square_scale}, softcap={self.softcap}, chunk_size={self.chunk_size}, "
            f"weight_grad={self.weight_grad!r}"
        )
