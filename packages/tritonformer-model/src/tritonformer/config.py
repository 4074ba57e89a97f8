"""TransformerConfig: every architectural and training option of the GPT, its checks and presets.

One config describes both models (`Transformer` on the kernel packages, `TorchTransformer` in
plain PyTorch); a state_dict of one loads into the other when their configs are equal.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, Optional

POSITIONS = ("learned", "rope", "alibi")
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "relu", "swiglu")
GELU_APPROXIMATIONS = ("tanh", "none")


@dataclasses.dataclass
class TransformerConfig:
    """A decoder-only transformer (pre-norm, causal).

    Sizes:
        vocab_size, n_layer, d_model, max_seq_len: the usual.
        n_head: query heads; head_dim = d_model // n_head.
        n_kv_head: key/value heads (GQA; n_head for multi-head, 1 for multi-query). None: n_head.
        d_ff: hidden width of the MLP. None: 4 * d_model for gelu/relu, and for swiglu the LLaMA
            rule 8/3 * d_model rounded up to a multiple of 256 (same parameter count as 4 * d_model).
    Architecture:
        position: "learned" (GPT-2 position table), "rope" (rotary, rotate-half pairs, base
            `rope_base`) or "alibi" (also `attn_bias=True`: linear attention biases, no table).
        norm: "layernorm" or "rmsnorm", epsilon `norm_eps`.
        mlp: "gelu" (fc1 + GELU + fc2; `gelu_approximate` "tanh" as GPT-2, or "none": exact erf),
            "relu", or "swiglu" (down(silu(gate(x)) * up(x)), LLaMA).
        use_linear_bias: biases in the MLP linears and LayerNorms (GPT-2: True).
        qkv_bias: biases in the attention's qkv and output projections (GPT-2: True).
        tie_embeddings: the output head shares the token embedding matrix.
    Training:
        dropout: probability on the embeddings and on each residual branch.
        attention_dropout: probability on the attention weights (inside fused-attention's kernels;
            SDPA's dropout_p in the PyTorch twin); prefill and decode steps of generate() never drop.
        fused_loss: with targets, compute the loss with a linear+cross-entropy that never holds the
            full (tokens, vocab) logits; `forward` then returns logits None.
        loss_chunk_size: tokens per chunk of the fused loss (`Transformer` only; None: fused_norm_xent's
            default, the largest power of two <= d_model). Each chunk holds a (chunk, vocab) logits
            buffer and adds its share into the fp32 head-weight gradient (a read and a write of
            8 * vocab * d_model bytes): with 8192 the 410M step takes 89.7 ms on an H100 against 91.3
            with None (1024 tokens), at no extra peak memory (the buffer lives after the activations' peak).
        activation_checkpointing: recompute each block in backward instead of storing activations.
        ignore_index: target value that contributes no loss.
    """

    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: Optional[int] = None
    d_model: int = 768
    d_ff: Optional[int] = None
    max_seq_len: int = 1024
    position: str = "learned"
    norm: str = "layernorm"
    mlp: str = "gelu"
    gelu_approximate: str = "tanh"
    use_linear_bias: bool = True
    qkv_bias: bool = True
    tie_embeddings: bool = True
    dropout: float = 0.0
    attention_dropout: float = 0.0
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    fused_loss: bool = False
    loss_chunk_size: Optional[int] = 8192
    activation_checkpointing: bool = False
    ignore_index: int = -100

    def __post_init__(self):
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.d_ff is None and isinstance(self.d_model, int):
            self.d_ff = _default_d_ff(self.d_model, self.mlp)
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError / TypeError naming the first bad option."""
        for name in ("vocab_size", "n_layer", "n_head", "n_kv_head", "d_model", "d_ff", "max_seq_len"):
            _check_positive_int(name, getattr(self, name))
        if self.loss_chunk_size is not None:
            _check_positive_int("loss_chunk_size", self.loss_chunk_size)
        _check_choice("position", self.position, POSITIONS)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("mlp", self.mlp, MLPS)
        _check_choice("gelu_approximate", self.gelu_approximate, GELU_APPROXIMATIONS)
        for name in ("use_linear_bias", "qkv_bias", "tie_embeddings", "fused_loss", "activation_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head} "
                "(each key/value head serves a whole group of query heads)"
            )
        if self.position == "rope" and self.head_dim % 2:
            raise ValueError(f"position='rope' rotates pairs: head_dim={self.head_dim} must be even")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not (_is_finite_number(value) and 0.0 <= value < 1.0):
                raise ValueError(f"{name} must be a probability in [0, 1), got {value!r}")
        if not (_is_finite_number(self.norm_eps) and self.norm_eps > 0):
            raise ValueError(f"norm_eps must be a finite number > 0, got {self.norm_eps!r}")
        if not (_is_finite_number(self.rope_base) and self.rope_base > 1):
            raise ValueError(f"rope_base must be a finite number > 1, got {self.rope_base!r}")
        if not isinstance(self.ignore_index, int) or 0 <= self.ignore_index < self.vocab_size:
            raise ValueError(f"ignore_index={self.ignore_index!r} must be an int outside [0, vocab_size)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def attn_bias(self) -> bool:
        """The `attn_bias` flag: ALiBi attention biases instead of a position table."""
        return self.position == "alibi"

    def num_params(self, matmul_only: bool = True) -> int:
        """The model's parameter count, from the config alone (no model is built).

        matmul_only leaves out the embedding tables, which are lookups; a tied head counts once
        (it is a matmul), an untied one with the matmuls.
        """
        d, f, hd = self.d_model, self.d_ff, self.head_dim
        qkv_out = (self.n_head + 2 * self.n_kv_head) * hd
        norm = d * (2 if self.norm == "layernorm" and self.use_linear_bias else 1)
        attn = d * qkv_out + self.n_head * hd * d + (qkv_out + d) * self.qkv_bias
        if self.mlp == "swiglu":
            mlp = 3 * d * f + (2 * f + d) * self.use_linear_bias
        else:
            mlp = 2 * d * f + (f + d) * self.use_linear_bias
        blocks = self.n_layer * (2 * norm + attn + mlp)
        head = self.vocab_size * d  # the head's matrix, or the tied embedding that serves as it
        total = blocks + norm + head
        if not matmul_only:
            total += self.vocab_size * d * (not self.tie_embeddings)  # the embedding table itself
            total += self.max_seq_len * d * (self.position == "learned")
        return total

    def flops_per_token(self, seq_len: int) -> float:
        """Model flops of one token's forward + backward: 6N + 12 * L * d * S (PaLM, appendix B),
        N = num_params(matmul_only=True)."""
        return 6 * self.num_params(matmul_only=True) + 12 * self.n_layer * self.d_model * seq_len

    def replace(self, **changes: Any) -> TransformerConfig:
        """A copy with some options changed, checked again.

        Derived options that sit at their default follow the options they derive from:
        n_kv_head == n_head follows a new n_head, a default d_ff follows a new d_model or mlp.
        """
        if "n_head" in changes and "n_kv_head" not in changes and self.n_kv_head == self.n_head:
            changes["n_kv_head"] = None
        if (
            ("d_model" in changes or "mlp" in changes)
            and "d_ff" not in changes
            and self.d_ff == _default_d_ff(self.d_model, self.mlp)
        ):
            changes["d_ff"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> TransformerConfig:
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown TransformerConfig option(s): {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> TransformerConfig:
        """A named preset (see PRESETS), with options overridden.

        The `attn_bias` flag is accepted as an override: `attn_bias=True` means position="alibi",
        `attn_bias=False` keeps the preset's position (learned for the GPT-2 style sizes).
        """
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
        values = dict(PRESETS[name])
        attn_bias = overrides.pop("attn_bias", None)
        if attn_bias is not None:
            if not isinstance(attn_bias, bool):
                raise TypeError(f"attn_bias must be a bool, got {attn_bias!r}")
            if attn_bias:
                values["position"] = "alibi"
        values.update(overrides)
        return cls.from_dict(values)


def _default_d_ff(d_model: int, mlp: str) -> int:
    """4 * d_model; for swiglu 8/3 * d_model rounded up to 256 (the same parameter count)."""
    if mlp == "swiglu":
        return 256 * math.ceil(8 * d_model / 3 / 256)
    return 4 * d_model


def _check_positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")


def _is_finite_number(value: Any) -> bool:
    """An int or float (not a bool) that is neither inf nor nan."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name}={value!r}; choose one of {', '.join(map(repr, choices))}")


def _gpt2_style(n_layer: int, n_head: int, d_model: int) -> Dict[str, Any]:
    """Pythia-like sizes (untied head, vocab 50304, context 2048) with GPT-2 blocks.

    Without linear biases (use_linear_bias=False), the benchmarked setting; attn_bias=True gives position="alibi".
    """
    return dict(
        vocab_size=50304, n_layer=n_layer, n_head=n_head, d_model=d_model, max_seq_len=2048,
        position="learned", norm="layernorm", mlp="gelu", use_linear_bias=False, qkv_bias=False,
        tie_embeddings=False,
    )  # fmt: skip


def _llama_style(n_layer: int, n_head: int, d_model: int, d_ff: int, n_kv_head: Optional[int] = None):
    """The same sizes with LLaMA blocks: RMSNorm, SwiGLU, RoPE, no biases, untied head."""
    return dict(
        vocab_size=50304, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head, d_model=d_model, d_ff=d_ff,
        max_seq_len=2048, position="rope", norm="rmsnorm", mlp="swiglu", use_linear_bias=False, qkv_bias=False,
        tie_embeddings=False,
    )  # fmt: skip


PRESETS: Dict[str, Dict[str, Any]] = {
    # A model the interpreter trains in minutes on a CPU (byte-level vocabulary).
    "tiny": dict(
        _gpt2_style(2, 4, 64),
        vocab_size=256,
        d_ff=256,
        max_seq_len=64,
        use_linear_bias=True,
        qkv_bias=True,
        tie_embeddings=True,
    ),
    "tiny-llama": dict(_llama_style(2, 4, 64, 192, n_kv_head=2), vocab_size=256, max_seq_len=64, tie_embeddings=True),
    # GPT-2 itself (124M), for Hugging Face checkpoints: biases everywhere, tied head, vocab 50257.
    "gpt2": dict(
        _gpt2_style(12, 12, 768),
        vocab_size=50257,
        max_seq_len=1024,
        use_linear_bias=True,
        qkv_bias=True,
        tie_embeddings=True,
    ),
    # Pythia-like sizes, GPT-2 style without linear biases.
    "160M": _gpt2_style(12, 12, 768),
    "410M": _gpt2_style(24, 16, 1024),
    "840M": _gpt2_style(24, 16, 1536),
    "1.4B": _gpt2_style(24, 16, 2048),
    # The same sizes, LLaMA style (d_ff: 8/3 d rounded up to 256; 1.4B: 5632 as in TinyLlama).
    "llama-160M": _llama_style(12, 12, 768, 2048),
    "llama-410M": _llama_style(24, 16, 1024, 2816),
    "llama-840M": _llama_style(24, 16, 1536, 4096),
    "llama-1.4B": _llama_style(24, 16, 2048, 5632),
    "llama-1.4B-gqa": _llama_style(24, 16, 2048, 5632, n_kv_head=4),
}
