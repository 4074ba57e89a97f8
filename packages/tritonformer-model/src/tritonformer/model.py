"""Transformer: the GPT on the Tritonformer kernel packages' public APIs.

The same modules under the same names as `TorchTransformer`, so one state_dict loads into
both; every computation runs in the kernel packages:

    linear layers           fused_gemm.Linear (bias epilogues)
    GELU / ReLU MLP         fused_gemm.MLP, one fused_gemm.mlp call (the activation fused into
                            fc1's epilogue, its derivative into the epilogue of fc2's input gradient)
    attention               fused_attention.flash_attention (causal; ALiBi slopes; GQA); without
                            RoPE flash_attention_qkvpacked on the qkv projection's output, whose
                            backward writes the packed gradient (no concatenation of dq, dk, dv);
                            generate's decode steps: flash_attention_with_kvcache on the KV cache
    rotary embedding        fused_rope.apply_rotary_qk (q and k in one launch, rotate-half)
    SwiGLU MLP              fused_swiglu.swiglu_mlp (gate, up and activation in one kernel)
    norms                   fused_norm_xent.add_dropout_norm: residual add + dropout + norm
    loss                    fused_norm_xent.cross_entropy / linear_cross_entropy (fused_loss)

Token and position lookups are nn.Embedding. A config that needs a kernel API the installed
packages do not export yet cannot run on Triton: the constructor raises NotImplementedError
naming each missing API (there is no silent fallback to PyTorch).

The residual stream follows flash-attention's fused pre-norm blocks: each block receives the
previous branch's output h and the residual stream before it, and one kernel computes
residual = residual + dropout(h) and x = norm(residual) together.

Shapes: B batch, S sequence, d d_model, H query heads, Hkv key/value heads, D head_dim,
V vocab_size, F d_ff.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn

import fused_attention
import fused_gemm
import fused_norm_xent
import fused_rope
import fused_swiglu

try:
    from fused_attention import _validation as _attention_validation
except ImportError:  # pragma: no cover - a fused_attention laid out otherwise
    _attention_validation = None

from . import positions, torch_model
from ._base import CausalLM
from .config import TransformerConfig


def required_kernel_apis(config: TransformerConfig) -> List[Tuple[object, str, str]]:
    """(package module, public name, what it is for) for every kernel API this config uses."""
    apis = [
        (fused_gemm, "Linear", "the linear layers"),
        (fused_attention, "flash_attention", "attention"),
        (fused_attention, "flash_attention_qkvpacked", "attention on the packed qkv projection"),
        (fused_attention, "flash_attention_with_kvcache", "generate's decode steps"),
        (fused_norm_xent, "add_dropout_norm", "the residual + dropout + norm of each block"),
        (fused_norm_xent, "LayerNorm" if config.norm == "layernorm" else "RMSNorm", "the norm parameters"),
        (fused_norm_xent, "cross_entropy", "the loss"),
    ]
    if config.fused_loss:
        apis.append((fused_norm_xent, "linear_cross_entropy", "fused_loss=True"))
    if config.position == "rope":
        apis.append((fused_rope, "apply_rotary_qk", "position='rope'"))
    if config.mlp == "swiglu":
        apis.append((fused_swiglu, "swiglu_mlp", "mlp='swiglu'"))
    else:
        apis.append((fused_gemm, "MLP", f"mlp={config.mlp!r}"))
    return apis


def check_kernel_apis(config: TransformerConfig) -> None:
    """Raise NotImplementedError naming every kernel API the config needs that is not exported."""
    missing = [
        f"{package.__name__}.{name} ({purpose})"
        for package, name, purpose in required_kernel_apis(config)
        if not hasattr(package, name)
    ]
    if missing:
        raise NotImplementedError(
            "Transformer cannot run this config on the Triton kernels yet; the kernel packages do not export "
            + ", ".join(missing)
            + ". There is no fallback to PyTorch (TorchTransformer is the plain-PyTorch model)."
        )


def check_attention_heads(config: TransformerConfig) -> None:
    """Raise a ValueError naming the head dim when the attention kernel does not take it, with
    fused_attention's own check (the one its launchers run), at construction rather than at the first forward."""
    check_heads = getattr(_attention_validation, "check_heads", None)
    if check_heads is None:  # a fused_attention without this check: its launcher still checks at the first call
        return
    try:
        check_heads(config.n_head, config.n_kv_head, config.head_dim, config.head_dim)
    except ValueError as error:
        raise ValueError(
            f"head_dim={config.head_dim} (d_model={config.d_model} / n_head={config.n_head}) does not run on the "
            f"attention kernel: {error}"
        ) from None


def make_norm(config: TransformerConfig) -> nn.Module:
    """The norm's parameters (weight, and bias for LayerNorm with use_linear_bias)."""
    if config.norm == "rmsnorm":
        return fused_norm_xent.RMSNorm(config.d_model, eps=config.norm_eps)
    return fused_norm_xent.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.use_linear_bias)


def add_dropout_norm(
    h: torch.Tensor, residual: Optional[torch.Tensor], norm: nn.Module, p: float, config: TransformerConfig
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(norm(residual + dropout(h)), residual + dropout(h)) in one kernel; residual None: just h."""
    return fused_norm_xent.add_dropout_norm(
        h, residual, norm.weight, getattr(norm, "bias", None), p, prenorm=True, norm=config.norm, eps=config.norm_eps
    )


class Attention(nn.Module):
    """Causal self-attention: fused qkv projection, RoPE or ALiBi, flash attention, output projection."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        c = config
        self.qkv = fused_gemm.Linear(c.d_model, (c.n_head + 2 * c.n_kv_head) * c.head_dim, bias=c.qkv_bias)
        self.proj = fused_gemm.Linear(c.n_head * c.head_dim, c.d_model, bias=c.qkv_bias)

    def forward(self, x: torch.Tensor, position: Optional[tuple], cache=None) -> torch.Tensor:
        """x (B, S, d); position: (cos, sin) (S, D) fp32 for rope (decode steps: (B, 1, D), each
        row's position), (slopes (H,) fp32,) for alibi. cache: this layer's generation.LayerCache:
        a prefill writes its keys and values there, a decode step attends to it and appends."""
        c = self.config
        B, S, _ = x.shape
        H, Hkv, D = c.n_head, c.n_kv_head, c.head_dim
        qkv = self.qkv(x).view(B, S, H + 2 * Hkv, D)  # query heads, then key heads, then value heads
        slopes = position[0] if c.position == "alibi" else None
        if c.position == "rope" or cache is not None:
            q, k, v = qkv.split([H, Hkv, Hkv], dim=2)  # strided (B, S, heads, D) views of qkv
        if c.position == "rope":
            cos, sin = position
            # One launch for q and k; (B, H, S, D) views in, results keep the (B, S, H, D) memory.
            q, k = fused_rope.apply_rotary_qk(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, S, H or Hkv, D) views
        if cache is not None and cache.decoding:
            k_cache, v_cache = cache.buffers(k)
            y = fused_attention.flash_attention_with_kvcache(
                q, k_cache, v_cache, cache.lengths, k_new=k, v_new=v, causal=True, alibi_slopes=slopes
            )  # (B, 1, H, D)
        else:
            p = c.attention_dropout if self.training and cache is None else 0.0
            if c.position == "rope":
                y = fused_attention.flash_attention(q, k, v, causal=True, dropout_p=p)  # (B, S, H, D)
            else:
                y = fused_attention.flash_attention_qkvpacked(qkv, Hkv, causal=True, alibi_slopes=slopes, dropout_p=p)
        if cache is not None and not cache.decoding:
            cache.write_prompt(k, v)
        return self.proj(y.reshape(B, S, H * D))  # contiguous (B, S, H, D): a free reshape


class MLP(fused_gemm.MLP):
    """The twin's fc1 and fc2 as fused_gemm.MLP: one fused_gemm.mlp call, the activation in fc1's
    epilogue, its derivative in the epilogue of fc2's input gradient."""

    def __init__(self, config: TransformerConfig):
        act = "relu" if config.mlp == "relu" else ("gelu_tanh" if config.gelu_approximate == "tanh" else "gelu")
        super().__init__(config.d_model, config.d_ff, activation=act, bias=config.use_linear_bias)


class SwiGLUMLP(torch_model.SwiGLUMLP):
    """The twin's parameters (w_gate, w_up, w_down, biases); one fused_swiglu.swiglu_mlp call:
    gate, up and the activation in one kernel, the down projection's backward fused with it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_swiglu.swiglu_mlp(x, self.w_gate, self.w_up, self.w_down, self.b_gate, self.b_up, self.b_down)


class Block(nn.Module):
    """Pre-norm block on the fused residual stream: (h, residual) -> (h', residual')."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.norm_attn = make_norm(config)
        self.attn = Attention(config)
        self.norm_mlp = make_norm(config)
        self.mlp = SwiGLUMLP(config) if config.mlp == "swiglu" else MLP(config)

    def forward(
        self, h: torch.Tensor, residual: Optional[torch.Tensor], position: Optional[tuple], cache=None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        p = self.config.dropout if self.training else 0.0
        x, residual = add_dropout_norm(h, residual, self.norm_attn, p, self.config)  # x = norm(residual)
        h = self.attn(x, position, cache)
        x, residual = add_dropout_norm(h, residual, self.norm_mlp, p, self.config)
        return self.mlp(x), residual


class Transformer(CausalLM):
    """The GPT on the Triton kernel packages; `logits, loss = model(idx, targets)`."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        config.validate()
        check_kernel_apis(config)
        check_attention_heads(config)
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = nn.Embedding(config.max_seq_len, config.d_model) if config.position == "learned" else None
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm_f = make_norm(config)
        self.lm_head = fused_gemm.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.init_weights()

    def _decode_position(self, cache, pos: torch.Tensor) -> Optional[tuple]:
        # RoPE: the tables' rows at each row's position; ALiBi: the slopes as they are (the decode kernel biases).
        return self._decode_rope(cache.tables, pos) if self.config.position == "rope" else cache.tables

    def _hidden(self, idx: torch.Tensor, pos: torch.Tensor, position: Optional[tuple], cache=None) -> torch.Tensor:
        """The blocks and the final norm over idx (B, S) at positions pos ((S,) or (B, S))."""
        h = self.embed(idx)  # (B, S, d)
        if self.pos_embed is not None:
            h = h + self.pos_embed(pos)  # + (S, d) or (B, S, d)
        h, residual = self._run_blocks(self.blocks, (h, None), position, cache)
        p = self.config.dropout if self.training else 0.0
        x, _ = add_dropout_norm(h, residual, self.norm_f, p, self.config)
        return x

    def position_tables(self, seq_len: int, device: torch.device) -> Optional[tuple]:
        """What every block's attention needs of the positions, computed once per forward."""
        c = self.config
        if c.position == "rope":
            return positions.rope_cos_sin(seq_len, c.head_dim, c.rope_base, device)  # 2 x (S, D) fp32
        if c.position == "alibi":
            # fused_attention.alibi_slopes' values, computed on the device: no copy, no stream sync.
            return (positions.alibi_slopes_tensor(c.n_head, device),)  # (H,) fp32
        return None

    def cross_entropy(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return fused_norm_xent.cross_entropy(logits, targets, ignore_index=self.config.ignore_index)

    def linear_cross_entropy(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return fused_norm_xent.linear_cross_entropy(
            hidden,
            self.lm_head.weight,
            targets,
            ignore_index=self.config.ignore_index,
            chunk_size=self.config.loss_chunk_size,
            # Three matmul passes instead of the exact mode's four, for an fp32 buffer of the head's
            # size: small beside the training step's activations.
            weight_grad="fp32",
        )
