"""Pure-PyTorch reference of the attention kernels; the tests and benchmarks import it.

softmax(cap(Q K^T * scale) + bias + mask) V, in a chosen precision (float64 or float32 on upcast
inputs for the reference), differentiable in q, k and v. Semantics match the kernels:
query i sees key j when -left <= j - (i + S_k - S_q) <= right (bottom-right alignment; causal is
right = 0), the ALiBi bias is -slope * |i + S_k - S_q - j|, and a query that sees no key gets
an output of 0 and an LSE of -inf. cap(s) = softcap * tanh(s / softcap), or s without a softcap.
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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) computed in `dtype`: out in q's layout, lse (B, H, S_q) natural-log.

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
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Packed (total, H, D) batches: each sequence through attention_reference; lse (H, total_q)."""
    outs, lses = [], []
    offsets_q, offsets_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(offsets_q) - 1):
        rows_q = slice(offsets_q[b], offsets_q[b + 1])
        rows_k = slice(offsets_k[b], offsets_k[b + 1])
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        out, lse = attention_reference(
            q[None, rows_q],
            k[None, rows_k],
            v[None, rows_k],
            causal,
            softmax_scale,
            slopes,
            window_size,
            "bshd",
            dtype,
            softcap,
        )
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)
