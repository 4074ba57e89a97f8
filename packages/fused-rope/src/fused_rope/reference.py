"""Pure-PyTorch references; the tests and benchmarks compare against these.

`apply_rotary_pos_emb_reference` is TransformerEngine's unfused formula (its
`_apply_rotary_pos_emb_base`, and the split / concatenate of "thd" sequences) and
`rotary_qk_reference` is Hugging Face's `apply_rotary_pos_emb` with partial rotary. Both
compute in the dtype they are given: the tests run them in float64 on upcast inputs (the
reference) and in the kernel's low precision on the original inputs (PyTorch's own error,
the bound of the tolerance rule). Their autograd gives the reference gradients.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch


def rotate_half(x: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """(-x2, x1) for pairs (j, j + d/2), or per interleaved pair (2j, 2j + 1)."""
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _apply_base(
    t: torch.Tensor, freqs: torch.Tensor, start_positions: Optional[torch.Tensor], tensor_format: str, interleaved: bool
) -> torch.Tensor:
    """TE's base formula for sbhd / bshd; freqs (s2, 1, 1, d2)."""
    seq_len = t.shape[1] if tensor_format == "bshd" else t.shape[0]
    if start_positions is not None:
        # One angle row per batch entry: (s, b, 1, d2).
        freqs = torch.cat([freqs[i : i + seq_len] for i in start_positions.tolist()], dim=1)
    freqs = freqs[:seq_len]
    if tensor_format == "bshd":
        freqs = freqs.transpose(0, 1)
    # cos/sin in freqs' precision first, then t's dtype, as TE does.
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    rot_dim = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    t_rot = t_rot * cos + rotate_half(t_rot, interleaved) * sin
    return torch.cat((t_rot, t_pass), dim=-1)


def apply_rotary_pos_emb_reference(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    interleaved: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    start_positions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """TransformerEngine's unfused apply_rotary_pos_emb (same arguments as the fused one)."""
    freqs = freqs.reshape(freqs.shape[0], 1, 1, freqs.shape[-1])
    if tensor_format == "thd":
        seqlens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        pieces = [
            _apply_base(
                x.unsqueeze(1),
                freqs,
                None if start_positions is None else start_positions[i : i + 1],
                "sbhd",
                interleaved,
            )
            for i, x in enumerate(torch.split(t, seqlens))
        ]
        return torch.cat(pieces).squeeze(1) if pieces else t.clone()
    return _apply_base(t, freqs, start_positions, tensor_format, interleaved)


def rotary_qk_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    position_ids: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's q * cos + rotate_half(q) * sin (and k), partial rotary, in q's dtype.

    q: (B, H, S, D); cos, sin: (B or 1, P, d2) or (P, d2) tables; position_ids: (B or 1, S).
    """
    batch, _, seq_len, _ = q.shape
    if cos.dim() == 2:
        cos, sin = cos[None], sin[None]
    if position_ids is None:
        cos, sin = cos[:, :seq_len], sin[:, :seq_len]
    else:
        rows = torch.arange(batch, device=cos.device)[:, None] if cos.shape[0] > 1 else 0
        positions = position_ids.expand(batch, seq_len)
        cos, sin = cos[rows, positions], sin[rows, positions]
    # (B or 1, S, d2) -> (B or 1, 1, S, d2): broadcast over heads, in q's dtype as HF casts them.
    cos, sin = cos.unsqueeze(1).to(q.dtype), sin.unsqueeze(1).to(q.dtype)
    rot_dim = cos.shape[-1]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
        return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)

    return rotate(q), rotate(k)
