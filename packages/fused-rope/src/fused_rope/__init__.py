"""Rotary position embeddings in Triton, TransformerEngine-compatible, forward and backward.

Public API (fp32/fp16/bf16, forward and backward):
- apply_rotary_pos_emb(t, freqs, tensor_format, interleaved, cu_seqlens, start_positions):
  TransformerEngine's semantics, formats sbhd / bshd / thd;
- apply_rotary_qk(q, k, cos, sin, position_ids, inplace): Hugging Face / Liger form, q and k
  in one launch;
- RotaryEmbedding: builds and caches the angles (and cos/sin tables) for a length.
"""

from .modules import RotaryEmbedding
from .ops.rope import RoPEFunction, apply_rotary_pos_emb
from .ops.rope_qk import RoPEQKFunction, RoPEQKInplaceFunction, apply_rotary_qk

__version__ = "0.2.0"

__all__ = [
    "RoPEFunction",
    "RoPEQKFunction",
    "RoPEQKInplaceFunction",
    "RotaryEmbedding",
    "apply_rotary_pos_emb",
    "apply_rotary_qk",
    "__version__",
]
