"""Pure-PyTorch reference of flash_attention_with_kvcache; the tests and benchmarks import it.

Each batch row on its own: its keys are the cache's first cache_seqlens[b] positions, followed by
k_new's S_q rows when given, and attention_reference (reference.py) runs the queries against
them with the same bottom-right alignment, mask, ALiBi and window semantics. With rotary tables
the queries and new keys are rotated first (rotary_reference). Nothing is written: the updated
caches are returned instead.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .reference import attention_reference


def append_reference(cache: torch.Tensor, cache_seqlens: torch.Tensor, new: Optional[torch.Tensor]) -> torch.Tensor:
    """A copy of cache (B, S_max, H_kv, D) with new (B, S_q, H_kv, D) at positions cache_seqlens[b] + i."""
    cache = cache.clone()
    if new is not None:
        for b, length in enumerate(cache_seqlens.tolist()):
            cache[b, length : length + new.shape[1]] = new[b]
    return cache


def rotary_reference(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, S, H, D) rotated rotate-half over the tables' first rotary_dim columns, token (b, s) at
    row positions[b, s] of cos, sin (positions, rotary_dim); computed in fp64, rounded once to x's dtype."""
    rotary_dim, half = cos.shape[1], cos.shape[1] // 2
    rows = positions.long()
    c, s = cos.double()[rows][:, :, None, :], sin.double()[rows][:, :, None, :]  # (B, S, 1, rotary_dim)
    part = x[..., :rotary_dim].double()
    rotated = torch.cat((-part[..., half:], part[..., :half]), dim=-1)
    out = x.clone()
    out[..., :rotary_dim] = (part * c + rotated * s).to(x.dtype)
    return out


def attention_with_kvcache_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    k_new: Optional[torch.Tensor] = None,
    v_new: Optional[torch.Tensor] = None,
    causal: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    window_size=(-1, -1),
    softmax_scale: Optional[float] = None,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float64,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out (B, S_q, H, D), lse (B, H, S_q), k_cache, v_cache after the append), computed in `dtype`."""
    if rotary_cos is not None:
        positions = cache_seqlens.long()[:, None] + torch.arange(q.shape[1], device=q.device)
        q = rotary_reference(q, positions, rotary_cos, rotary_sin)
        k_new = rotary_reference(k_new, positions, rotary_cos, rotary_sin)
    k_cache = append_reference(k_cache, cache_seqlens, k_new)
    v_cache = append_reference(v_cache, cache_seqlens, v_new)
    added = 0 if k_new is None else q.shape[1]
    outs, lses = [], []
    for b, length in enumerate(cache_seqlens.tolist()):
        seqlen_k = length + added
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b]
        out, lse = attention_reference(
            q[b : b + 1], k_cache[b : b + 1, :seqlen_k], v_cache[b : b + 1, :seqlen_k], causal, softmax_scale, slopes,
            window_size, "bshd", dtype,
        )  # fmt: skip
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses), k_cache, v_cache
