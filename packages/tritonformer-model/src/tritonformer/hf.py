"""Hugging Face interop: the Tritonformer kernels in `transformers` models, and GPT-2 weights in ours.

Kernels in a transformers model, in one call (hf_patch: what each switch does, the fallbacks):

    import tritonformer.hf
    report = tritonformer.hf.apply(model)   # Llama, Mistral, Qwen2/3, Gemma 1-3, GPT-2; or apply_to_llama() etc.

GPT-2 weights from `transformers` into a GPT-2-style model of ours:

    from transformers import GPT2LMHeadModel
    from tritonformer import Transformer
    from tritonformer.hf import from_gpt2

    model = from_gpt2(GPT2LMHeadModel.from_pretrained("gpt2"), Transformer)

GPT-2 keeps its linear weights in `Conv1D` modules, stored (in, out): they are transposed to
the (out, in) layout of nn.Linear. The attention's q, k, v stay fused in one qkv matrix, in
the same order. `transformers` is needed only to pass a model or its config; converting a
state_dict needs nothing beyond torch.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Type

import torch

from ._base import CausalLM
from .config import TransformerConfig
from .hf_patch import (  # noqa: F401 - the one-call API lives here
    ATTENTION_NAME,
    PatchReport,
    apply,
    apply_to_gemma,
    apply_to_gemma2,
    apply_to_gemma3,
    apply_to_gpt2,
    apply_to_llama,
    apply_to_mistral,
    apply_to_qwen2,
    apply_to_qwen3,
    revert,
)

# GPT-2 activation names -> (mlp, gelu_approximate).
ACTIVATIONS = {
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "gelu": ("gelu", "none"),
    "relu": ("relu", "tanh"),
}
# Per-block names: GPT-2's -> ours; `conv1d` marks the weights to transpose.
BLOCK_KEYS = {
    "ln_1.weight": ("norm_attn.weight", False),
    "ln_1.bias": ("norm_attn.bias", False),
    "attn.c_attn.weight": ("attn.qkv.weight", True),
    "attn.c_attn.bias": ("attn.qkv.bias", False),
    "attn.c_proj.weight": ("attn.proj.weight", True),
    "attn.c_proj.bias": ("attn.proj.bias", False),
    "ln_2.weight": ("norm_mlp.weight", False),
    "ln_2.bias": ("norm_mlp.bias", False),
    "mlp.c_fc.weight": ("mlp.fc1.weight", True),
    "mlp.c_fc.bias": ("mlp.fc1.bias", False),
    "mlp.c_proj.weight": ("mlp.fc2.weight", True),
    "mlp.c_proj.bias": ("mlp.fc2.bias", False),
}
TOP_KEYS = {
    "wte.weight": "embed.weight",
    "wpe.weight": "pos_embed.weight",
    "ln_f.weight": "norm_f.weight",
    "ln_f.bias": "norm_f.bias",
}
# Buffers older transformers versions kept in the state_dict (causal masks): not weights.
IGNORED = re.compile(r"(^|\.)attn\.(bias|masked_bias)$")


def config_from_gpt2(hf_config: Any, **overrides: Any) -> TransformerConfig:
    """Our TransformerConfig for a transformers GPT2Config (dropout from resid_pdrop)."""
    activation = hf_config.activation_function
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"GPT-2 activation_function={activation!r} has no counterpart; known: {', '.join(ACTIVATIONS)}"
        )
    if getattr(hf_config, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError("scale_attn_by_inverse_layer_idx=True (GPT-2 variants) is not supported")
    mlp, approximate = ACTIVATIONS[activation]
    values = dict(
        vocab_size=hf_config.vocab_size,
        n_layer=hf_config.n_layer,
        n_head=hf_config.n_head,
        d_model=hf_config.n_embd,
        d_ff=hf_config.n_inner or 4 * hf_config.n_embd,
        max_seq_len=hf_config.n_positions,
        position="learned",
        norm="layernorm",
        mlp=mlp,
        gelu_approximate=approximate,
        use_linear_bias=True,
        qkv_bias=True,
        tie_embeddings=getattr(hf_config, "tie_word_embeddings", True),
        dropout=hf_config.resid_pdrop,
        norm_eps=hf_config.layer_norm_epsilon,
    )
    values.update(overrides)
    return TransformerConfig(**values)


def convert_gpt2_state_dict(
    state_dict: Mapping[str, torch.Tensor], config: TransformerConfig
) -> Dict[str, torch.Tensor]:
    """A GPT2LMHeadModel / GPT2Model state_dict renamed to ours, Conv1D weights transposed.

    Raises ValueError on a key it does not know or a weight ours lacks, naming it.
    """
    ours: Dict[str, torch.Tensor] = {}
    for key, value in state_dict.items():
        name = key[len("transformer.") :] if key.startswith("transformer.") else key
        if IGNORED.search(name):
            continue
        if name == "lm_head.weight":
            ours["lm_head.weight"] = value
        elif name in TOP_KEYS:
            ours[TOP_KEYS[name]] = value
        elif (match := re.fullmatch(r"h\.(\d+)\.(.+)", name)) and match.group(2) in BLOCK_KEYS:
            target, conv1d = BLOCK_KEYS[match.group(2)]
            ours[f"blocks.{match.group(1)}.{target}"] = value.t() if conv1d else value
        else:
            raise ValueError(f"unexpected GPT-2 state_dict key {key!r}")
    if "lm_head.weight" not in ours:
        if not config.tie_embeddings:
            raise ValueError("the state_dict has no lm_head.weight and the config does not tie embeddings")
        ours["lm_head.weight"] = ours["embed.weight"]
    return ours


def from_gpt2(
    source: Any,
    model_class: Optional[Type[CausalLM]] = None,
    config: Optional[TransformerConfig] = None,
    **overrides: Any,
) -> CausalLM:
    """A model of ours holding GPT-2's weights, with matching logits.

    source: a transformers GPT2LMHeadModel or GPT2Model, a GPT-2 state_dict (then `config` is
        needed), or a name for GPT2LMHeadModel.from_pretrained.
    model_class: Transformer (default) or TorchTransformer.
    config: our config; by default derived from the source's GPT2Config with `overrides`.
    """
    if model_class is None:
        from .model import Transformer as model_class
    if isinstance(source, str):
        import transformers

        source = transformers.GPT2LMHeadModel.from_pretrained(source)
    if isinstance(source, torch.nn.Module):
        if config is None:
            config = config_from_gpt2(source.config, **overrides)
        state_dict = source.state_dict()
    else:
        if config is None:
            raise ValueError(
                "a GPT-2 state_dict carries no head count: pass config= (e.g. TransformerConfig.preset('gpt2'))"
            )
        state_dict = source
    model = model_class(config)
    converted = convert_gpt2_state_dict(state_dict, config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(converted))
    unexpected = sorted(set(converted) - set(expected))
    mismatched = [
        f"{k} {tuple(v.shape)} vs ours {tuple(expected[k].shape)}"
        for k, v in converted.items()
        if k in expected and v.shape != expected[k].shape
    ]
    if missing or unexpected or mismatched:
        raise ValueError(
            f"GPT-2 weights do not fit this config: missing {missing}, unexpected {unexpected}, "
            f"shapes differ: {mismatched}"
        )
    model.load_state_dict(converted)
    return model
