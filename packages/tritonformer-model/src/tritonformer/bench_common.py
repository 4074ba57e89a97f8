"""What the training-step and generation benchmarks share: the environment line, Hugging Face
Llama models of a config, memory release between providers, list arguments."""

from __future__ import annotations

import gc
import sys
from typing import Iterable, List, Optional

import torch

from .config import TransformerConfig

# The Hugging Face architectures the benchmarks build from a LLaMA-style config: (config class,
# model class, Liger-Kernel's patch function).
HF_ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", "apply_liger_kernel_to_llama"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "apply_liger_kernel_to_qwen2"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", "apply_liger_kernel_to_gemma2"),
}
# Gemma-2's own options at the config's shape: its softcaps (attention 50, final logits 30), a
# 4096-token window on every other layer, the scale 1 / sqrt(head dim), GeGLU (its default).
GEMMA2_OPTIONS = dict(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=4096)


def hf_model(config: TransformerConfig, arch: str = "llama", patch: str = "") -> torch.nn.Module:
    """A Hugging Face causal LM of architecture `arch` ("llama"; "qwen2", whose q/k/v carry biases;
    "gemma2", GEMMA2_OPTIONS, eager attention: SDPA refuses its softcap) with the config's shape
    (SDPA attention); patch: "" (plain), "tritonformer" (this model's instance patched by
    tritonformer.hf.apply) or "liger"."""
    import transformers

    config_class, model_class, liger_patch = HF_ARCHITECTURES[arch]
    if patch == "liger":
        import liger_kernel.transformers

        getattr(liger_kernel.transformers, liger_patch)()  # patches the classes of this process
    shape = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.n_layer,
        num_attention_heads=config.n_head,
        num_key_value_heads=config.n_kv_head,
        max_position_embeddings=config.max_seq_len,
        rms_norm_eps=config.norm_eps,
        rope_theta=config.rope_base,
        tie_word_embeddings=config.tie_embeddings,
        attn_implementation="sdpa",
    )
    if arch == "llama":
        shape.update(attention_bias=config.qkv_bias, mlp_bias=config.use_linear_bias)
    if arch == "gemma2":
        head_dim = config.d_model // config.n_head
        shape.update(GEMMA2_OPTIONS, head_dim=head_dim, query_pre_attn_scalar=head_dim, attn_implementation="eager")
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**shape))
    if patch == "tritonformer":
        from . import hf

        hf.apply(model)
    return model


def hf_skip_reason(config: TransformerConfig, liger: bool) -> Optional[str]:
    llama = config.position == "rope" and config.norm == "rmsnorm" and config.mlp == "swiglu"
    if not llama:
        return "not a LLaMA-style config (rope, rmsnorm, swiglu)"
    try:
        import transformers  # noqa: F401
    except ImportError as error:
        return f"transformers does not import ({error})"
    if liger:
        try:
            import liger_kernel  # noqa: F401
        except ImportError as error:
            return f"liger_kernel does not import ({error})"
    return None


def release_memory(device: torch.device) -> None:
    """Free what the last provider held (unreferenced by now) and reset dynamo."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if "torch._dynamo" in sys.modules:  # only where something was compiled (importing it costs)
        torch._dynamo.reset()


def environment_line(device: torch.device, precision: str = "bf16 autocast, fp32 weights") -> str:
    """The GPU (or CPU), torch and Triton versions and the precision a table was measured at."""
    import triton

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (smoke test, not a benchmark)"
    return f"{where}, torch {torch.__version__}, triton {triton.__version__}, {precision}"


def split_list(values: Optional[Iterable[str]]) -> List[str]:
    """Values given space- or comma-separated, or both ("a,b c" -> [a, b, c])."""
    return [item for value in values or () for item in value.split(",") if item]
