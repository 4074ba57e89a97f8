"""This package's own input checks; the shared ones (check_tensor, check_same_dtype, check_device,
check_bool, check_int, ...) are in `_runtime.validation`, re-exported here for the package's modules."""

from __future__ import annotations

import math
from typing import Tuple

import torch

from ._runtime.validation import (  # noqa: F401 - re-exported for the package's modules
    check_bool,
    check_device,
    check_float,
    check_int,
    check_same_dtype,
    check_tensor,
)

# The kernels run their matmuls on 16-bit tensor cores; fp32 inputs are rejected, not silently
# rounded (under torch.autocast they are cast to the autocast dtype first, as SDPA does).
ATTENTION_DTYPES = (torch.float16, torch.bfloat16)
SUPPORTED_HEAD_DIMS = (16, 32, 64, 80, 96, 128, 160, 192, 256)
LAYOUTS = ("bshd", "bhsd")


def check_qkv_dtypes(q, k, v) -> None:
    for name, value in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, value, ATTENTION_DTYPES)
    check_same_dtype("q", q, k=k, v=v)


def check_head_dim(head_dim: int) -> None:
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head dim {head_dim} is not supported; supported: {', '.join(map(str, SUPPORTED_HEAD_DIMS))}")


def check_heads(n_heads: int, n_kv_heads: int, head_dim: int, v_head_dim: int) -> None:
    check_head_dim(head_dim)
    if v_head_dim != head_dim:
        raise ValueError(f"v has head dim {v_head_dim} but q and k have {head_dim}")
    if n_kv_heads == 0:
        raise ValueError("k and v have 0 heads: at least one key/value head is needed")
    if n_heads % n_kv_heads:
        raise ValueError(
            f"q has {n_heads} heads and k/v have {n_kv_heads}: the query heads must be a multiple of the "
            "key/value heads (GQA/MQA)"
        )


def check_layout(layout) -> bool:
    """True for the SDPA layout (B, H, S, D), False for FlashAttention's (B, S, H, D)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'bshd' or 'bhsd', got {layout!r}")
    return layout == "bhsd"


# The kernels scale scores by softmax_scale * log2(e) in fp32: it must be a normal fp32 number.
_FP32_TINY, _FP32_MAX, LOG2E = 2.0**-126, float(torch.finfo(torch.float32).max), 1.4426950408889634
SOFTMAX_SCALE_RANGE = (_FP32_TINY / LOG2E, _FP32_MAX / LOG2E)


def check_softmax_scale(softmax_scale, head_dim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    low, high = SOFTMAX_SCALE_RANGE
    if not (math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale must be positive and finite, got {softmax_scale}")
    if not low <= softmax_scale <= high:
        raise ValueError(f"softmax_scale must lie in the fp32 range [{low:.3g}, {high:.3g}], got {softmax_scale}")
    return float(softmax_scale)


def check_softcap(softcap, softmax_scale: float) -> float:
    """0 (no softcap) or a positive float for which the kernels' fp32 factors, softcap * log2(e)
    and 2 * softmax_scale * log2(e) / softcap, are finite normal numbers."""
    value = check_float("softcap", softcap, 0.0)
    low, high = max(_FP32_TINY, 2.0 * softmax_scale * LOG2E / _FP32_MAX), _FP32_MAX / LOG2E
    if value and not low <= value <= high:
        raise ValueError(f"softcap must be 0 or lie in [{low:.3g}, {high:.3g}] (fp32 range), got {value}")
    return value


def check_dropout_p(dropout_p) -> float:
    return check_float("dropout_p", dropout_p, 0.0, 1.0, include_high=False)


def check_window(window_size, causal, max_seqlen_q: int, max_seqlen_k: int) -> Tuple[int, int]:
    """Normalized (left, right) bounds, -1 for none; causal forces right = 0 (as FlashAttention-2).

    A bound that no (query, key) pair can cross becomes -1, so it costs no masking: the left one
    when left >= S_k - 1, the right one when right >= S_q - 1 (keys i + S_k - S_q - left ...
    i + S_k - S_q + right, for queries i in [0, S_q)).
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if (
        not isinstance(window_size, (tuple, list))
        or len(window_size) != 2
        or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size)
    ):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1 (-1: unbounded), got {tuple(window_size)}")
    if causal:
        right = 0
    if left >= max_seqlen_k - 1:
        left = -1
    if right >= max_seqlen_q - 1:
        right = -1
    return left, right


def check_alibi_slopes(alibi_slopes, batch: int, n_heads: int) -> None:
    if alibi_slopes is None:
        return
    check_tensor("alibi_slopes", alibi_slopes, (torch.float32,))
    if tuple(alibi_slopes.shape) not in ((n_heads,), (batch, n_heads)):
        raise ValueError(
            f"alibi_slopes must have shape ({n_heads},) or ({batch}, {n_heads}), got {tuple(alibi_slopes.shape)}"
        )


def check_cu_seqlens(name: str, cu_seqlens) -> int:
    """Returns the batch size; the offsets themselves are checked by check_cu_seqlens_values."""
    check_tensor(name, cu_seqlens, (torch.int32,))
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}")
    return cu_seqlens.shape[0] - 1


def check_cu_seqlens_values(name: str, cu_seqlens: torch.Tensor, total: int, max_seqlen: int) -> None:
    """The offsets rise from 0 to `total` by steps of at most max_seqlen: reads them back (one
    device sync), so it runs after check_device."""
    offsets = cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(offsets[:-1], offsets[1:])]
    if offsets[0] != 0 or offsets[-1] != total or min(lengths) < 0:
        raise ValueError(
            f"{name} must rise from 0 to the packed length {total}, got {offsets[0]} ... {offsets[-1]}"
            + (" (decreasing somewhere)" if min(lengths) < 0 else "")
        )
    if max(lengths) > max_seqlen:
        raise ValueError(f"{name} has a sequence of length {max(lengths)} > max_seqlen {max_seqlen}")
