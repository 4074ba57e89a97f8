"""RotaryEmbedding: the angles (TransformerEngine layout) and cos/sin tables, cached per length."""

from __future__ import annotations

from typing import Optional, Tuple

import torch


class RotaryEmbedding(torch.nn.Module):
    """Builds and caches rotary angles for a sequence length (TE's RotaryPositionEmbedding).

    dim: the head dim; rotary_percent < 1 rotates the first int(dim * rotary_percent) columns
        (which must be even) and passes the rest through.
    base: the base of the inverse frequencies, inv_freq[i] = 1 / base^(2i / rot_dim).
    interleaved: angles for interleaved (GPT-J) pairs instead of rotate-half ones.
    seq_len_interpolation_factor, pretrained_max_position_embeddings: TE's position
        interpolation (positions divided by the factor; past pretrained * factor, dynamic).

    `module(seq_len, offset=0)` returns freqs (seq_len, 1, 1, rot_dim) fp32 for
    `apply_rotary_pos_emb`; `module.cos_sin(seq_len)` returns cos, sin (1, seq_len, rot_dim)
    for `apply_rotary_qk`. The last result of each is cached (one length, offset, dtype and
    device), so a model that calls it every step computes the tables once.

    In a GPT block with q, k of shape (B, S, H, D):

        cos, sin = self.rope.cos_sin(S)                                # (1, S, D) fp32, cached
        q, k = apply_rotary_qk(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        # q, k: (B, H, S, D) views of (B, S, H, D) memory, ready for attention; one launch

    or, TransformerEngine style, one launch per tensor:

        freqs = self.rope(S)                                           # (S, 1, 1, D) fp32, cached
        q = apply_rotary_pos_emb(q, freqs, tensor_format="bshd")
        k = apply_rotary_pos_emb(k, freqs, tensor_format="bshd")
    """

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        rotary_percent: float = 1.0,
        interleaved: bool = False,
        seq_len_interpolation_factor: Optional[float] = None,
        pretrained_max_position_embeddings: Optional[int] = None,
        device: Optional[torch.device] = None,
    ):
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not 0.0 < rotary_percent <= 1.0:
            raise ValueError(f"rotary_percent must be in (0, 1], got {rotary_percent!r}")
        rot_dim = int(dim * rotary_percent) if rotary_percent < 1.0 else dim
        if rot_dim == 0 or rot_dim % 2:
            raise ValueError(
                f"the rotary dim int(dim * rotary_percent) = {rot_dim} must be even and positive (it rotates pairs)"
            )
        if not base > 0:
            raise ValueError(f"base must be positive, got {base!r}")
        self.dim, self.rot_dim, self.base = dim, rot_dim, float(base)
        self.rotary_percent, self.interleaved = rotary_percent, interleaved
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        inv_freq = 1.0 / (self.base ** (torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._freqs_cache: Optional[Tuple[tuple, torch.Tensor]] = None
        self._cos_sin_cache: Optional[Tuple[tuple, Tuple[torch.Tensor, torch.Tensor]]] = None

    def _positions(self, seq_len: int, offset: int) -> torch.Tensor:
        positions = torch.arange(seq_len, device=self.inv_freq.device, dtype=torch.float32) + offset
        factor, pretrained = self.seq_len_interpolation_factor, self.pretrained_max_position_embeddings
        if pretrained is not None and factor is not None:
            if seq_len > pretrained * factor:
                positions *= 1 / (seq_len / pretrained)  # dynamic linear scaling
            else:
                positions *= 1 / factor
        elif factor is not None:
            positions *= 1 / factor
        return positions

    def forward(self, seq_len: int, offset: int = 0) -> torch.Tensor:
        """Angles (seq_len, 1, 1, rot_dim) fp32 of positions offset .. offset + seq_len - 1."""
        key = (seq_len, offset, self.inv_freq.device)
        if self._freqs_cache is None or self._freqs_cache[0] != key:
            theta = torch.outer(self._positions(seq_len, offset), self.inv_freq)  # (S, rot_dim / 2)
            if self.interleaved:
                freqs = theta.repeat_interleave(2, dim=-1)  # pairs (2j, 2j + 1) share theta_j
            else:
                freqs = torch.cat((theta, theta), dim=-1)  # pairs (j, j + rot_dim / 2) share theta_j
            self._freqs_cache = (key, freqs.view(seq_len, 1, 1, self.rot_dim))
        return self._freqs_cache[1]

    def cos_sin(
        self, seq_len: int, offset: int = 0, dtype: torch.dtype = torch.float32
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (1, seq_len, rot_dim) in `dtype` (default fp32, the kernels' compute precision)."""
        if self.interleaved:
            raise ValueError(
                "cos_sin tables are for rotate-half pairs (apply_rotary_qk); this RotaryEmbedding is interleaved: "
                "use its freqs with apply_rotary_pos_emb(..., interleaved=True)"
            )
        key = (seq_len, offset, dtype, self.inv_freq.device)
        if self._cos_sin_cache is None or self._cos_sin_cache[0] != key:
            freqs = self.forward(seq_len, offset).view(1, seq_len, self.rot_dim)
            self._cos_sin_cache = (key, (freqs.cos().to(dtype), freqs.sin().to(dtype)))
        return self._cos_sin_cache[1]

    def extra_repr(self) -> str:
        return f"dim={self.dim}, rot_dim={self.rot_dim}, base={self.base}, interleaved={self.interleaved}"
