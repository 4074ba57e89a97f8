"""Pure-PyTorch references in high precision; the tests and benchmarks compare against these."""

from __future__ import annotations

import torch


def softmax_reference(x: torch.Tensor, dim: int = -1, log: bool = False) -> torch.Tensor:
    """softmax / log_softmax computed in float64 on the upcast input."""
    x64 = x.double()
    return torch.log_softmax(x64, dim) if log else torch.softmax(x64, dim)
