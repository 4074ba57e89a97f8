"""RotaryEmbedding: the angles (TransformerEngine layout) and cos/sin tables, cached per length."""

from __future__ import annotations

import math
import numbers
import operator
from typing import Optional, Tuple

import torch

from ._compat import is_compiling


def _check_int(name: str, value, minimum: Optional[int] = None):
    """value as an int (numpy and other index types too, never a bool), at least `minimum` (0 or 1).

    A torch.SymInt (a size under torch.compile with dynamic shapes) is returned as it is.
    """
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, torch.SymInt)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not isinstance(value, torch.SymInt):
        value = operator.index(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be a {'positive' if minimum else 'non-negative'} int, got {value}")
    return value


def _check_positive_real(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return float(value)


def _check_interpolation(factor, pretrained) -> None:
    """TE scales positions only when both are given (its seq_len_interpolation_factor alone is
    ignored): a factor alone is refused rather than applied or silently dropped."""
    if factor is not None:
        _check_positive_real("seq_len_interpolation_factor", factor)
    if pretrained is not None:
        _check_int("pretrained_max_position_embeddings", pretrained, 1)
    if factor is not None and pretrained is None:
        raise ValueError(
            "seq_len_interpolation_factor needs pretrained_max_position_embeddings (TransformerEngine ignores a "
            "factor given alone); for fixed scaling of every length pass both, with a pretrained length * factor "
            "at least the longest sequence"
        )


class RotaryEmbedding(torch.nn.Module):
    """Builds and caches rotary angles for a sequence length (TE's RotaryPositionEmbedding).

    The arguments are TransformerEngine's, in TE's order, by position and by keyword:

    dim: the head dim; rotary_percent < 1 rotates the first int(dim * rotary_percent) columns
        (which must be even) and passes the rest through.
    rotary_percent: in (0, 1].
    seq_len_interpolation_factor, pretrained_max_position_embeddings: TE's position
        interpolation: positions divided by the factor up to pretrained * factor positions,
        past that by seq_len / pretrained (dynamic). TE ignores a factor given alone; here
        that call raises ValueError instead (so a call never means something else than in TE).
    rotary_base: the base of the inverse frequencies, inv_freq[i] = 1 / base^(2i / rot_dim).
    interleaved: angles for interleaved (GPT-J) pairs instead of rotate-half ones.
    device (keyword only, not in TE): where inv_freq is built (TE: the current CUDA device).

    `module(max_seq_len, offset=0)` returns freqs (max_seq_len, 1, 1, rot_dim) for
    `apply_rotary_pos_emb`, fp32 (float64 when inv_freq is float64, e.g. after `.double()`);
    `module.cos_sin(seq_len)` returns cos, sin (1, seq_len, rot_dim) for `apply_rotary_qk`. The
    last result of each is cached, so a model that calls it every step computes the tables once;
    the cache is keyed on the length, offset and dtype and on everything the angles depend on
    (the inv_freq buffer itself, its in-place version, dtype and device, the interpolation
    settings): after `.to()`, `.double()` or an in-place edit of inv_freq they are recomputed.
    Under torch.compile nothing is cached: the angles are computed in the graph.

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
        rotary_percent: float = 1.0,
        seq_len_interpolation_factor: Optional[float] = None,
        pretrained_max_position_embeddings: Optional[int] = None,
        rotary_base: float = 10000.0,
        interleaved: bool = False,
        *,
        device: Optional[torch.device] = None,
    ):
        super().__init__()
        dim = _check_int("dim", dim, 1)
        if isinstance(rotary_percent, bool) or not isinstance(rotary_percent, numbers.Real):
            raise TypeError(f"rotary_percent must be a real number, got {type(rotary_percent).__name__}")
        if not 0.0 < rotary_percent <= 1.0:
            hint = " (the second argument is rotary_percent, as in TransformerEngine; the base is rotary_base)"
            raise ValueError(f"rotary_percent must be in (0, 1], got {rotary_percent!r}{hint * (rotary_percent > 1)}")
        rot_dim = int(dim * rotary_percent) if rotary_percent < 1.0 else dim
        if rotary_percent == 1.0 and dim % 2:
            raise ValueError(f"dim must be even with rotary_percent=1.0 (the rotary dim rotates pairs), got {dim}")
        if rot_dim == 0 or rot_dim % 2:
            raise ValueError(
                f"the rotary dim int(dim * rotary_percent) = {rot_dim} must be even and positive (it rotates pairs)"
            )
        rotary_base = _check_positive_real("rotary_base", rotary_base)
        _check_interpolation(seq_len_interpolation_factor, pretrained_max_position_embeddings)
        if not isinstance(interleaved, bool):
            raise TypeError(f"interleaved must be a bool, got {type(interleaved).__name__}")
        self.dim, self.rot_dim, self.rotary_base = dim, rot_dim, rotary_base
        self.rotary_percent, self.interleaved = rotary_percent, interleaved
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        exponents = torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim
        self.register_buffer("inv_freq", 1.0 / (rotary_base**exponents), persistent=False)
        # (inv_freq, key, freqs, freqs' version) and (freqs, dtype, (cos, sin), their versions).
        self._freqs_cache: Optional[tuple] = None
        self._cos_sin_cache: Optional[tuple] = None

    def _positions(self, seq_len: int, offset: int, dtype: torch.dtype) -> torch.Tensor:
        positions = torch.arange(seq_len, device=self.inv_freq.device, dtype=dtype) + offset
        factor, pretrained = self.seq_len_interpolation_factor, self.pretrained_max_position_embeddings
        if pretrained is not None and factor is not None:
            if seq_len > pretrained * factor:
                positions *= 1 / (seq_len / pretrained)  # dynamic linear scaling
            else:
                positions *= 1 / factor
        return positions

    def _compute_freqs(self, seq_len: int, offset: int) -> torch.Tensor:
        _check_interpolation(self.seq_len_interpolation_factor, self.pretrained_max_position_embeddings)
        inv_freq = self.inv_freq
        # fp32 at least (a half-precision position loses integers past 2048); float64 if inv_freq is.
        dtype = torch.promote_types(torch.float32, inv_freq.dtype)
        theta = torch.outer(self._positions(seq_len, offset, dtype), inv_freq.to(dtype))  # (S, rot_dim / 2)
        if self.interleaved:
            freqs = theta.repeat_interleave(2, dim=-1)  # pairs (2j, 2j + 1) share theta_j
        else:
            freqs = torch.cat((theta, theta), dim=-1)  # pairs (j, j + rot_dim / 2) share theta_j
        return freqs.view(seq_len, 1, 1, self.rot_dim)

    def _angles(self, seq_len, offset, length_name: str, compiling: bool) -> torch.Tensor:
        if compiling:
            # Traced, the angles are a few ops of the graph (no host cost to save), and a cache
            # would be baked into it: no guard sees an in-place edit of inv_freq.
            return self._compute_freqs(_check_int(length_name, seq_len, 0), _check_int("offset", offset))
        # From the buffers' dict: nn.Module's attribute lookup costs more than the rest of a hit.
        inv_freq = self._buffers.get("inv_freq")
        if inv_freq is None:
            inv_freq = self.inv_freq
        key = (
            type(seq_len), seq_len, type(offset), offset, inv_freq._version, inv_freq.dtype, inv_freq.device,
            self.seq_len_interpolation_factor, self.pretrained_max_position_embeddings, self.interleaved,
        )  # fmt: skip
        cache = self._freqs_cache
        if cache is not None and cache[0] is inv_freq and cache[1] == key and cache[2]._version == cache[3]:
            return cache[2]
        # A miss: the arguments are checked here (a hit repeats a call that passed).
        freqs = self._compute_freqs(_check_int(length_name, seq_len, 0), _check_int("offset", offset))
        self._freqs_cache = (inv_freq, key, freqs, freqs._version)
        return freqs

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        """Angles (max_seq_len, 1, 1, rot_dim) of positions offset .. offset + max_seq_len - 1."""
        return self._angles(max_seq_len, offset, "max_seq_len", is_compiling())

    def cos_sin(
        self, seq_len: int, offset: int = 0, dtype: torch.dtype = torch.float32
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (1, seq_len, rot_dim) in `dtype` (default fp32, the kernels' compute precision)."""
        if self.interleaved:
            raise ValueError(
                "cos_sin tables are for rotate-half pairs (apply_rotary_qk); this RotaryEmbedding is interleaved: "
                "use its freqs with apply_rotary_pos_emb(..., interleaved=True)"
            )
        compiling = is_compiling()
        freqs = self._angles(seq_len, offset, "seq_len", compiling)
        cache = self._cos_sin_cache
        if not compiling and cache is not None and cache[0] is freqs and cache[1] == dtype:
            cos, sin = cache[2]
            if cos._version == cache[3] and sin._version == cache[4]:
                return cache[2]
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        angles = freqs.view(1, freqs.shape[0], self.rot_dim)
        tables = (angles.cos().to(dtype), angles.sin().to(dtype))
        if compiling:
            return tables
        self._cos_sin_cache = (freqs, dtype, tables, tables[0]._version, tables[1]._version)
        return tables

    def extra_repr(self) -> str:
        return f"dim={self.dim}, rot_dim={self.rot_dim}, rotary_base={self.rotary_base}, interleaved={self.interleaved}"
