"""The Tritonformer kernels in Hugging Face `transformers` models, in one call.

    import tritonformer.hf
    report = tritonformer.hf.apply(model)       # an instantiated LlamaForCausalLM, MistralForCausalLM, ...
    print(report)                               # what was patched, what was left alone and why

    tritonformer.hf.apply_to_llama()            # or: patch the classes before instantiation
    model = LlamaForCausalLM.from_pretrained(...)

Model types: llama, mistral, qwen2, gemma (RMSNorm with the `1 + w` offset), gpt2. Switches:
- rms_norm: the RMSNorm modules through fused_norm_xent.rms_norm (GPT-2: layer_norm, its LayerNorms).
- rope: the modeling module's `apply_rotary_pos_emb` through fused_rope.apply_rotary_qk.
- swiglu: the gate/up/down MLP through fused_swiglu.swiglu_mlp (when the activation is SiLU).
- attention: the attention-function registry entry "tritonformer" (fused_attention's flash kernels,
  the varlen kernel when a padding mask has padding), with transformers' sdpa for what they cannot do.
- cross_entropy: the causal-LM loss through fused_norm_xent.cross_entropy.
- fused_linear_cross_entropy: in training, `model(..., labels=...)` computes the loss from the final
  hidden states with fused_norm_xent.linear_cross_entropy and returns logits=None (no (tokens, vocab)
  logits tensor); without labels, or in eval mode, the forward is unchanged.

Every patched forward checks its inputs on each call and runs the original code where a kernel
cannot (a CPU tensor without TRITON_INTERPRET=1, float64, an unsupported head dim, ...), so a patched
model computes what the unpatched one does. `revert(model)` / `revert()` undo the patches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import os
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from ._compat import autocast_dtype

ATTENTION_NAME = "tritonformer"

# fused_attention.flash_attention's head dims (its documented set).
_ATTENTION_HEAD_DIMS = frozenset((16, 32, 64, 80, 96, 128, 160, 192, 256))
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_HALF_DTYPES = (torch.float16, torch.bfloat16)
# Attention features that some models pass to their attention function and the kernels lack: sdpa
# ignores sinks silently, so those raise; softcap and position biases go to sdpa (which raises or applies them).
_SINK_KWARGS = ("s_aux", "sinks")
_SDPA_ONLY_KWARGS = ("softcap", "position_bias")

SWITCHES = ("rms_norm", "layer_norm", "rope", "swiglu", "attention", "cross_entropy", "fused_linear_cross_entropy")


@dataclasses.dataclass(frozen=True)
class _ModelSpec:
    """Where a model type keeps the pieces that the switches replace."""

    model_type: str
    module: str
    causal_lm: str
    pretrained: str
    attention: str
    output: str
    rms_norm: Optional[str] = None
    rms_offset: float = 0.0
    mlp: Optional[str] = None
    rope: bool = True
    layer_norm: bool = False  # GPT-2: torch.nn.LayerNorm modules


def _llama_like(model_type: str, prefix: str, **options: Any) -> _ModelSpec:
    values = dict(
        model_type=model_type,
        module=f"transformers.models.{model_type}.modeling_{model_type}",
        causal_lm=f"{prefix}ForCausalLM",
        pretrained=f"{prefix}PreTrainedModel",
        attention=f"{prefix}Attention",
        output="CausalLMOutputWithPast",
        rms_norm=f"{prefix}RMSNorm",
        mlp=f"{prefix}MLP",
    )
    values.update(options)
    return _ModelSpec(**values)


SPECS: Dict[str, _ModelSpec] = {
    "llama": _llama_like("llama", "Llama"),
    "mistral": _llama_like("mistral", "Mistral"),
    "qwen2": _llama_like("qwen2", "Qwen2"),
    "gemma": _llama_like("gemma", "Gemma", rms_offset=1.0),
    "gpt2": _ModelSpec(
        model_type="gpt2",
        module="transformers.models.gpt2.modeling_gpt2",
        causal_lm="GPT2LMHeadModel",
        pretrained="GPT2PreTrainedModel",
        attention="GPT2Attention",
        output="CausalLMOutputWithCrossAttentions",
        rope=False,
        layer_norm=True,
    ),
}


@dataclasses.dataclass
class PatchReport:
    """What apply / apply_to_<model> did: switch -> what was patched, switch -> why it was left alone."""

    model_type: str
    patched: Dict[str, str] = dataclasses.field(default_factory=dict)
    skipped: Dict[str, str] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"tritonformer patches for {self.model_type}:"]
        lines += [f"  {name}: {what}" for name, what in self.patched.items()]
        lines += [f"  {name}: not patched ({why})" for name, why in self.skipped.items()]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Where kernels can run, and the original code where they cannot.


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _on_kernel_device(*tensors: Optional[torch.Tensor]) -> bool:
    """Every tensor on a CUDA device, or on the CPU under Triton's interpreter."""
    interpreting = _interpreting()
    return all(t is None or t.device.type == "cuda" or (interpreting and t.device.type == "cpu") for t in tensors)


def _kernel_floats(*tensors: Optional[torch.Tensor]) -> bool:
    return all(t is None or t.dtype in _KERNEL_DTYPES for t in tensors)


# (class, attribute) -> the value it had before a class-level patch.
_CLASS_ORIGINALS: Dict[Tuple[Any, str], Any] = {}
_MISSING = object()


def _original(module: torch.nn.Module, name: str = "forward") -> Callable:
    """The unpatched `name` of module's class (a class-level patch keeps the original aside)."""
    for klass in type(module).__mro__:
        saved = _CLASS_ORIGINALS.get((klass, name), _MISSING)
        if saved is not _MISSING:
            return saved
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(f"{type(module).__name__} has no {name}")


# ---------------------------------------------------------------------------------------------
# Norms, MLP, rotary embedding.


def _rms_norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm / MistralRMSNorm / Qwen2RMSNorm: weight * normalized x, in x's dtype promoted with the weight's."""
    weight = self.weight
    if not (_on_kernel_device(hidden_states, weight) and _kernel_floats(hidden_states, weight)):
        return _original(self)(self, hidden_states)
    from fused_norm_xent import rms_norm

    out = rms_norm(hidden_states, (hidden_states.shape[-1],), weight, self.variance_epsilon)
    dtype = torch.promote_types(hidden_states.dtype, weight.dtype)
    return out if out.dtype == dtype else out.to(dtype)


def _offset_rms_norm_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """GemmaRMSNorm: normalized x * (1 + weight), in x's dtype."""
    weight = self.weight
    if not (_on_kernel_device(x, weight) and _kernel_floats(x, weight)):
        return _original(self)(self, x)
    from fused_norm_xent import rms_norm

    return rms_norm(x, (x.shape[-1],), weight, self.eps, offset=1.0)


def _layer_norm_forward(self: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """torch.nn.LayerNorm; under autocast in fp32, as torch computes layer_norm there."""
    if not (_on_kernel_device(x, self.weight, self.bias) and _kernel_floats(x, self.weight, self.bias)):
        return _original(self)(self, x)
    from fused_norm_xent import layer_norm

    if x.dtype != torch.float32 and autocast_dtype(x.device.type) is not None:
        x = x.float()
    return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


def _is_silu(activation: torch.nn.Module) -> bool:
    return isinstance(activation, torch.nn.SiLU) or type(activation).__name__ == "SiLUActivation"


def _swiglu_mlp_ready(mlp: torch.nn.Module) -> Optional[str]:
    """None when mlp is down(silu(gate(x)) * up(x)) of plain nn.Linear layers, else why not."""
    if not _is_silu(getattr(mlp, "act_fn", None)):
        return f"the activation is {type(getattr(mlp, 'act_fn', None)).__name__}, not SiLU"
    layers = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if any(type(layer) is not torch.nn.Linear for layer in layers):
        return "gate_proj, up_proj and down_proj are not all torch.nn.Linear"
    if (layers[0].bias is None) != (layers[1].bias is None):
        return "gate_proj and up_proj must both have a bias or neither"
    return None


def _swiglu_mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down_proj(silu(gate_proj(x)) * up_proj(x)) in one fused_swiglu.swiglu_mlp call."""
    gate, up, down = self.gate_proj, self.up_proj, self.down_proj
    weights = (gate.weight, up.weight, down.weight)
    same_dtype = all(w.dtype == x.dtype for w in weights) or autocast_dtype(x.device.type) is not None
    if not (same_dtype and _on_kernel_device(x, *weights) and _kernel_floats(x, *weights)) or _swiglu_mlp_ready(self):
        return _original(self)(self, x)
    from fused_swiglu import swiglu_mlp

    # nn.Linear keeps (out, in) weights; swiglu_mlp takes (in, out): transposed views, no copies.
    return swiglu_mlp(x, gate.weight.t(), up.weight.t(), down.weight.t(), gate.bias, up.bias, down.bias)


def _make_rope(original: Callable) -> Callable:
    """apply_rotary_pos_emb(q, k, cos, sin) through fused_rope.apply_rotary_qk, `original` where it cannot."""

    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        unsqueeze_dim = kwargs.pop("unsqueeze_dim", 1) if not args else args[0]
        if (
            len(args) > 1
            or kwargs
            or unsqueeze_dim != 1
            or not _rope_ready(q, k, cos, sin)
        ):  # fmt: skip
            return original(q, k, cos, sin, *args, **kwargs)
        from fused_rope import apply_rotary_qk

        # q * cos + rotate_half(q) * sin has the dtype of q promoted with cos's (fp32 cos under autocast).
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), cos.dtype)
        return apply_rotary_qk(q.to(dtype), k.to(dtype), cos, sin)

    apply_rotary_pos_emb.__tritonformer_original__ = original
    return apply_rotary_pos_emb


def _rope_ready(q, k, cos, sin) -> bool:
    """q (B, H, S, D), k (B, H_kv, S, D) and cos/sin (B or 1, S, D): the shapes the kernel and HF agree on."""
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape:
        return False
    batch, _, seq, head_dim = q.shape
    shapes_fit = (
        k.shape[0] == batch and k.shape[2] == seq and k.shape[3] == head_dim
        and cos.shape[0] in (1, batch) and cos.shape[1] == seq and cos.shape[2] == head_dim and head_dim % 2 == 0
    )  # fmt: skip
    return shapes_fit and _on_kernel_device(q, k, cos, sin) and _kernel_floats(q, k, cos, sin)


def _rebind_rope(attention_module: torch.nn.Module, rope: Callable) -> Callable:
    """A copy of the attention class's forward whose `apply_rotary_pos_emb` is `rope`, for one instance
    (the function's own globals are the modeling module's, shared by every model of the type)."""
    raw = inspect.unwrap(_original(attention_module))
    namespace = dict(raw.__globals__)
    namespace["apply_rotary_pos_emb"] = rope
    clone = types.FunctionType(raw.__code__, namespace, raw.__name__, raw.__defaults__, raw.__closure__)
    clone.__kwdefaults__ = raw.__kwdefaults__
    clone.__qualname__ = raw.__qualname__
    return clone


# ---------------------------------------------------------------------------------------------
# Attention.


def _mask_layout(mask_function: Callable) -> bool:
    """Whether a transformers mask function is plain causal, or causal with a sliding window: the
    masks that causal flash attention with a window and a padding mask reproduce. Anything else
    (packed sequences, block or chunked masks, custom or_mask/and_mask functions) is not."""
    from transformers import masking_utils

    if mask_function is masking_utils.causal_mask_function:
        return True
    cells = _closure(mask_function)
    parts = cells.get("mask_functions")
    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask" or not isinstance(parts, tuple):
        return False
    return (
        len(parts) == 2
        and parts[1] is masking_utils.causal_mask_function
        and getattr(parts[0], "__qualname__", "") == "sliding_window_overlay.<locals>.inner_mask"
    )


def _closure(function: Callable) -> Dict[str, Any]:
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or cells is None:
        return {}
    return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}


def tritonformer_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Optional[Callable] = None,
    attention_mask: Optional[torch.Tensor] = None,
    **kwargs: Any,
) -> Optional[torch.Tensor]:
    """The attention-mask registry entry of "tritonformer".

    For a causal (or sliding-window causal) mask: None when every key up to the last query is
    visible, else a (batch, keys up to the last query) bool padding mask; the queries are the last
    q_length of those keys. Any other mask: sdpa's 4-D mask (the attention then runs sdpa).
    """
    from transformers import masking_utils

    if mask_function is None:
        mask_function = masking_utils.causal_mask_function
    if not _mask_layout(mask_function):
        return masking_utils.sdpa_mask(
            batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
            mask_function=mask_function, attention_mask=attention_mask, **kwargs,
        )  # fmt: skip
    # Keys past the last query (unused static-cache slots) are seen by no query: cut off.
    visible = int(q_offset) + q_length - int(kv_offset)
    if attention_mask is None:
        if visible == kv_length:
            return None
        return torch.ones(batch_size, visible, dtype=torch.bool, device=kwargs.get("device", "cpu"))
    padding = masking_utils.prepare_padding_mask(attention_mask.bool(), kv_length, kv_offset)
    padding = padding[:, int(kv_offset) : int(kv_offset) + visible]
    if visible == kv_length and bool(padding.all()):
        return None
    return padding


def _sdpa_mask_from_padding(
    padding: Optional[torch.Tensor], q_len: int, k_len: int, window: Optional[int], device
) -> Optional[torch.Tensor]:
    """sdpa's 4-D bool mask for a causal attention given tritonformer_mask's output: None where sdpa
    takes is_causal alone (no padding, no window in reach, queries aligned with keys or one query)."""
    visible = k_len if padding is None else padding.shape[-1]
    window_reaches = window is not None and k_len >= window
    if padding is None and not window_reaches and (q_len == 1 or q_len == k_len):
        return None
    rows = torch.arange(q_len, device=device)[:, None] + (visible - q_len)
    cols = torch.arange(k_len, device=device)[None, :]
    allowed = cols <= rows
    if window is not None:
        allowed = allowed & (cols > rows - window)
    allowed = allowed[None, None]
    if padding is not None:
        allowed = allowed & F.pad(padding, (0, k_len - visible), value=False)[:, None, None, :]
    return allowed


def _sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
    )


def _kernel_attention_blocker(query, key, value, attention_mask, dropout, scaling, causal, window) -> Optional[str]:
    """None when fused_attention computes this call exactly as sdpa would, else why not."""
    if dropout:
        return "attention dropout"
    if attention_mask is not None and (attention_mask.dim() != 2 or not causal):
        return "a mask other than a causal padding mask"
    if window is not None and not causal:
        return "a non-causal sliding window"
    if query.dim() != 4 or key.shape != value.shape or query.shape[-1] != key.shape[-1]:
        return "q, k, v shapes"
    if query.shape[-1] not in _ATTENTION_HEAD_DIMS:
        return f"head dim {query.shape[-1]}"
    if query.shape[1] % key.shape[1] or query.shape[0] != key.shape[0]:
        return "head counts"
    if scaling is not None and not scaling > 0:
        return f"softmax scale {scaling}"
    if not _on_kernel_device(query, key, value):
        return "device"
    dtypes = {query.dtype, key.dtype, value.dtype}
    half = dtypes <= set(_HALF_DTYPES) and len(dtypes) == 1
    if not half and not (dtypes == {torch.float32} and autocast_dtype(query.device.type) in _HALF_DTYPES):
        return "dtype"
    return None


def tritonformer_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, None]:
    """The attention-function registry entry of "tritonformer": sdpa's contract, flash kernels inside.

    query (B, H, S_q, D), key/value (B, H_kv, S_k, D) (GQA: H_kv heads, never repeated). Returns
    ((B, S_q, H, D), None). With tritonformer_mask's masks: no mask -> flash_attention (causal,
    sliding window from kwargs["sliding_window"]); a padding mask -> the tokens unpadded and
    flash_attention_varlen (rows of padded queries are 0, as flash_attention_2 leaves them).
    sdpa computes what the kernels cannot (dropout, a 4-D mask, fp32 without autocast, head dims
    outside the kernel's set, softcap, position biases, a sliding window over a mask with holes).
    """
    for name in _SINK_KWARGS:
        if kwargs.get(name) is not None:
            raise ValueError(
                f"tritonformer attention: {name} (attention sinks) is not supported; use another attn_implementation"
            )
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window = kwargs.pop("sliding_window", None)
    blocker = _kernel_attention_blocker(query, key, value, attention_mask, dropout, scaling, causal, window)
    if blocker is None and any(kwargs.get(name) is not None for name in _SDPA_ONLY_KWARGS):
        blocker = "softcap or position bias"
    if blocker is None and attention_mask is not None:
        return _varlen_attention(module, query, key, value, attention_mask, dropout, scaling, causal, window, kwargs)
    if blocker is not None:
        return _fallback(module, query, key, value, attention_mask, dropout, scaling, causal, window, kwargs)
    from fused_attention import flash_attention

    # (B, H, S, D) views of (B, S, H, D) projections: transposed back, usually without a copy.
    out = flash_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=causal, softmax_scale=scaling,
        window_size=_window_size(window), layout="bshd",
    )  # fmt: skip
    return out, None


def _window_size(window: Optional[int]) -> Tuple[int, int]:
    """transformers' sliding window W (a query sees itself and the W - 1 keys before) as (left, right)."""
    return (-1, -1) if window is None else (window - 1, 0)


def _fallback(module, query, key, value, attention_mask, dropout, scaling, causal, window, kwargs):
    """sdpa on the 4-D mask it would have been given (tritonformer_mask's 2-D masks rebuilt)."""
    if attention_mask is None or attention_mask.dim() == 2:
        if causal:
            attention_mask = _sdpa_mask_from_padding(attention_mask, query.shape[2], key.shape[2], window, query.device)
    return _sdpa(module, query, key, value, attention_mask, dropout, scaling, causal, **kwargs)


def _varlen_attention(module, query, key, value, padding, dropout, scaling, causal, window, kwargs):
    """flash_attention_varlen over the unpadded tokens of a (B, keys up to the last query) padding mask."""
    from fused_attention import flash_attention_varlen

    padding = padding.bool()
    batch, q_len, visible = query.shape[0], query.shape[2], padding.shape[-1]
    key, value = key[:, :, :visible], value[:, :, :visible]
    queries = padding[:, visible - q_len :]
    k_lens, q_lens = padding.sum(-1, dtype=torch.int32), queries.sum(-1, dtype=torch.int32)
    # One host read: the launch sizes, and whether a window meets padding inside a row (the kernel's
    # window counts unpadded tokens, transformers' counts positions: equal without holes).
    first = torch.where(k_lens > 0, padding.int().argmax(-1), 0)
    last = visible - 1 - padding.flip(-1).int().argmax(-1)
    holes = ((last - first + 1 != k_lens) & (k_lens > 0)).any()
    max_k, max_q, has_holes = torch.stack([k_lens.max(), q_lens.max(), holes.int()]).tolist()
    if has_holes and window is not None:
        return _fallback(module, query, key, value, padding, dropout, scaling, causal, window, kwargs)
    out = query.new_zeros(batch, q_len, query.shape[1], query.shape[3])
    if max_q == 0:
        return out, None
    cu_k = F.pad(k_lens.cumsum(0, dtype=torch.int32), (1, 0))
    cu_q = F.pad(q_lens.cumsum(0, dtype=torch.int32), (1, 0))
    q_packed = query.transpose(1, 2)[queries]  # (total_q, H, D)
    k_packed, v_packed = key.transpose(1, 2)[padding], value.transpose(1, 2)[padding]
    packed = flash_attention_varlen(
        q_packed, k_packed, v_packed, cu_q, cu_k, max(max_q, 1), max(max_k, 1), causal=causal,
        softmax_scale=scaling, window_size=_window_size(window), check_seqlens=False,
    )  # fmt: skip
    out = out.to(packed.dtype)
    out[queries] = packed
    return out, None


def _register_attention() -> None:
    """Registers "tritonformer" in transformers' attention-function and attention-mask registries."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, tritonformer_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, tritonformer_mask)


# ---------------------------------------------------------------------------------------------
# Losses.


def _shifted_labels(labels: torch.Tensor, ignore_index: int, shift_labels: Optional[torch.Tensor]) -> torch.Tensor:
    """ForCausalLMLoss's targets: labels moved one to the left, the last position ignored."""
    if shift_labels is not None:
        return shift_labels
    return F.pad(labels, (0, 1), value=ignore_index)[..., 1:]


def _fp32_loss(tensor: torch.Tensor):
    """transformers returns fp32 causal-LM losses (it upcasts the logits); the kernels return the loss in
    fp32 under autocast, so a half-precision input is run under autocast to its own dtype (no casts)."""
    device_type = tensor.device.type
    if tensor.dtype in _HALF_DTYPES and autocast_dtype(device_type) is None:
        return torch.autocast(device_type, dtype=tensor.dtype)
    return contextlib.nullcontext()


def _reduce(loss_fn: Callable, num_items_in_batch) -> torch.Tensor:
    if num_items_in_batch is None:
        return loss_fn("mean")
    loss = loss_fn("sum")
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def causal_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    vocab_size: int,
    num_items_in_batch: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    shift_labels: Optional[torch.Tensor] = None,
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' ForCausalLMLoss through fused_norm_xent.cross_entropy (the logits are not upcast)."""
    if not (_on_kernel_device(logits) and _kernel_floats(logits)):
        from transformers.loss.loss_utils import ForCausalLMLoss

        return ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch, ignore_index, shift_labels, **kwargs)
    from fused_norm_xent import cross_entropy

    target = _shifted_labels(labels, ignore_index, shift_labels).reshape(-1).to(logits.device)
    logits = logits.reshape(-1, vocab_size)
    with _fp32_loss(logits):
        return _reduce(
            lambda reduction: cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction),
            num_items_in_batch,
        )


def linear_causal_lm_loss(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    labels: torch.Tensor,
    num_items_in_batch: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    shift_labels: Optional[torch.Tensor] = None,
    **kwargs: Any,
) -> torch.Tensor:
    """ForCausalLMLoss of lm_head(hidden_states) with fused_norm_xent.linear_cross_entropy: no logits."""
    from fused_norm_xent import linear_cross_entropy

    target = _shifted_labels(labels, ignore_index, shift_labels).to(hidden_states.device)
    with _fp32_loss(hidden_states):
        return _reduce(
            lambda reduction: linear_cross_entropy(
                hidden_states, weight, target, bias, ignore_index=ignore_index, reduction=reduction
            ),
            num_items_in_batch,
        )


def _make_causal_lm_forward(original: Callable, output_class: type) -> Callable:
    """The CausalLM forward with the fused linear cross-entropy in training: `original` otherwise."""
    signature = inspect.signature(original)
    parameters = list(signature.parameters.values())
    var_keyword = next((p.name for p in parameters if p.kind is p.VAR_KEYWORD), None)

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if args[1:]:  # labels may be positional: name every argument
            bound = signature.bind(self, *args, **kwargs).arguments
            bound.pop(parameters[0].name)
            kwargs = {**bound, **bound.pop(var_keyword, {})} if var_keyword else dict(bound)
            args = ()
        elif args:
            kwargs = {parameters[1].name: args[0], **kwargs}
            args = ()
        if not _fused_loss_applies(self, kwargs):
            return original(self, **kwargs)
        return _fused_causal_lm_forward(self, output_class, kwargs)

    forward.__tritonformer_original__ = original
    return forward


def _fused_loss_applies(model: torch.nn.Module, kwargs: Dict[str, Any]) -> bool:
    """Labels, training mode, every position's logits asked for, and a head the kernel can take."""
    if kwargs.get("labels") is None or not model.training:
        return False
    keep = kwargs.get("logits_to_keep", 0)
    if not (isinstance(keep, int) and keep == 0):
        return False
    head = model.get_output_embeddings()
    return _on_kernel_device(head.weight, head.bias) and _kernel_floats(head.weight, head.bias)


def _fused_causal_lm_forward(model, output_class: type, kwargs: Dict[str, Any]):
    labels = kwargs.pop("labels")
    kwargs.pop("logits_to_keep", None)
    return_dict = kwargs.pop("return_dict", None)
    if return_dict is None:
        return_dict = getattr(model.config, "return_dict", True)
    outputs = getattr(model, model.base_model_prefix)(**kwargs)
    hidden_states = outputs[0] if isinstance(outputs, tuple) else outputs.last_hidden_state
    head = model.get_output_embeddings()
    loss = linear_causal_lm_loss(hidden_states, head.weight, head.bias, labels, **kwargs)
    fields = {
        field.name: getattr(outputs, field.name, None)
        for field in dataclasses.fields(output_class)
        if field.name not in ("loss", "logits")
    }
    output = output_class(loss=loss, logits=None, **fields)
    return output if return_dict else output.to_tuple()


# ---------------------------------------------------------------------------------------------
# Patching an instantiated model: every switch's preconditions are checked before anything changes.

Step = Callable[[], Callable[[], None]]  # runs a change, returns its undo
Plan = Tuple[str, List[Step]]  # what is patched, the steps (or a str: why the switch is left alone)


def _set_attribute(obj: Any, name: str, value: Any) -> Step:
    def run() -> Callable[[], None]:
        previous = vars(obj).get(name, _MISSING)
        setattr(obj, name, value)

        def undo() -> None:
            if previous is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, previous)

        return undo

    return run


def _bind_forwards(modules: List[torch.nn.Module], function: Callable) -> List[Step]:
    return [_set_attribute(module, "forward", types.MethodType(function, module)) for module in modules]


def _instance_forward_state(modules: List[torch.nn.Module], function: Callable) -> Optional[str]:
    """'patched' when every module already runs `function`, a reason when any has another instance
    forward (set by something else), None when none is overridden."""
    overridden = [vars(m)["forward"] for m in modules if "forward" in vars(m)]
    if not overridden:
        return None
    if len(overridden) == len(modules) and all(getattr(f, "__func__", None) is function for f in overridden):
        return "patched"
    return f"{type(modules[0]).__name__} modules already have a forward set on the instance (another patch)"


def _modules_of(model: torch.nn.Module, cls: Optional[type]) -> List[torch.nn.Module]:
    return [m for m in model.modules() if cls is not None and type(m) is cls]


def _forward_swap(modules: List[torch.nn.Module], function: Callable, description: str, what: str):
    """The plan that binds `function` as the forward of every module, or why not."""
    if not modules:
        return f"the model has no {what} modules"
    state = _instance_forward_state(modules, function)
    if state == "patched":
        return description + " (already patched)", []
    if state is not None:
        return state
    if (type(modules[0]), "forward") in _CLASS_ORIGINALS:
        return description + " (patched at class level)", []
    return description, _bind_forwards(modules, function)


def _plan_rms_norm(model, spec: _ModelSpec, modeling) -> Any:
    if spec.rms_norm is None:
        return f"{spec.model_type} has no RMSNorm (its LayerNorms: layer_norm)"
    cls = getattr(modeling, spec.rms_norm, None)
    modules = _modules_of(model, cls)
    eps = "eps" if spec.rms_offset else "variance_epsilon"
    for module in modules:
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1 or not hasattr(module, eps):
            return f"{spec.rms_norm} has no 1-D weight and {eps} (a different transformers version)"
    forward = _offset_rms_norm_forward if spec.rms_offset else _rms_norm_forward
    offset = " (offset 1: normalized x * (1 + w))" if spec.rms_offset else ""
    return _forward_swap(
        modules, forward, f"{len(modules)} {spec.rms_norm} -> fused_norm_xent.rms_norm{offset}", spec.rms_norm or ""
    )


def _plan_layer_norm(model, spec: _ModelSpec, modeling) -> Any:
    if not spec.layer_norm:
        return f"{spec.model_type} has no LayerNorm (its RMSNorms: rms_norm)"
    modules = _modules_of(model, torch.nn.LayerNorm)
    return _forward_swap(
        modules, _layer_norm_forward, f"{len(modules)} torch.nn.LayerNorm -> fused_norm_xent.layer_norm", "LayerNorm"
    )


def _plan_swiglu(model, spec: _ModelSpec, modeling) -> Any:
    if spec.mlp is None:
        return f"{spec.model_type}'s MLP is not gated (no SwiGLU)"
    modules = _modules_of(model, getattr(modeling, spec.mlp, None))
    for module in modules:
        reason = _swiglu_mlp_ready(module)
        if reason:
            return f"{spec.mlp}: {reason}"
    return _forward_swap(
        modules, _swiglu_mlp_forward, f"{len(modules)} {spec.mlp} -> fused_swiglu.swiglu_mlp", spec.mlp
    )


def _plan_rope(model, spec: _ModelSpec, modeling) -> Any:
    if not spec.rope:
        return f"{spec.model_type} has no rotary embedding"
    current = getattr(modeling, "apply_rotary_pos_emb", None)
    if not callable(current):
        return f"{spec.module} has no apply_rotary_pos_emb"
    description = f"apply_rotary_pos_emb -> fused_rope.apply_rotary_qk in every {spec.attention}"
    if hasattr(current, "__tritonformer_original__"):
        return description + " (patched at class level)", []
    modules = _modules_of(model, getattr(modeling, spec.attention, None))
    if not modules:
        return f"the model has no {spec.attention} modules"
    overridden = [vars(m)["forward"] for m in modules if "forward" in vars(m)]
    if overridden:
        if all(getattr(getattr(f, "__func__", None), "__tritonformer_rope__", False) for f in overridden):
            return description + " (already patched)", []
        return f"{spec.attention} modules already have a forward set on the instance (another patch)"
    raw = inspect.unwrap(_original(modules[0]))
    if "apply_rotary_pos_emb" not in getattr(getattr(raw, "__code__", None), "co_names", ()):
        return f"{spec.attention}.forward does not call apply_rotary_pos_emb (a different transformers version)"
    forward = _rebind_rope(modules[0], _make_rope(current))
    forward.__tritonformer_rope__ = True
    return description, _bind_forwards(modules, forward)


def _plan_attention(model, spec: _ModelSpec, modeling) -> Any:
    try:
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
        from transformers.modeling_utils import AttentionInterface  # noqa: F401
    except ImportError as error:
        return f"this transformers has no attention-function registry ({error})"
    if not hasattr(model, "set_attn_implementation"):
        return "this transformers cannot change the attention implementation of an instantiated model"
    can_set = getattr(type(model), "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        return f"{type(model).__name__} does not dispatch its attention through ALL_ATTENTION_FUNCTIONS"
    previous = model.config._attn_implementation
    description = (
        f"config._attn_implementation {previous!r} -> {ATTENTION_NAME!r} (fused_attention; sdpa where it cannot)"
    )
    if previous == ATTENTION_NAME:
        return f"config._attn_implementation is {ATTENTION_NAME!r} (already patched)", []

    def run() -> Callable[[], None]:
        _register_attention()
        model.set_attn_implementation(ATTENTION_NAME)
        if model.config._attn_implementation != ATTENTION_NAME:
            raise RuntimeError(
                f"set_attn_implementation({ATTENTION_NAME!r}) left {model.config._attn_implementation!r}"
            )
        return lambda: model.set_attn_implementation(previous)

    return description, [run]


def _causal_lm_blocker(model, spec: _ModelSpec, modeling) -> Optional[str]:
    cls = getattr(modeling, spec.causal_lm, None)
    if cls is None or not isinstance(model, cls):
        return f"{type(model).__name__} is not a {spec.causal_lm} (no language-model loss)"
    return None


def _plan_cross_entropy(model, spec: _ModelSpec, modeling) -> Any:
    blocker = _causal_lm_blocker(model, spec, modeling)
    if blocker:
        return blocker
    description = "loss_function -> fused_norm_xent.cross_entropy (ForCausalLMLoss)"
    prop = inspect.getattr_static(type(model), "loss_function", None)
    if not isinstance(prop, property) or prop.fset is None:
        return "this transformers has no settable loss_function"
    if getattr(model, "loss_type", None) not in (None, "ForCausalLM"):
        return f"loss_type {model.loss_type!r} is not ForCausalLM"
    own = vars(model).get("_loss_function", _MISSING)
    if own is causal_lm_loss or inspect.getattr_static(type(model), "_loss_function", None) is not None:
        return description + (" (already patched)" if own is causal_lm_loss else " (patched at class level)"), []
    if own is not _MISSING:
        return "the model already has its own loss_function"

    def run() -> Callable[[], None]:
        model.loss_function = causal_lm_loss

        def undo() -> None:
            del model._loss_function

        return undo

    return description, [run]


def _plan_fused_linear_cross_entropy(model, spec: _ModelSpec, modeling) -> Any:
    blocker = _causal_lm_blocker(model, spec, modeling)
    if blocker:
        return blocker
    description = "forward(labels=...) in training -> fused_norm_xent.linear_cross_entropy, logits=None"
    own = vars(model).get("forward", _MISSING)
    if own is not _MISSING:
        if hasattr(getattr(own, "__func__", None), "__tritonformer_original__"):
            return description + " (already patched)", []
        return "the model already has a forward set on the instance (another patch)"
    class_forward = type(model).forward
    if hasattr(class_forward, "__tritonformer_original__"):
        return description + " (patched at class level)", []
    reason = _fused_forward_blocker(model, class_forward, spec, modeling)
    if reason:
        return reason
    forward = _make_causal_lm_forward(class_forward, getattr(modeling, spec.output))
    return description, [_set_attribute(model, "forward", types.MethodType(forward, model))]


def _fused_forward_blocker(model, forward: Callable, spec: _ModelSpec, modeling) -> Optional[str]:
    parameters = inspect.signature(forward).parameters
    if "labels" not in parameters or "logits_to_keep" not in parameters:
        return f"{spec.causal_lm}.forward takes no labels / logits_to_keep (a different transformers version)"
    if not dataclasses.is_dataclass(getattr(modeling, spec.output, None)):
        return f"{spec.module} has no {spec.output}"
    if model is not None:
        if type(model.get_output_embeddings()) is not torch.nn.Linear:
            return "the output embedding (lm_head) is not a torch.nn.Linear"
        if not isinstance(getattr(model, model.base_model_prefix, None), torch.nn.Module):
            return f"the model has no base model at {model.base_model_prefix!r}"
    return None


_INSTANCE_PLANNERS = {
    "rms_norm": _plan_rms_norm,
    "layer_norm": _plan_layer_norm,
    "rope": _plan_rope,
    "swiglu": _plan_swiglu,
    "attention": _plan_attention,
    "cross_entropy": _plan_cross_entropy,
    "fused_linear_cross_entropy": _plan_fused_linear_cross_entropy,
}


def _applicable(spec: _ModelSpec, switch: str) -> bool:
    """Whether the model type has the part a switch replaces (GPT-2: no RMSNorm, rotary embedding, SwiGLU)."""
    parts = {"rms_norm": spec.rms_norm, "layer_norm": spec.layer_norm, "rope": spec.rope, "swiglu": spec.mlp}
    return bool(parts.get(switch, True))


def _spec_of(model: Any) -> _ModelSpec:
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or config is None:
        raise TypeError(f"model must be an instantiated transformers PreTrainedModel, got {type(model).__name__}")
    model_type = getattr(config, "model_type", None)
    if model_type not in SPECS:
        raise ValueError(
            f"model type {model_type!r} ({type(model).__name__}) is not supported by tritonformer.hf; "
            f"supported: {', '.join(sorted(SPECS))}"
        )
    return SPECS[model_type]


def _modeling(spec: _ModelSpec):
    try:
        return importlib.import_module(spec.module)
    except ImportError as error:
        raise ValueError(f"transformers cannot import {spec.module} here: {error}") from error


def _run(report: PatchReport, plans: Dict[str, Any]) -> List[Callable[[], None]]:
    """Records every plan in the report, then runs the steps of those that go ahead."""
    steps: List[Step] = []
    for name, plan in plans.items():
        if isinstance(plan, str):
            report.skipped[name] = plan
        else:
            report.patched[name], more = plan
            steps += more
    return [step() for step in steps]


def apply(
    model: Any,
    *,
    rms_norm: bool = True,
    rope: bool = True,
    swiglu: bool = True,
    attention: bool = True,
    cross_entropy: bool = True,
    fused_linear_cross_entropy: bool = True,
    layer_norm: bool = True,
) -> PatchReport:
    """Patches an instantiated transformers model in place with the Tritonformer kernels.

    model: a Llama / Mistral / Qwen2 / Gemma / GPT-2 model of transformers (the CausalLM or the bare
        model); any other model type raises ValueError naming it.
    Switches (see the module docstring): rms_norm, rope, swiglu, attention, cross_entropy,
    fused_linear_cross_entropy, and layer_norm (GPT-2's LayerNorms).

    Each switch's preconditions are checked on the model before anything changes; a switch the
    model or the installed transformers cannot take is left alone and reported with the reason.
    Only this model changes (rope rebinds its attention modules' forward, not the modeling module).
    Returns a PatchReport; `revert(model)` undoes the patches.
    """
    spec = _spec_of(model)
    modeling = _modeling(spec)
    wanted = dict(
        rms_norm=rms_norm, layer_norm=layer_norm, rope=rope, swiglu=swiglu, attention=attention,
        cross_entropy=cross_entropy, fused_linear_cross_entropy=fused_linear_cross_entropy,
    )  # fmt: skip
    for name, value in wanted.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    plans = {
        name: _INSTANCE_PLANNERS[name](model, spec, modeling)
        for name, on in wanted.items()
        if on and _applicable(spec, name)
    }
    report = PatchReport(spec.model_type)
    undo = _run(report, plans)
    vars(model).setdefault("_tritonformer_undo", []).extend(undo)
    return report


# ---------------------------------------------------------------------------------------------
# Patching the classes before instantiation.

# (owner, attribute) in the order they were patched, for revert().
_CLASS_PATCH_ORDER: List[Tuple[Any, str]] = []


def _set_class_attribute(owner: Any, name: str, value: Any) -> Step:
    def run() -> Callable[[], None]:
        _CLASS_ORIGINALS[(owner, name)] = vars(owner).get(name, _MISSING)
        _CLASS_PATCH_ORDER.append((owner, name))
        setattr(owner, name, value)
        return lambda: None

    return run


def _class_patched(owner: Any, name: str) -> bool:
    return (owner, name) in _CLASS_ORIGINALS


def _class_swap(owner: Optional[type], name: str, value: Any, description: str, what: str) -> Any:
    if owner is None or not callable(getattr(owner, name, None)):
        return f"{what} has no {name} in this transformers"
    if _class_patched(owner, name):
        return description + " (already patched)", []
    return description, [_set_class_attribute(owner, name, value)]


def _class_plan_rms_norm(spec: _ModelSpec, modeling) -> Any:
    if spec.rms_norm is None:
        return f"{spec.model_type} has no RMSNorm (its LayerNorms: layer_norm)"
    forward = _offset_rms_norm_forward if spec.rms_offset else _rms_norm_forward
    description = f"{spec.rms_norm}.forward -> fused_norm_xent.rms_norm"
    return _class_swap(getattr(modeling, spec.rms_norm, None), "forward", forward, description, spec.rms_norm)


def _class_plan_layer_norm(spec: _ModelSpec, modeling) -> Any:
    if not spec.layer_norm:
        return f"{spec.model_type} has no LayerNorm (its RMSNorms: rms_norm)"
    owner = getattr(modeling, spec.pretrained, None)
    if owner is None or not callable(getattr(owner, "post_init", None)):
        return f"{spec.pretrained} has no post_init in this transformers"
    original = owner.post_init

    @functools.wraps(original)
    def post_init(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        # GPT-2's norms are torch.nn.LayerNorm, shared with all of torch: patched per instance.
        for module in self.modules():
            if type(module) is torch.nn.LayerNorm and "forward" not in vars(module):
                module.forward = types.MethodType(_layer_norm_forward, module)
        return result

    return _class_swap(
        owner, "post_init", post_init, f"the torch.nn.LayerNorm of every new {spec.model_type} model -> "
        "fused_norm_xent.layer_norm", spec.pretrained,
    )  # fmt: skip


def _class_plan_swiglu(spec: _ModelSpec, modeling) -> Any:
    if spec.mlp is None:
        return f"{spec.model_type}'s MLP is not gated (no SwiGLU)"
    return _class_swap(
        getattr(modeling, spec.mlp, None), "forward", _swiglu_mlp_forward,
        f"{spec.mlp}.forward -> fused_swiglu.swiglu_mlp (when the activation is SiLU)", spec.mlp,
    )  # fmt: skip


def _class_plan_rope(spec: _ModelSpec, modeling) -> Any:
    if not spec.rope:
        return f"{spec.model_type} has no rotary embedding"
    current = getattr(modeling, "apply_rotary_pos_emb", None)
    if not callable(current):
        return f"{spec.module} has no apply_rotary_pos_emb"
    description = f"{spec.module}.apply_rotary_pos_emb -> fused_rope.apply_rotary_qk"
    if _class_patched(modeling, "apply_rotary_pos_emb"):
        return description + " (already patched)", []
    return description, [_set_class_attribute(modeling, "apply_rotary_pos_emb", _make_rope(current))]


def _class_plan_attention(spec: _ModelSpec, modeling) -> Any:
    owner = getattr(modeling, spec.pretrained, None)
    try:
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
        from transformers.modeling_utils import AttentionInterface  # noqa: F401
    except ImportError as error:
        return f"this transformers has no attention-function registry ({error})"
    if owner is None or not callable(getattr(owner, "get_correct_attn_implementation", None)):
        return f"{spec.pretrained} has no get_correct_attn_implementation in this transformers"
    can_set = getattr(owner, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        return f"{spec.pretrained} does not dispatch its attention through ALL_ATTENTION_FUNCTIONS"
    original = owner.get_correct_attn_implementation

    @functools.wraps(original)
    def get_correct_attn_implementation(self, requested_attention, *args, **kwargs):
        # Only the default changes: an explicit attn_implementation (sdpa, eager, ...) is kept.
        requested = ATTENTION_NAME if requested_attention is None else requested_attention
        return original(self, requested, *args, **kwargs)

    description = f"new {spec.model_type} models default to attn_implementation={ATTENTION_NAME!r}"
    plan = _class_swap(owner, "get_correct_attn_implementation", get_correct_attn_implementation, description, "")
    if isinstance(plan, tuple) and plan[1]:
        plan[1].insert(0, lambda: (_register_attention(), lambda: None)[1])
    return plan


def _class_plan_cross_entropy(spec: _ModelSpec, modeling) -> Any:
    owner = getattr(modeling, spec.causal_lm, None)
    prop = inspect.getattr_static(owner, "loss_function", None) if owner is not None else None
    if not isinstance(prop, property):
        return "this transformers has no loss_function property"
    description = f"{spec.causal_lm}.loss_function -> fused_norm_xent.cross_entropy (ForCausalLMLoss)"
    if _class_patched(owner, "_loss_function"):
        return description + " (already patched)", []
    # PreTrainedModel.loss_function returns self._loss_function where there is one.
    return description, [_set_class_attribute(owner, "_loss_function", staticmethod(causal_lm_loss))]


def _class_plan_fused_linear_cross_entropy(spec: _ModelSpec, modeling) -> Any:
    owner = getattr(modeling, spec.causal_lm, None)
    if owner is None:
        return f"{spec.module} has no {spec.causal_lm}"
    description = (
        f"{spec.causal_lm}.forward(labels=...) in training -> fused_norm_xent.linear_cross_entropy, logits=None"
    )
    if _class_patched(owner, "forward"):
        return description + " (already patched)", []
    reason = _fused_forward_blocker(None, owner.forward, spec, modeling)
    if reason:
        return reason
    forward = _make_causal_lm_forward(owner.forward, getattr(modeling, spec.output))
    return description, [_set_class_attribute(owner, "forward", forward)]


_CLASS_PLANNERS = {
    "rms_norm": _class_plan_rms_norm,
    "layer_norm": _class_plan_layer_norm,
    "rope": _class_plan_rope,
    "swiglu": _class_plan_swiglu,
    "attention": _class_plan_attention,
    "cross_entropy": _class_plan_cross_entropy,
    "fused_linear_cross_entropy": _class_plan_fused_linear_cross_entropy,
}


def _apply_to_classes(model_type: str, switches: Dict[str, bool]) -> PatchReport:
    spec = SPECS[model_type]
    modeling = _modeling(spec)
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    plans = {name: _CLASS_PLANNERS[name](spec, modeling) for name, on in switches.items() if on}
    report = PatchReport(model_type)
    _run(report, plans)
    return report


def _class_patcher(model_type: str) -> Callable[..., PatchReport]:
    def apply_to_model(
        *,
        rms_norm: bool = True,
        rope: bool = True,
        swiglu: bool = True,
        attention: bool = True,
        cross_entropy: bool = True,
        fused_linear_cross_entropy: bool = True,
        layer_norm: bool = True,
    ) -> PatchReport:
        switches = dict(
            rms_norm=rms_norm, layer_norm=layer_norm, rope=rope, swiglu=swiglu, attention=attention,
            cross_entropy=cross_entropy, fused_linear_cross_entropy=fused_linear_cross_entropy,
        )  # fmt: skip
        spec = SPECS[model_type]
        return _apply_to_classes(model_type, {name: on for name, on in switches.items() if _applicable(spec, name)})

    apply_to_model.__name__ = apply_to_model.__qualname__ = f"apply_to_{model_type}"
    apply_to_model.__doc__ = (
        f"Patches transformers' {model_type} classes with the Tritonformer kernels: models instantiated "
        "afterwards use them (an explicit attn_implementation is kept). Switches as apply(); returns a "
        "PatchReport. rope replaces the modeling module's apply_rotary_pos_emb, for every model of the type. "
        "revert() undoes the class patches."
    )
    return apply_to_model


apply_to_llama = _class_patcher("llama")
apply_to_mistral = _class_patcher("mistral")
apply_to_qwen2 = _class_patcher("qwen2")
apply_to_gemma = _class_patcher("gemma")
apply_to_gpt2 = _class_patcher("gpt2")


def revert(model: Optional[Any] = None) -> None:
    """Undoes apply(model)'s patches of `model`; without a model, every apply_to_<type> class patch."""
    if model is not None:
        undo = vars(model).pop("_tritonformer_undo", [])
        for step in reversed(undo):
            step()
        return
    while _CLASS_PATCH_ORDER:
        owner, name = _CLASS_PATCH_ORDER.pop()
        original = _CLASS_ORIGINALS.pop((owner, name))
        if original is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, original)
