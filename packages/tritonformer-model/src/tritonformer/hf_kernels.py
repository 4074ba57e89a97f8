"""The code that the switches of tritonformer.hf.apply put into transformers models.

Each function keeps the contract of what it replaces: the forward of an RMSNorm, LayerNorm or gated
MLP module (bound to the module), apply_rotary_pos_emb, an entry of the attention-function and
attention-mask registries (tritonformer_attention_forward, tritonformer_mask), the causal-LM loss
(causal_lm_loss, linear_causal_lm_loss) and the CausalLM forward. Each checks its inputs on every
call and runs the original code where a kernel cannot (a CPU tensor without TRITON_INTERPRET=1,
float64, a head dim outside the attention kernels' set, ...).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import sys
import types
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from ._compat import autocast_dtype, is_compiling

ATTENTION_NAME = "tritonformer"

# fused_attention.flash_attention's head dims (its documented set).
_ATTENTION_HEAD_DIMS = frozenset((16, 32, 64, 80, 96, 128, 160, 192, 256))
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_HALF_DTYPES = (torch.float16, torch.bfloat16)
# Attention features that some models pass to their attention function and the kernels lack: sdpa
# ignores sinks silently, so those raise; position biases go to sdpa (which raises or applies them).
_SINK_KWARGS = ("s_aux", "sinks")
_SDPA_ONLY_KWARGS = ("position_bias",)


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
CLASS_ORIGINALS: Dict[Tuple[Any, str], Any] = {}
MISSING = object()


def original_method(module: torch.nn.Module, name: str = "forward") -> Callable:
    """The unpatched `name` of module's class (a class-level patch keeps the original aside)."""
    for klass in type(module).__mro__:
        saved = CLASS_ORIGINALS.get((klass, name), MISSING)
        if saved is not MISSING:
            return saved
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(f"{type(module).__name__} has no {name}")


# ---------------------------------------------------------------------------------------------
# Norms, MLP, rotary embedding.

# Set by apply (and by new models after apply_to_<type>) on the norms whose output only feeds
# linear layers: the pre-attention and pre-MLP norms of each decoder layer.
FEEDS_MATMULS = "_tritonformer_feeds_matmuls"


def _matmul_dtype(norm: torch.nn.Module, x: torch.Tensor) -> Optional[torch.dtype]:
    """Autocast's half dtype for a norm that feeds only linear layers, None otherwise.

    Under autocast every consumer of such a norm casts its output to that dtype: the kernel writes
    it directly (the same value, rounded once from fp32), and the cast kernels of the forward and
    of the backward, one per consuming linear, are not run.
    """
    if not getattr(norm, FEEDS_MATMULS, False):
        return None
    dtype = autocast_dtype(x.device.type)
    return dtype if dtype in _HALF_DTYPES else None


def rms_norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm / MistralRMSNorm / Qwen2RMSNorm: weight * normalized x, in x's dtype promoted
    with the weight's (autocast's dtype for a norm that feeds linear layers, see _matmul_dtype)."""
    weight = self.weight
    if not (_on_kernel_device(hidden_states, weight) and _kernel_floats(hidden_states, weight)):
        return original_method(self)(self, hidden_states)
    from fused_norm_xent import rms_norm

    dtype = _matmul_dtype(self, hidden_states) or torch.promote_types(hidden_states.dtype, weight.dtype)
    out_dtype = dtype if dtype != hidden_states.dtype else None
    return rms_norm(hidden_states, (hidden_states.shape[-1],), weight, self.variance_epsilon, out_dtype=out_dtype)


def offset_rms_norm_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """GemmaRMSNorm: normalized x * (1 + weight), in x's dtype (autocast's, see _matmul_dtype)."""
    weight = self.weight
    if not (_on_kernel_device(x, weight) and _kernel_floats(x, weight)):
        return original_method(self)(self, x)
    from fused_norm_xent import rms_norm

    return rms_norm(x, (x.shape[-1],), weight, self.eps, offset=1.0, out_dtype=_matmul_dtype(self, x))


def layer_norm_forward(self: torch.nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    """torch.nn.LayerNorm; in fp32 under CUDA autocast, which runs layer_norm in fp32 (CPU autocast
    does not); its output in autocast's dtype for a norm that feeds linear layers (_matmul_dtype)."""
    if not (_on_kernel_device(x, self.weight, self.bias) and _kernel_floats(x, self.weight, self.bias)):
        return original_method(self)(self, x)
    from fused_norm_xent import layer_norm

    if x.dtype != torch.float32 and x.device.type == "cuda" and autocast_dtype("cuda") is not None:
        x = x.float()
    out_dtype = _matmul_dtype(self, x)
    return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, out_dtype=out_dtype)


# transformers' tanh-approximate GELU modules (gelu_pytorch_tanh, gelu_new): Gemma's GeGLU.
_GELU_TANH_MODULES = ("GELUTanh", "PytorchGELUTanh", "NewGELUActivation")


def _gate_activation(activation: Optional[torch.nn.Module]) -> Optional[str]:
    """fused_swiglu's name for a gated MLP's activation module ("silu", "gelu_tanh"), or None."""
    name = type(activation).__name__
    if isinstance(activation, torch.nn.SiLU) or name == "SiLUActivation":
        return "silu"
    if (isinstance(activation, torch.nn.GELU) and activation.approximate == "tanh") or name in _GELU_TANH_MODULES:
        return "gelu_tanh"
    return None


def swiglu_mlp_ready(mlp: torch.nn.Module) -> Optional[str]:
    """None when mlp is down(act(gate(x)) * up(x)) of plain nn.Linear layers with act SiLU or the
    tanh-approximate GELU, else why not."""
    if _gate_activation(getattr(mlp, "act_fn", None)) is None:
        return f"the activation is {type(getattr(mlp, 'act_fn', None)).__name__}, not SiLU or tanh-approximate GELU"
    layers = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if any(type(layer) is not torch.nn.Linear for layer in layers):
        return "gate_proj, up_proj and down_proj are not all torch.nn.Linear"
    if (layers[0].bias is None) != (layers[1].bias is None):
        return "gate_proj and up_proj must both have a bias or neither"
    return None


def swiglu_mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down_proj(act(gate_proj(x)) * up_proj(x)) in one fused_swiglu.swiglu_mlp call (SwiGLU, GeGLU)."""
    gate, up, down = self.gate_proj, self.up_proj, self.down_proj
    weights = (gate.weight, up.weight, down.weight)
    same_dtype = all(w.dtype == x.dtype for w in weights) or autocast_dtype(x.device.type) is not None
    if not (same_dtype and _on_kernel_device(x, *weights) and _kernel_floats(x, *weights)) or swiglu_mlp_ready(self):
        return original_method(self)(self, x)
    from fused_swiglu import swiglu_mlp

    # nn.Linear keeps (out, in) weights; swiglu_mlp takes (in, out): transposed views, no copies.
    return swiglu_mlp(
        x, gate.weight.t(), up.weight.t(), down.weight.t(), gate.bias, up.bias, down.bias,
        activation=_gate_activation(self.act_fn),
    )  # fmt: skip


def make_rope(original: Callable) -> Callable:
    """apply_rotary_pos_emb(q, k, cos, sin) through fused_rope.apply_rotary_qk, `original` where it cannot."""

    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        unsqueeze_dim = args[0] if args else kwargs.get("unsqueeze_dim", 1)
        if args[1:] or set(kwargs) - {"unsqueeze_dim"} or unsqueeze_dim != 1 or not _rope_ready(q, k, cos, sin):
            return original(q, k, cos, sin, *args, **kwargs)
        from fused_rope import apply_rotary_qk

        # q * cos + rotate_half(q) * sin has the dtype of q promoted with cos's (fp32 cos under autocast).
        # Under autocast, q and k of its dtype stay in it: every attention function casts them to it
        # (sdpa, eager's matmuls, ours), so the fp32 copies and their casts back are not needed.
        dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), cos.dtype)
        amp = autocast_dtype(q.device.type)
        if amp in _HALF_DTYPES and q.dtype == k.dtype == amp:
            dtype = amp
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


def rebind_rope(attention_module: torch.nn.Module, rope: Callable) -> Callable:
    """A copy of the attention class's forward whose `apply_rotary_pos_emb` is `rope`, for one instance
    (the function's own globals are the modeling module's, shared by every model of the type)."""
    raw = inspect.unwrap(original_method(attention_module))
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
    padding: Optional[torch.Tensor], q_len: int, k_len: int, window: Optional[int], causal: bool, device,
    explicit: bool = False,
) -> Optional[torch.Tensor]:  # fmt: skip
    """sdpa's 4-D bool mask given tritonformer_mask's output: None where sdpa takes is_causal alone (no
    padding, no window in reach, queries aligned with keys or one query), unless `explicit` (eager
    attention has no is_causal)."""
    visible = k_len if padding is None else padding.shape[-1]
    if not causal:
        return None if padding is None else F.pad(padding, (0, k_len - visible), value=False)[:, None, None, :]
    window_reaches = window is not None and k_len >= window
    if padding is None and not window_reaches and (q_len == 1 or q_len == k_len) and not explicit:
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
    """None when fused_attention computes this call exactly as sdpa would (dropout: with its own
    mask, drawn from torch's generator), else why not."""
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
    if _compute_dtype(query, key, value) is None:
        return "dtype"
    return None


def _compute_dtype(query, key, value) -> Optional[torch.dtype]:
    """The kernels' dtype: q/k/v's one half dtype, or under autocast its dtype (to which sdpa would cast
    them too: under autocast, rotated q/k are fp32 beside a bf16 v)."""
    dtypes = {query.dtype, key.dtype, value.dtype}
    amp = autocast_dtype(query.device.type)
    if amp in _HALF_DTYPES and dtypes <= {torch.float32, amp}:
        return amp
    return dtypes.pop() if len(dtypes) == 1 and dtypes <= set(_HALF_DTYPES) else None


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
    Attention dropout and logit softcapping (Gemma-2's kwargs["softcap"]) run in the kernels. sdpa
    computes what the kernels cannot (a 4-D mask, fp32 without autocast, head dims outside the
    kernel's set, position biases, a sliding window over a mask with holes).
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
        blocker = "position bias"
    if blocker is not None:
        return _fallback(module, query, key, value, attention_mask, dropout, scaling, causal, window, kwargs)
    dtype = _compute_dtype(query, key, value)
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    if attention_mask is not None:
        return _varlen_attention(module, query, key, value, attention_mask, dropout, scaling, causal, window, kwargs)
    from fused_attention import flash_attention

    # (B, H, S, D) views of (B, S, H, D) projections: transposed back, usually without a copy.
    out = flash_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=causal, softmax_scale=scaling,
        window_size=_window_size(window), layout="bshd", softcap=_softcap(kwargs), dropout_p=float(dropout),
    )  # fmt: skip
    return out, None


def _softcap(kwargs: Dict[str, Any]) -> float:
    """transformers' attention softcap (None: none) as the kernels' float (0: none)."""
    softcap = kwargs.get("softcap")
    return 0.0 if softcap is None else float(softcap)


def _window_size(window: Optional[int]) -> Tuple[int, int]:
    """transformers' sliding window W (a query sees itself and the W - 1 keys before) as (left, right)."""
    return (-1, -1) if window is None else (window - 1, 0)


def _fallback(module, query, key, value, attention_mask, dropout, scaling, causal, window, kwargs):
    """sdpa on the 4-D mask it would have been given (tritonformer_mask's 2-D masks rebuilt); with a
    softcap, which sdpa refuses, the model's own eager attention on that mask made additive."""
    eager = None
    if kwargs.get("softcap") is not None:
        eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if attention_mask is None or attention_mask.dim() == 2:
        q_len, k_len = query.shape[2], key.shape[2]
        attention_mask = _sdpa_mask_from_padding(
            attention_mask, q_len, k_len, window, causal, query.device, explicit=eager is not None
        )
    if eager is None:
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, causal, **kwargs)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        blocked = torch.finfo(query.dtype).min
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill(
            ~attention_mask, blocked
        )
    out, _ = eager(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    return out, None


class _VarlenLayout(NamedTuple):
    """Where the real tokens of a padding mask are, for every layer of one forward."""

    q_index: torch.Tensor  # (total_q,) int64: the queries' rows in (B * q_len)
    k_index: torch.Tensor  # (total_k,) int64: the keys' rows in (B * visible)
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    has_holes: bool  # padding inside a row, not only at its ends


def _true_positions(mask: torch.Tensor, count: int) -> torch.Tensor:
    """The flat positions of mask's `count` True entries, in order, without a host read (nonzero
    would read its size): a stable sort puts them first."""
    return torch.argsort((~mask.flatten()).to(torch.int8), stable=True)[:count]


def _varlen_layout(padding: torch.Tensor, q_len: int) -> _VarlenLayout:
    """The layout of a (B, visible) bool padding mask, for queries at its last q_len positions.

    transformers passes each forward's mask object to every layer: the layout is kept on it, so
    that its one host read (the launch sizes) and its index tensors happen once per forward, not
    once per layer (each read would stall the host's launches behind the GPU).
    """
    layouts = None if is_compiling() else vars(padding).setdefault("_tritonformer_varlen", {})
    if layouts and q_len in layouts:
        return layouts[q_len]
    visible = padding.shape[-1]
    queries = padding[:, visible - q_len :]
    k_lens, q_lens = padding.sum(-1, dtype=torch.int32), queries.sum(-1, dtype=torch.int32)
    # The kernel's window counts unpadded tokens, transformers' counts positions: equal without holes.
    first = torch.where(k_lens > 0, padding.int().argmax(-1), 0)
    last = visible - 1 - padding.flip(-1).int().argmax(-1)
    holes = ((last - first + 1 != k_lens) & (k_lens > 0)).any()
    read = torch.stack([k_lens.max(), q_lens.max(), holes.int(), q_lens.sum(), k_lens.sum()]).tolist()
    max_k, max_q, has_holes, total_q, total_k = read
    layout = _VarlenLayout(
        q_index=_true_positions(queries, total_q),
        k_index=_true_positions(padding, total_k),
        cu_q=F.pad(q_lens.cumsum(0, dtype=torch.int32), (1, 0)),
        cu_k=F.pad(k_lens.cumsum(0, dtype=torch.int32), (1, 0)),
        max_q=max_q,
        max_k=max_k,
        has_holes=bool(has_holes),
    )
    if layouts is not None:
        layouts[q_len] = layout
    return layout


def _varlen_attention(module, query, key, value, padding, dropout, scaling, causal, window, kwargs):
    """flash_attention_varlen over the unpadded tokens of a (B, keys up to the last query) padding mask."""
    from fused_attention import flash_attention_varlen

    padding = padding.bool()
    batch, heads, q_len, head_dim = query.shape
    visible = padding.shape[-1]
    layout = _varlen_layout(padding, q_len)
    if layout.has_holes and window is not None:
        return _fallback(module, query, key, value, padding, dropout, scaling, causal, window, kwargs)
    if layout.max_q == 0:
        return query.new_zeros(batch, q_len, heads, head_dim), None
    # (B, H, S, D) views of (B, S, H, D) projections: the (B * S, H, D) rows without a copy, usually.
    rows = lambda t, length: t.transpose(1, 2).reshape(batch * length, t.shape[1], head_dim)  # noqa: E731
    q_packed = rows(query, q_len).index_select(0, layout.q_index)
    k_packed = rows(key[:, :, :visible], visible).index_select(0, layout.k_index)
    v_packed = rows(value[:, :, :visible], visible).index_select(0, layout.k_index)
    packed = flash_attention_varlen(
        q_packed, k_packed, v_packed, layout.cu_q, layout.cu_k, max(layout.max_q, 1), max(layout.max_k, 1),
        causal=causal, softmax_scale=scaling, window_size=_window_size(window), check_seqlens=False,
        softcap=_softcap(kwargs), dropout_p=float(dropout),
    )  # fmt: skip
    out = packed.new_zeros(batch * q_len, heads, head_dim).index_copy(0, layout.q_index, packed)
    return out.view(batch, q_len, heads, head_dim), None


def register_attention() -> None:
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
    softcap: float = 0.0,
    **kwargs: Any,
) -> torch.Tensor:
    """ForCausalLMLoss of lm_head(hidden_states) with fused_norm_xent.linear_cross_entropy: no logits.
    softcap: the model's final-logit softcapping (Gemma-2), applied inside the kernel."""
    from fused_norm_xent import linear_cross_entropy

    target = _shifted_labels(labels, ignore_index, shift_labels).to(hidden_states.device)
    with _fp32_loss(hidden_states):
        return _reduce(
            lambda reduction: linear_cross_entropy(
                hidden_states, weight, target, bias, ignore_index=ignore_index, reduction=reduction, softcap=softcap
            ),
            num_items_in_batch,
        )


def make_causal_lm_forward(original: Callable, output_class: type) -> Callable:
    """The CausalLM forward with the fused linear cross-entropy in training: `original` otherwise."""
    signature = inspect.signature(original)
    parameters = list(signature.parameters.values())
    var_keyword = next((p.name for p in parameters if p.kind is p.VAR_KEYWORD), None)

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if args:  # labels may be positional: name every argument
            bound = signature.bind(self, *args, **kwargs).arguments
            bound.pop(parameters[0].name)
            kwargs = {**bound, **bound.pop(var_keyword, {})} if var_keyword else dict(bound)
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
    if kwargs.get("use_cache") is None and kwargs.get("past_key_values") is None:
        # A training step has no use for a KV cache: config.use_cache (True in most configs) would copy
        # every layer's keys and values into one and keep them alive until the output is dropped.
        kwargs["use_cache"] = False
    outputs = getattr(model, model.base_model_prefix)(**kwargs)
    hidden_states = outputs[0] if isinstance(outputs, tuple) else outputs.last_hidden_state
    head = model.get_output_embeddings()
    softcap = getattr(model.config, "final_logit_softcapping", None) or 0.0
    loss = linear_causal_lm_loss(hidden_states, head.weight, head.bias, labels, softcap=softcap, **kwargs)
    fields = {
        field.name: getattr(outputs, field.name, None)
        for field in dataclasses.fields(output_class)
        if field.name not in ("loss", "logits")
    }
    output = output_class(loss=loss, logits=None, **fields)
    return output if return_dict else output.to_tuple()
