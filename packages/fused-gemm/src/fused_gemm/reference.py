"""Pure-PyTorch references; the tests and benchmarks compare against these.

They compute in the dtype of their inputs: the tests pass float64 copies for the reference and
the low-precision tensors themselves for PyTorch's own low-precision result (the baseline of the
tolerance rule); the benchmarks time them as the unfused torch sequence.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def activation_reference(z: torch.Tensor, activation: Optional[str]) -> torch.Tensor:
    if activation is None:
        return z
    if activation == "relu":
        return torch.relu(z)
    if activation == "gelu":
        return F.gelu(z)
    if activation == "gelu_tanh":
        return F.gelu(z, approximate="tanh")
    raise ValueError(f"unknown activation {activation!r}")


def matmul_reference(
    x: torch.Tensor, w: torch.Tensor, bias: Optional[torch.Tensor] = None, activation: Optional[str] = None
) -> torch.Tensor:
    """act(x @ w + bias) for x (..., n), w (n, k), bias (k,): torch.matmul, then the epilogue ops."""
    z = torch.matmul(x, w)
    if bias is not None:
        z = z + bias
    return activation_reference(z, activation)


def bmm_reference(
    a: torch.Tensor, b: torch.Tensor, bias: Optional[torch.Tensor] = None, activation: Optional[str] = None
) -> torch.Tensor:
    """act(a @ b + bias) for a (batch, m, n), b (batch, n, k), bias (k,)."""
    z = torch.bmm(a, b)
    if bias is not None:
        z = z + bias
    return activation_reference(z, activation)
