"""Triton LayerNorm, RMSNorm, residual+dropout+norm, softmax, cross-entropy and fused linear+cross-entropy.

Public API (forward and backward, fp32/fp16/bf16):
- softmax(x, dim=-1), log_softmax(x, dim=-1); modules Softmax, LogSoftmax.
"""

from .modules import LogSoftmax, Softmax
from .ops.softmax import SoftmaxFunction, log_softmax, softmax

__version__ = "0.1.0"

__all__ = ["LogSoftmax", "Softmax", "SoftmaxFunction", "log_softmax", "softmax", "__version__"]
