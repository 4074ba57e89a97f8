"""Position encodings in plain PyTorch: rotary angles and rotation, ALiBi slopes and biases.

The reference formulas the twin model computes with; the Triton model gets the same values
from the kernel packages, and the tests compare the two.
"""

from __future__ import annotations

import math
from typing import List, Tuple

import torch


def rope_angles(seq_len: int, head_dim: int, base: float, device=None) -> torch.Tensor:
    """Rotation angles (seq_len, head_dim) fp32 for rotate-half (NeoX / LLaMA) pairs.

    Column j and j + head_dim/2 form a pair and share the angle pos * base^(-2j/head_dim): the
    TransformerEngine `freqs` layout (cat(angles, angles)) without its two unit dims.
    """
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)  # (S, D/2)
    return torch.cat((angles, angles), dim=-1)  # (S, D)


def rope_cos_sin(seq_len: int, head_dim: int, base: float, device=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (seq_len, head_dim) fp32 of the rotate-half angles (rope_angles)."""
    angles = rope_angles(seq_len, head_dim, base, device)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, S, H, D) by cos, sin (S, D) or (B, S, D): x * cos + rotate_half(x) * sin, in x's dtype (as HF)."""
    cos, sin = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)  # ([B,] S, 1, D): broadcast over heads
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)  # rotate_half
    return x * cos + rotated * sin


def alibi_slopes(n_head: int) -> List[float]:
    """The standard geometric ALiBi slopes (Press et al.) for any head count.

    For a power of two n: 2^(-8/n), 2^(-16/n), ...; otherwise the slopes of the nearest lower
    power of two followed by every other slope of the next power of two.
    """

    def power_of_two(n: int) -> List[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_head).is_integer():
        return power_of_two(n_head)
    lower = 2 ** math.floor(math.log2(n_head))
    return power_of_two(lower) + power_of_two(2 * lower)[0::2][: n_head - lower]


def alibi_slopes_tensor(n_head: int, device=None) -> torch.Tensor:
    """alibi_slopes(n_head) as an fp32 (H,) tensor computed on `device` (no host-to-device copy,
    which would synchronize the stream every forward)."""
    lower = 2 ** math.floor(math.log2(n_head))
    i = torch.arange(1, lower + 1, device=device, dtype=torch.float32)
    slopes = torch.exp2(-8.0 / lower * i)  # the power of two's slopes: 2^(-8i/lower)
    if lower == n_head:
        return slopes
    j = torch.arange(1, 2 * (n_head - lower), 2, device=device, dtype=torch.float32)
    return torch.cat((slopes, torch.exp2(-8.0 / (2 * lower) * j)))  # odd slopes of twice the heads


def alibi_causal_bias(slopes: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Additive attention bias (H, S, S): -slope * (i - j) for keys j <= query i, -inf above.

    slopes: (H,) fp32. The causal mask is part of the bias, so SDPA runs with is_causal=False.
    """
    pos = torch.arange(seq_len, device=slopes.device)
    distance = (pos[:, None] - pos[None, :]).to(torch.float32)  # (S, S): i - j
    bias = -slopes[:, None, None] * distance  # (H, S, S)
    return bias.masked_fill(distance < 0, float("-inf"))
