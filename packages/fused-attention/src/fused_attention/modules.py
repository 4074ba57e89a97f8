"""nn.Module wrappers: the parameter-free FlashAttention and a multi-head self-attention block."""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import nn

from ._validation import (
    check_bool,
    check_dropout_p,
    check_head_dim,
    check_int,
    check_layout,
    check_softcap,
    check_softmax_scale,
    check_window,
)
from .alibi import alibi_slopes
from .ops.attention import flash_attention


class FlashAttention(nn.Module):
    """flash_attention(q, k, v, ...) with the options fixed at construction; no parameters.

    forward(q, k, v, alibi_slopes=None) takes and returns tensors in `layout`. dropout: the
    attention-weight dropout probability, applied in training mode only (its mask's key drawn
    from torch's generator on each call).
    """

    def __init__(self, causal: bool = False, softmax_scale: Optional[float] = None, window_size=(-1, -1),
                 layout: str = "bshd", deterministic: bool = False, softcap: float = 0.0,
                 dropout: float = 0.0):  # fmt: skip
        super().__init__()
        self.dropout = check_dropout_p(dropout)
        check_layout(layout)
        check_window(window_size, causal, 2**31, 2**31)
        # The head dim only sets the default scale; a softcap is checked again against the call's scale.
        check_softcap(softcap, check_softmax_scale(softmax_scale, 64))
        self.softcap = softcap
        self.causal = causal
        self.softmax_scale = softmax_scale
        self.window_size = tuple(window_size)
        self.layout = layout
        self.deterministic = check_bool("deterministic", deterministic)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alibi_slopes: Optional[torch.Tensor] = None):
        return flash_attention(
            q, k, v, causal=self.causal, softmax_scale=self.softmax_scale, alibi_slopes=alibi_slopes,
            window_size=self.window_size, layout=self.layout, deterministic=self.deterministic, softcap=self.softcap,
            dropout_p=self.dropout if self.training else 0.0,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, softmax_scale={self.softmax_scale}, window_size={self.window_size}, "
            f"layout={self.layout!r}, deterministic={self.deterministic}, softcap={self.softcap}, "
            f"dropout={self.dropout}"
        )


class MultiheadSelfAttention(nn.Module):
    """Multi-head self-attention on (B, S, d_model) with GQA/MQA, ALiBi and sliding windows.

    Parameters (nn.Linear modules, so state dicts load like any Linear):
      q_proj: d_model -> n_head * head_dim;  k_proj, v_proj: d_model -> n_kv_head * head_dim;
      out_proj: n_head * head_dim -> d_model;  head_dim = d_model // n_head.
    Buffer (not saved): alibi_slopes, fp32 (n_head,), when alibi=True. deterministic, softcap: as
    flash_attention's (bit-reproducible dQ in the backward, slower; Gemma-2's capped scores).
    dropout: on the attention weights, in training mode only.

    forward(x, qk_transform=None): x (B, S, d_model) -> (B, S, d_model). qk_transform, if given,
    maps (q, k) in (B, S, heads, head_dim) to new (q, k) before attention, e.g. rotary embeddings.
    Under torch.autocast the projections run in the autocast dtype and so does attention; without
    autocast the activations must be fp16 or bf16 (the attention kernels reject fp32).
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        n_kv_head: Optional[int] = None,
        bias: bool = False,
        causal: bool = True,
        alibi: bool = False,
        window_size: Tuple[int, int] = (-1, -1),
        softmax_scale: Optional[float] = None,
        deterministic: bool = False,
        softcap: float = 0.0,
        dropout: float = 0.0,
        device=None,
        dtype=None,
    ):
        super().__init__()
        check_int("d_model", d_model, 1)
        check_int("n_head", n_head, 1)
        n_kv_head = n_head if n_kv_head is None else check_int("n_kv_head", n_kv_head, 1)
        if d_model % n_head:
            raise ValueError(f"d_model={d_model} must be a multiple of n_head={n_head}")
        if n_head % n_kv_head:
            raise ValueError(f"n_head={n_head} must be a multiple of n_kv_head={n_kv_head}")
        check_head_dim(d_model // n_head)
        check_window(window_size, causal, 2**31, 2**31)
        self.softcap = check_softcap(softcap, check_softmax_scale(softmax_scale, d_model // n_head))
        self.dropout = check_dropout_p(dropout)
        self.d_model, self.n_head, self.n_kv_head = d_model, n_head, n_kv_head
        self.head_dim = d_model // n_head
        self.causal, self.window_size, self.softmax_scale = causal, tuple(window_size), softmax_scale
        self.deterministic = check_bool("deterministic", deterministic)
        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(d_model, n_head * self.head_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(d_model, n_kv_head * self.head_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(d_model, n_kv_head * self.head_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(n_head * self.head_dim, d_model, bias=bias, **factory)
        if alibi:
            self.register_buffer("alibi_slopes", alibi_slopes(n_head, device=device), persistent=False)
        else:
            self.alibi_slopes = None

    def forward(self, x: torch.Tensor, qk_transform: Optional[Callable] = None) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[2] != self.d_model:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"x must be a (B, S, d_model={self.d_model}) tensor, got {shape}")
        batch, seqlen, _ = x.shape
        q = self.q_proj(x).view(batch, seqlen, self.n_head, self.head_dim)  # (B, S, H, D)
        k = self.k_proj(x).view(batch, seqlen, self.n_kv_head, self.head_dim)  # (B, S, H_kv, D)
        v = self.v_proj(x).view(batch, seqlen, self.n_kv_head, self.head_dim)
        if qk_transform is not None:
            q, k = qk_transform(q, k)
        # module.to(dtype) casts buffers too: the slopes go back to fp32 (a no-op when they are).
        slopes = None if self.alibi_slopes is None else self.alibi_slopes.float()
        out = flash_attention(
            q, k, v, causal=self.causal, softmax_scale=self.softmax_scale, alibi_slopes=slopes,
            window_size=self.window_size, deterministic=self.deterministic, softcap=self.softcap,
            dropout_p=self.dropout if self.training else 0.0,
        )  # fmt: skip
        return self.out_proj(out.reshape(batch, seqlen, self.n_head * self.head_dim))  # (B, S, d_model)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_head={self.n_head}, n_kv_head={self.n_kv_head}, causal={self.causal}, "
            f"alibi={self.alibi_slopes is not None}, window_size={self.window_size}, dropout={self.dropout}"
        )
