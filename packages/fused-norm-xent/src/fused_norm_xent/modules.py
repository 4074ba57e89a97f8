"""nn.Module wrappers of the functional API."""

from __future__ import annotations

import torch

from .ops.softmax import log_softmax, softmax


class Softmax(torch.nn.Module):
    """Drop-in for torch.nn.Softmax(dim) on the fused kernel."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    """Drop-in for torch.nn.LogSoftmax(dim) on the fused kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return log_softmax(x, self.dim)
