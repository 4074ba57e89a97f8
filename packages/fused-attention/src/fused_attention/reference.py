"""Pure-PyTorch reference of the attention kernels; the tests and benchmarks import it.

dropout(softmax(cap(Q K^T * scale) + bias + mask)) V, in a chosen precision (float64 or float32 on upcast
inputs for the reference), differentiable in q, k and v. Semantics match the kernels:
query i sees key j when -left <= j - (i + S_k - S_q) <= right (bottom-right alignment; causal is
right = 0), the ALiBi bias is -slope * |i + S_k - S_q - j|, and a query that sees no key gets
an output of 0 and an LSE of -inf. cap(s) = softcap * tanh(s / softcap), or s without a softcap.
Dropout keeps the weights where a boolean mask holds (dropout_keep_reference regenerates the
kernels' Philox mask) and scales them by 1 / (1 - p); the LSE is that of the undropped softmax.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch


def visible_mask(seqlen_q: int, seqlen_k: int, causal: bool, window_size, device=None) -> torch.Tensor:
    """(S_q, S_k) bool: which keys each query sees."""
    left, right = window_size
    if causal:
        right = 0
    rel = torch.arange(seqlen_k, device=device)[None, :] - (
        torch.arange(seqlen_q, device=device)[:, None] + seqlen_k - seqlen_q
    )
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        visible &= rel <= right
    if left >= 0:
        visible &= rel >= -left
    return visible


def alibi_bias(slopes: torch.Tensor, seqlen_q: int, seqlen_k: int, dtype=torch.float64) -> torch.Tensor:
    """(B or 1, H, S_q, S_k) bias -slope * |i + S_k - S_q - j| from slopes (H,) or (B, H)."""
    slopes = slopes.to(dtype)
    if slopes.dim() == 1:
        slopes = slopes[None]
    rel = torch.arange(seqlen_k, device=slopes.device)[None, :] - (
        torch.arange(seqlen_q, device=slopes.device)[:, None] + seqlen_k - seqlen_q
    )
    return -slopes[:, :, None, None] * rel.abs().to(dtype)


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    window_size=(-1, -1),
    layout: str = "bshd",
    dtype: torch.dtype = torch.float64,
    softcap: float = 0.0,
    dropout_p: float = 0.0,
    dropout_keep: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) computed in `dtype`: out in q's layout, lse (B, H, S_q) natural-log.
    dropout_keep: (B, H, S_q, S_k) bool, with dropout_p > 0.

    q: (B, S_q, H, D) for layout "bshd" or (B, H, S_q, D) for "bhsd"; k, v: the same with S_k and
    H_kv heads (H a multiple of H_kv, GQA). Differentiable in q, k, v (gradients in `dtype`).
    """
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.to(dtype) for t in (q, k, v))
    n_heads, seqlen_q, head_dim = q.shape[1], q.shape[2], q.shape[3]
    group = n_heads // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    seqlen_k = k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    scores = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes.to(q.device), seqlen_q, seqlen_k, dtype)
    visible = visible_mask(seqlen_q, seqlen_k, causal, window_size, device=q.device)
    scores = scores.masked_fill(~visible, -math.inf)
    # Rows with no visible key: lse = -inf and out = 0, with finite gradients everywhere.
    any_visible = visible.any(dim=-1, keepdim=True)
    lse = torch.logsumexp(scores.masked_fill(~any_visible, 0.0), dim=-1, keepdim=True)
    probs = torch.exp(scores - lse.masked_fill(~any_visible, 0.0))
    if dropout_p:
        probs = torch.where(dropout_keep, probs / (1.0 - dropout_p), 0.0)
    out = torch.einsum("bhij,bhjd->bhid", probs, v)
    lse = lse.squeeze(-1).masked_fill(~any_visible.squeeze(-1), -math.inf)
    if layout == "bshd":
        out = out.transpose(1, 2)
    return out, lse


def attention_reference_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = False,
    softmax_scale: Optional[float] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    window_size=(-1, -1),
    dtype: torch.dtype = torch.float64,
    softcap: float = 0.0,
    dropout_p: float = 0.0,
    dropout_words: Optional[Tuple[int, int, int]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed (total, H, D) batches: each sequence through attention_reference; lse (H, total_q).
    dropout_words: the kernels' three int32 Philox words (with dropout_p > 0); sequence b's mask is
    batch row b's."""
    outs, lses = [], []
    offsets_q, offsets_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(offsets_q) - 1):
        rows_q = slice(offsets_q[b], offsets_q[b + 1])
        rows_k = slice(offsets_k[b], offsets_k[b + 1])
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        keep = None
        if dropout_p:
            seqlen_q, seqlen_k = offsets_q[b + 1] - offsets_q[b], offsets_k[b + 1] - offsets_k[b]
            keep = dropout_keep_reference(dropout_words, dropout_p, 1, q.shape[1], seqlen_q, seqlen_k, q.device, b)
        out, lse = attention_reference(
            q[None, rows_q], k[None, rows_k], v[None, rows_k], causal, softmax_scale, slopes, window_size, "bshd",
            dtype, softcap, dropout_p, keep,
        )  # fmt: skip
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


_MASK32 = 0xFFFFFFFF


def _mulhilo(a: int, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of the 64-bit product of the constant a and b (int64 holding
    values below 2^32), from 16-bit limbs so that no int64 product overflows."""
    a1, a0 = a >> 16, a & 0xFFFF
    b1, b0 = b >> 16, b & 0xFFFF
    mid = a1 * b0 + a0 * b1
    low = a0 * b0 + ((mid & 0xFFFF) << 16)
    return a1 * b1 + (mid >> 16) + (low >> 32), low & _MASK32


def philox_4x32(c0, c1, c2, c3, k0: int, k1: int, rounds: int = 7) -> torch.Tensor:
    """The first output word of Philox-4x32 (Salmon et al., as triton.language.philox_impl) for
    counters c0..c3 (int64 tensors of values below 2^32) and key (k0, k1); int64."""
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo(0xCD9E8D57, c2)
        hi_a, lo_a = _mulhilo(0xD2511F53, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + 0x9E3779B9) & _MASK32, (k1 + 0xBB67AE85) & _MASK32
    return c0


def dropout_keep_reference(
    words: Tuple[int, int, int], dropout_p: float, batch: int, n_heads: int, seqlen_q: int, seqlen_k: int,
    device=None, first_batch: int = 0,
) -> torch.Tensor:  # fmt: skip
    """(B, H, S_q, S_k) bool: the kernels' dropout mask for their three int32 words (seed_lo,
    seed_hi, offset) over batch rows first_batch ... first_batch + B - 1: Philox-4x32 with 7 rounds
    at counter (key, query, b * H + h, offset), kept where the top 31 bits of the draw are >=
    round(p * 2^31)."""
    seed_lo, seed_hi, offset = (w & _MASK32 for w in words)
    b = torch.arange(first_batch, first_batch + batch, device=device)[:, None, None, None]
    h = torch.arange(n_heads, device=device)[None, :, None, None]
    i = torch.arange(seqlen_q, device=device)[None, None, :, None]
    j = torch.arange(seqlen_k, device=device)[None, None, None, :]
    shape = (batch, n_heads, seqlen_q, seqlen_k)
    c0, c1 = j.expand(shape), i.expand(shape)
    c2 = (b * n_heads + h).expand(shape) & _MASK32
    c3 = torch.full(shape, offset, dtype=torch.int64, device=device)
    draw = philox_4x32(c0, c1, c2, c3, seed_lo, seed_hi)
    threshold = min(int(round(dropout_p * 2**31)), 2**31 - 1)
    return (draw >> 1) >= threshold
