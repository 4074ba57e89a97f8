"""Pure-PyTorch references in float64; the tests and benchmarks compare against these.

Each takes tensors of any float dtype, upcasts them to float64 and returns float64 results, so
that autograd through a reference gives float64 gradients.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor


def _f64(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.double()


def softmax_reference(x: Tensor, dim: int = -1, log: bool = False) -> Tensor:
    """softmax / log_softmax computed in float64 on the upcast input."""
    x64 = x.double()
    return torch.log_softmax(x64, dim) if log else torch.softmax(x64, dim)


def layer_norm_reference(
    x: Tensor,
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
    normalized_ndim: int = 1,
) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last `normalized_ndim` dims."""
    x = x.double()
    dims = tuple(range(-normalized_ndim, 0))
    mean = x.mean(dims, keepdim=True)
    var = (x - mean).square().mean(dims, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    return y


def rms_norm_reference(
    x: Tensor,
    weight: Optional[Tensor] = None,
    eps: float = 1e-6,
    offset: float = 0.0,
    bias: Optional[Tensor] = None,
    normalized_ndim: int = 1,
) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * (offset + weight) + bias over the last `normalized_ndim` dims."""
    x = x.double()
    dims = tuple(range(-normalized_ndim, 0))
    y = x / torch.sqrt(x.square().mean(dims, keepdim=True) + eps)
    if weight is not None:
        y = y * (offset + weight.double())
    if bias is not None:
        y = y + bias.double()
    return y


def add_dropout_norm_reference(
    x: Tensor,
    residual: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    keep: Optional[Tensor],
    p: float,
    *,
    prenorm: bool = True,
    norm: str = "layernorm",
    eps: float = 1e-5,
    offset: float = 0.0,
) -> Tuple[Tensor, Tensor]:
    """(y, new_residual) of s = x * keep / (1 - p) + residual, y = norm(s), in float64.

    keep: the boolean dropout mask (None: no dropout). new_residual is s (prenorm) or y.
    """
    s = x.double()
    if keep is not None:
        s = torch.where(keep, s / (1.0 - p), torch.zeros_like(s)) if p < 1.0 else s * 0.0
    if residual is not None:
        s = s + residual.double()
    if norm == "rmsnorm":
        y = rms_norm_reference(s, weight, eps, offset, bias)
    else:
        y = layer_norm_reference(s, weight, bias, eps)
    return (y, s) if prenorm else (y, y)


def cross_entropy_reference(
    logits: Tensor,
    target: Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float = 0.0,
) -> Tuple[Tensor, Tensor]:
    """(loss, z_loss) in float64 for logits (N, V) and class indices (N,).

    Per row: lse - (1 - eps) * x[target] - eps * mean(x) + z * lse^2, 0 for ignored rows; "mean"
    divides by the number of rows not ignored (NaN when there are none, as torch). softcap > 0:
    x = softcap * tanh(logits / softcap) (Gemma-2's final-logit softcapping).
    """
    x = logits.double()
    if softcap > 0:
        x = softcap * torch.tanh(x / softcap)
    n_classes = x.shape[-1]
    valid = target != ignore_index
    safe_target = torch.where(valid, target, torch.zeros_like(target)).long()
    lse = torch.logsumexp(x, dim=-1)
    target_logit = x.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)
    loss = lse - (1.0 - label_smoothing) * target_logit - label_smoothing * x.sum(-1) / n_classes
    z_loss = lse_square_scale * lse * lse
    zero = torch.zeros((), dtype=torch.float64, device=x.device)
    loss = torch.where(valid, loss + z_loss, zero)
    z_loss = torch.where(valid, z_loss, zero)
    if reduction == "none":
        return loss, z_loss
    if reduction == "sum":
        return loss.sum(), z_loss.sum()
    count = valid.sum()
    return loss.sum() / count, z_loss.sum() / count


def linear_cross_entropy_reference(
    hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor] = None, **options
) -> Tuple[Tensor, Tensor]:
    """cross_entropy_reference(hidden @ weight.T + bias, target, **options) in float64."""
    logits = hidden.double() @ weight.double().t()
    if bias is not None:
        logits = logits + bias.double()
    return cross_entropy_reference(logits, target, **options)
