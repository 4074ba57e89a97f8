"""Triton LayerNorm, RMSNorm, residual+dropout+norm, softmax, cross-entropy and fused linear+cross-entropy.

Public API (forward and backward, fp32/fp16/bf16):
- layer_norm, rms_norm; modules LayerNorm, RMSNorm (drop-ins for torch.nn's).
- add_dropout_norm(x, residual, weight, bias, p, prenorm=..., norm=...) -> (y, new_residual);
  module AddDropoutNorm.
- softmax(x, dim=-1), log_softmax(x, dim=-1); modules Softmax, LogSoftmax.
- cross_entropy(logits, target, ...); module CrossEntropyLoss.
- linear_cross_entropy(hidden, weight, target, bias=None, ...); module LinearCrossEntropyLoss.
"""

from .modules import (
    AddDropoutNorm,
    CrossEntropyLoss,
    LayerNorm,
    LinearCrossEntropyLoss,
    LogSoftmax,
    RMSNorm,
    Softmax,
)
from .ops.cross_entropy import CrossEntropyFunction, cross_entropy
from .ops.linear_cross_entropy import LinearCrossEntropyFunction, linear_cross_entropy
from .ops.norm import AddDropoutNormFunction, NormFunction, add_dropout_norm, layer_norm, rms_norm
from .ops.softmax import SoftmaxFunction, log_softmax, softmax

__version__ = "0.4.0"

__all__ = [
    "AddDropoutNorm",
    "AddDropoutNormFunction",
    "CrossEntropyFunction",
    "CrossEntropyLoss",
    "LayerNorm",
    "LinearCrossEntropyFunction",
    "LinearCrossEntropyLoss",
    "LogSoftmax",
    "NormFunction",
    "RMSNorm",
    "Softmax",
    "SoftmaxFunction",
    "__version__",
    "add_dropout_norm",
    "cross_entropy",
    "layer_norm",
    "linear_cross_entropy",
    "log_softmax",
    "rms_norm",
    "softmax",
]
