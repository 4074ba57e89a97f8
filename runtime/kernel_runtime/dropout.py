"""Dropout masks from Philox-4x32: the key words on the device, and the keep test in a kernel.

A call's mask is keyed by three int32 words on the kernel's device, (seed_lo, seed_hi, offset):
drawn from torch's generator of that device (torch.manual_seed repeats them; a CUDA-graph replay
draws new ones, as torch's own dropout does), or the two words of an explicit seed and an
offset. Kernels read the words and test each element's counter (four uint32 words the kernel
chooses, e.g. its row and column) with `philox_keep`; a backward regenerates the same mask from
the same words, so no mask is stored.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .validation import check_int

PHILOX_ROUNDS = tl.constexpr(7)


def dropout_threshold_and_scale(p: float) -> Tuple[int, float]:
    """(threshold, scale): an element is kept where the top 31 bits of its draw are >= threshold
    (round(p * 2^31)), and scaled by 1 / (1 - p) (0 for p = 1, where nothing is kept)."""
    return min(int(round(p * 2**31)), 2**31 - 1), (1.0 / (1.0 - p) if p < 1.0 else 0.0)


def check_seed(seed, seed_offset) -> None:
    """seed: None or an int in [0, 2^63); seed_offset: an int in [0, 2^32). The defaults (None, 0)
    return at once: every eager call of a function with these options passes here."""
    if seed is None and seed_offset.__class__ is int and not seed_offset:
        return
    if seed is not None:
        check_int("seed", seed, 0, 2**63 - 1)
    check_int("seed_offset", seed_offset, 0, 2**32 - 1)


def _int32(word: int) -> int:
    """The 32-bit word `word` (0 <= word < 2^32) as the int32 a kernel reinterprets."""
    return word - (word >> 31 << 32)


def seed_words(seed: int, seed_offset: int) -> Tuple[int, int, int]:
    """The three int32 words of an explicit seed and offset: (seed_lo, seed_hi, offset)."""
    return _int32(seed & 0xFFFFFFFF), _int32(seed >> 32), _int32(seed_offset)


def dropout_rng(device: torch.device, seed: Optional[int], seed_offset: int) -> torch.Tensor:
    """The three int32 key words on `device`: drawn from torch's generator of the device when seed
    is None, else seed_words(seed, seed_offset)."""
    if seed is None:
        return torch.randint(-(2**31), 2**31 - 1, (3,), dtype=torch.int32, device=device)
    return torch.tensor(seed_words(seed, seed_offset), dtype=torch.int32, device=device)


@triton.jit
def load_rng_words(rng_ptr):
    """The key words at rng_ptr as uint32 scalars: (seed_lo, seed_hi, offset)."""
    seed_lo = tl.load(rng_ptr).to(tl.uint32, bitcast=True)
    seed_hi = tl.load(rng_ptr + 1).to(tl.uint32, bitcast=True)
    offset = tl.load(rng_ptr + 2).to(tl.uint32, bitcast=True)
    return seed_lo, seed_hi, offset


@triton.jit
def philox_keep(c0, c1, c2, c3, seed_lo, seed_hi, threshold):
    """Keep mask of the elements of counters (c0, c1, c2, c3) (uint32 tensors of one shape): the
    first word of Philox-4x32 (7 rounds) keyed by (seed_lo, seed_hi), its top 31 bits >= threshold."""
    r, _, _, _ = tl.philox_impl(c0, c1, c2, c3, seed_lo, seed_hi, PHILOX_ROUNDS)
    return (r >> 1).to(tl.int32, bitcast=True) >= threshold
