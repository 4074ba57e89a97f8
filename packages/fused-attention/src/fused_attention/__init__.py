"""Flash attention forward and backward in Triton: causal, ALiBi, GQA/MQA, sliding window, varlen.

Public API (fp16/bf16, head dims 16, 32, 64, 80, 96, 128, 160, 192, 256):
- flash_attention(q, k, v, causal, softmax_scale, alibi_slopes, window_size, return_lse, layout)
- flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)
- flash_attention_qkvpacked(qkv, n_kv_heads, causal, ...): q, k, v packed in one (B, S, H + 2 H_kv, D)
  tensor (a fused qkv projection's output); the backward writes the packed gradient directly
- flash_attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, k_new, v_new, ...): decoding against
  a KV cache (new keys appended in place), split over the cache length (flash-decoding)
- alibi_slopes(n_heads): the standard ALiBi slopes
- modules FlashAttention (no parameters) and MultiheadSelfAttention (q/k/v/out projections)
"""

from .alibi import alibi_slopes
from .modules import FlashAttention, MultiheadSelfAttention
from .ops.attention import FlashAttentionFunction, flash_attention, flash_attention_varlen
from .ops.decode import flash_attention_with_kvcache
from .ops.packed import FlashAttentionQKVPackedFunction, flash_attention_qkvpacked

__version__ = "0.3.0"

__all__ = [
    "FlashAttention",
    "FlashAttentionFunction",
    "FlashAttentionQKVPackedFunction",
    "MultiheadSelfAttention",
    "alibi_slopes",
    "flash_attention",
    "flash_attention_qkvpacked",
    "flash_attention_varlen",
    "flash_attention_with_kvcache",
    "__version__",
]
