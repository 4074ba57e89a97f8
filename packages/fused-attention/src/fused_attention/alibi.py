"""The standard ALiBi slopes (Press et al., "Train Short, Test Long"), as FlashAttention uses them."""

from __future__ import annotations

import math
from typing import List

import torch

from ._validation import check_int


def _slopes(n_heads: int) -> List[float]:
    if n_heads & (n_heads - 1) == 0:
        # A power of two: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8).
        start = 2.0 ** (-8.0 / n_heads)
        return [start ** (i + 1) for i in range(n_heads)]
    # Otherwise: the slopes of the largest power of two below, then every other slope of twice that.
    closest = 2 ** math.floor(math.log2(n_heads))
    return _slopes(closest) + _slopes(2 * closest)[0::2][: n_heads - closest]


def alibi_slopes(n_heads: int, device=None) -> torch.Tensor:
    """(n_heads,) fp32 ALiBi slopes for any head count, on `device`.

    For n_heads a power of two they are 2^(-8 i / n_heads), i = 1..n_heads; otherwise the slopes of
    the nearest lower power of two followed by every other slope of the next higher one.
    """
    check_int("n_heads", n_heads, 1)
    return torch.tensor(_slopes(n_heads), dtype=torch.float32, device=device)
