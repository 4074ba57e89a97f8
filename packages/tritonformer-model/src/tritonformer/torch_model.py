"""TorchTransformer: the GPT in plain PyTorch (cuBLAS linears, SDPA attention, torch norms).

The twin of `Transformer`: the same modules under the same names, so one state_dict loads into
both. It is the baseline the benchmarks race and the reference the tests compare against.

Shapes: B batch, S sequence, d d_model, H query heads, Hkv key/value heads, D head_dim,
V vocab_size, F d_ff.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import positions
from ._base import CausalLM
from ._compat import SDPA_HAS_GQA, rms_norm
from .config import TransformerConfig

# Tokens per chunk of the fused_loss path: about 2^25 logits (128 MiB in fp32) at a time.
LOSS_CHUNK_LOGITS = 2**25


class RMSNorm(nn.Module):
    """torch.nn.RMSNorm's parameters and formula (it exists only from torch 2.4)."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def make_norm(config: TransformerConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, config.norm_eps)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.use_linear_bias)


class Attention(nn.Module):
    """Causal self-attention: fused qkv projection, RoPE or ALiBi, SDPA, output projection."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        c = config
        self.qkv = nn.Linear(c.d_model, (c.n_head + 2 * c.n_kv_head) * c.head_dim, bias=c.qkv_bias)
        self.proj = nn.Linear(c.n_head * c.head_dim, c.d_model, bias=c.qkv_bias)

    def forward(self, x: torch.Tensor, position: Optional[tuple], cache=None) -> torch.Tensor:
        """x (B, S, d); position: (cos, sin) (S, D) for rope (decode steps: (B, 1, D), each row's
        position), (alibi_bias (H, S, S),) for alibi (decode steps: (B, H, 1, S_max)). cache: this
        layer's generation.LayerCache: a prefill writes its keys and values there, a decode step
        appends them at each row's length and attends to the cache through a mask."""
        c = self.config
        B, S, _ = x.shape
        H, Hkv, D = c.n_head, c.n_kv_head, c.head_dim
        q, k, v = self.qkv(x).split([H * D, Hkv * D, Hkv * D], dim=-1)  # (B, S, H*D), 2 x (B, S, Hkv*D)
        q, k, v = q.view(B, S, H, D), k.view(B, S, Hkv, D), v.view(B, S, Hkv, D)
        if c.position == "rope":
            cos, sin = position
            q, k = positions.apply_rope(q, cos, sin), positions.apply_rope(k, cos, sin)
        mask, causal = None, True
        if cache is not None and cache.decoding:
            k, v, mask = _append_to_cache(cache, k, v)  # the whole cache, (B, S_max, Hkv, D)
            causal = False
        elif cache is not None:
            cache.write_prompt(k, v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H or Hkv, S, D)
        if Hkv != H and not SDPA_HAS_GQA:  # torch < 2.5: repeat each kv head for its query group
            k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)  # (B, H, S, D)
        gqa = {"enable_gqa": True} if Hkv != H and SDPA_HAS_GQA else {}
        p = c.attention_dropout if self.training and cache is None else 0.0
        if c.position == "alibi":
            (bias,) = position  # (H, S, S) or (B, H, 1, S_max) fp32, the causal mask included
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=p, **gqa)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, dropout_p=p, **gqa)
        y = y.transpose(1, 2).reshape(B, S, H * D)  # (B, S, H*D)
        return self.proj(y)


def _append_to_cache(cache, k: torch.Tensor, v: torch.Tensor):
    """Write one token per row (k, v (B, 1, Hkv, D)) at position cache.lengths[b]; returns the
    layer's key and value caches and the (B, 1, 1, S_max) mask of the positions each row sees."""
    k_cache, v_cache = cache.buffers(k)
    rows, pos = torch.arange(k.shape[0], device=k.device), cache.lengths.long()
    k_cache[rows, pos] = k[:, 0]
    v_cache[rows, pos] = v[:, 0]
    visible = torch.arange(k_cache.shape[1], device=k.device) <= pos[:, None]  # (B, S_max)
    return k_cache, v_cache, visible[:, None, None, :]


class MLP(nn.Module):
    """fc2(act(fc1(x))) with GELU or ReLU."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff, bias=config.use_linear_bias)
        self.fc2 = nn.Linear(config.d_ff, config.d_model, bias=config.use_linear_bias)
        if config.mlp == "relu":
            self.act = nn.ReLU()
        else:
            self.act = nn.GELU(approximate=config.gelu_approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))  # (B, S, d) -> (B, S, F) -> (B, S, d)


class SwiGLUMLP(nn.Module):
    """(silu(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down (LLaMA).

    Weights are input-major, as fused_swiglu takes them: w_gate, w_up (d, F), w_down (F, d)
    (a Hugging Face LLaMA's gate_proj.weight is w_gate.T). Biases only with use_linear_bias.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d, f = config.d_model, config.d_ff
        self.w_gate = nn.Parameter(torch.empty(d, f))
        self.w_up = nn.Parameter(torch.empty(d, f))
        self.w_down = nn.Parameter(torch.empty(f, d))
        bias = config.use_linear_bias
        self.b_gate = nn.Parameter(torch.zeros(f)) if bias else None
        self.b_up = nn.Parameter(torch.zeros(f)) if bias else None
        self.b_down = nn.Parameter(torch.zeros(d)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.linear(x, self.w_gate.t(), self.b_gate)  # (B, S, F); .t(): a view, cuBLAS transposes
        up = F.linear(x, self.w_up.t(), self.b_up)  # (B, S, F)
        return F.linear(F.silu(gate) * up, self.w_down.t(), self.b_down)  # (B, S, d)


class Block(nn.Module):
    """Pre-norm block: x + drop(attn(norm(x))), then x + drop(mlp(norm(x)))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.norm_attn = make_norm(config)
        self.attn = Attention(config)
        self.norm_mlp = make_norm(config)
        self.mlp = SwiGLUMLP(config) if config.mlp == "swiglu" else MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, position: Optional[tuple], cache=None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.norm_attn(x), position, cache))
        x = x + self.drop(self.mlp(self.norm_mlp(x)))
        return x


class TorchTransformer(CausalLM):
    """The GPT in plain PyTorch; `logits, loss = model(idx, targets)`."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        config.validate()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = nn.Embedding(config.max_seq_len, config.d_model) if config.position == "learned" else None
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm_f = make_norm(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.init_weights()

    def _decode_position(self, cache, pos: torch.Tensor) -> Optional[tuple]:
        c = self.config
        position = None
        if c.position == "rope":
            position = self._decode_rope(cache.tables, pos)
        elif c.position == "alibi":
            (slopes,) = cache.tables
            distance = (pos - torch.arange(cache.capacity, device=pos.device)).float()  # (B, S_max): i - j
            bias = -slopes[None, :, None] * distance[:, None, :]  # (B, H, S_max)
            position = (bias.masked_fill(distance[:, None, :] < 0, float("-inf"))[:, :, None, :],)  # (B, H, 1, S_max)
        return position

    def _hidden(self, idx: torch.Tensor, pos: torch.Tensor, position: Optional[tuple], cache=None) -> torch.Tensor:
        """The blocks and the final norm over idx (B, S) at positions pos ((S,) or (B, S))."""
        x = self.embed(idx)  # (B, S, d)
        if self.pos_embed is not None:
            x = x + self.pos_embed(pos)  # + (S, d) or (B, S, d)
        (x,) = self._run_blocks(self.blocks, (self.drop(x),), position, cache)
        return self.norm_f(x)

    def position_tables(self, seq_len: int, device: torch.device) -> Optional[tuple]:
        """What every block's attention needs of the positions, computed once per forward."""
        c = self.config
        if c.position == "rope":
            return positions.rope_cos_sin(seq_len, c.head_dim, c.rope_base, device)  # 2 x (S, D) fp32
        if c.position == "alibi":
            slopes = positions.alibi_slopes_tensor(c.n_head, device)  # (H,) fp32
            return (positions.alibi_causal_bias(slopes, seq_len),)  # (H, S, S) fp32
        return None

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets, ignore_index=self.config.ignore_index)

    def linear_cross_entropy(
        self, hidden: torch.Tensor, targets: torch.Tensor, chunk_tokens: Optional[int] = None
    ) -> torch.Tensor:
        """The loss of lm_head(hidden) in chunks of tokens, each recomputed in backward, so that
        at most one chunk's logits (chunk_tokens, V) exist at a time."""
        if chunk_tokens is None:
            chunk_tokens = max(1, LOSS_CHUNK_LOGITS // self.config.vocab_size)
        ignore_index = self.config.ignore_index

        def chunk_loss_sum(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(F.linear(h, w), t, ignore_index=ignore_index, reduction="sum")

        total, dtype = 0.0, None
        for start in range(0, hidden.shape[0], chunk_tokens):
            h, t = hidden[start : start + chunk_tokens], targets[start : start + chunk_tokens]  # (n, d), (n,)
            chunk = torch.utils.checkpoint.checkpoint(chunk_loss_sum, h, self.lm_head.weight, t, use_reentrant=False)
            total, dtype = total + chunk.float(), chunk.dtype  # summed in fp32
        # The dtype F.cross_entropy gives (the logits', or fp32 under autocast).
        return (total / (targets != ignore_index).sum()).to(dtype)
