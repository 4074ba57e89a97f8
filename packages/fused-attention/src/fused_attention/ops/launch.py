"""Launchers of the attention kernels: allocate outputs, read strides, pick configs, launch.

Inputs are already validated (see `attention.py`). Tensors are addressed through their strides
as (batch, position, head, dim) with a unit-stride head dim; a packed varlen batch is a
(total, heads, dim) tensor plus cu_seqlens. Nothing here copies an input.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import triton

from .._compat import HAS_TENSOR_DESCRIPTOR, INTERPRETING, UPCAST_DOTS, TensorDescriptor, device_capability
from ..kernels.attention_bwd import _attn_bwd_preprocess_kernel
from .configs import KERNELS, PREPROCESS_WARPS, KernelConfig, autotuned_kernel, preprocess_block_m


@dataclass(frozen=True)
class AttentionSpec:
    """Everything about one attention call except the tensors' data.

    Dense: tensors are (B, S, H, D) (`bhsd=False`) or (B, H, S, D) (`bhsd=True`). Varlen
    (`varlen=True`): (total, H, D) with cu_seqlens; max_seqlen_* bound every sequence.
    window_left/right: -1 for no bound; causal is window_right = 0.
    """

    batch: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    max_seqlen_q: int
    max_seqlen_k: int
    softmax_scale: float
    window_left: int
    window_right: int
    has_alibi: bool
    varlen: bool
    bhsd: bool

    def to_op_args(self) -> Tuple[List[int], float]:
        """The fields as (ints, softmax_scale): what a torch custom op can take."""
        ints = [getattr(self, name) for name in _INT_FIELDS]
        return [int(x) if isinstance(x, bool) else x for x in ints], self.softmax_scale

    @classmethod
    def from_op_args(cls, ints: List[int], softmax_scale: float) -> AttentionSpec:
        fields = dict(zip(_INT_FIELDS, ints), softmax_scale=softmax_scale)
        for name in ("has_alibi", "varlen", "bhsd"):
            fields[name] = bool(fields[name])
        return cls(**fields)

    @property
    def block_d(self) -> int:
        return triton.next_power_of_2(self.head_dim)

    @property
    def alibi_mode(self) -> int:
        """0: none; 1: causal (only keys at or left of the diagonal), a per-key bias vector; 2: bias tiles."""
        if not self.has_alibi:
            return 0
        return 1 if self.window_right == 0 else 2

    def meta(self) -> dict:
        """The constexprs every main kernel shares (the block shape comes from a KernelConfig)."""
        return {
            "HEAD_DIM": self.head_dim,
            "BLOCK_D": self.block_d,
            "IS_VARLEN": self.varlen,
            "HAS_LEFT": self.window_left >= 0,
            "HAS_RIGHT": self.window_right >= 0,
            "ALIBI": self.alibi_mode,
            "UPCAST": UPCAST_DOTS,
        }


_INT_FIELDS = tuple(name for name in AttentionSpec.__dataclass_fields__ if name != "softmax_scale")


def seq_strides(t: torch.Tensor, spec: AttentionSpec) -> Tuple[int, int, int]:
    """(batch, position, head) strides of q/k/v/o or their gradients."""
    if spec.varlen:
        return 0, t.stride(0), t.stride(1)
    if spec.bhsd:
        return t.stride(0), t.stride(2), t.stride(1)
    return t.stride(0), t.stride(1), t.stride(2)


def lse_shape(spec: AttentionSpec, total_q: int) -> Tuple[int, ...]:
    """(B, H, S_q), or (H, total_q) for varlen, as FlashAttention-2's softmax_lse."""
    if spec.varlen:
        return (spec.n_heads, total_q)
    return (spec.batch, spec.n_heads, spec.max_seqlen_q)


def _lse_strides(lse: torch.Tensor, spec: AttentionSpec) -> Tuple[int, int]:
    if spec.varlen:
        return 0, lse.stride(0)
    return lse.stride(0), lse.stride(1)


@functools.cache
def _placeholder_int32(device: torch.device) -> torch.Tensor:
    """Stands in for absent cu_seqlens (never read: IS_VARLEN is a constexpr)."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def _slope_strides(alibi_slopes: Optional[torch.Tensor]) -> Tuple[int, int]:
    if alibi_slopes is None:
        return 0, 0
    if alibi_slopes.dim() == 1:
        return 0, alibi_slopes.stride(0)
    return alibi_slopes.stride(0), alibi_slopes.stride(1)


def _descriptor_view(t: torch.Tensor, spec: AttentionSpec) -> Optional[Tuple[List[int], List[int], bool]]:
    """t as a 4-D TMA view (shape, strides, heads_outer), or None when TMA cannot address it.

    The dims follow the memory order, strides non-increasing: (batch, position, head, dim), or
    (batch, head, position, dim) when the head stride is the larger (the SDPA layout). A packed
    varlen batch is batch 1. Size-1 dims get the stride a packed tensor would have (any stride
    addresses them). TMA needs a non-empty tensor, a 16-byte aligned base and 16-byte multiples.
    """
    if t.numel() == 0 or t.data_ptr() % 16:
        return None
    stride_b, stride_s, stride_h = seq_strides(t, spec)
    if spec.varlen:
        batch, positions, heads = 1, t.shape[0], t.shape[1]
    elif spec.bhsd:
        batch, heads, positions = t.shape[0], t.shape[1], t.shape[2]
    else:
        batch, positions, heads = t.shape[0], t.shape[1], t.shape[2]
    heads_outer = stride_h > stride_s
    dims = [[batch, stride_b], [heads, stride_h], [positions, stride_s]]
    if not heads_outer:
        dims[1], dims[2] = dims[2], dims[1]
    inner_extent = t.shape[-1]  # the unit-stride head dim
    for dim in reversed(dims):
        if dim[0] == 1:
            dim[1] = inner_extent
        inner_extent = dim[0] * dim[1]
    strides = [stride for _, stride in dims]
    size = t.element_size()
    if any(stride * size % 16 for stride in strides) or strides != sorted(strides, reverse=True) or strides[-1] < 1:
        return None
    return [n for n, _ in dims] + [t.shape[-1]], strides + [1], heads_outer


def _tma_layout(spec: AttentionSpec, tiled: Tuple[torch.Tensor, torch.Tensor]) -> Optional[bool]:
    """heads_outer shared by the two streamed tensors' TMA views, or None when they cannot both be
    described with the same dim order."""
    views = [_descriptor_view(t, spec) for t in tiled]
    if any(view is None for view in views) or views[0][2] != views[1][2]:
        return None
    return views[0][2]


def _tma_by_default(device: torch.device) -> bool:
    """The autotuned path loads through TMA on Hopper and newer with Triton >= 3.4."""
    return HAS_TENSOR_DESCRIPTOR and not INTERPRETING and device_capability(device.index or 0)[0] >= 9


def _descriptor(t: torch.Tensor, spec: AttentionSpec, block_rows: int) -> TensorDescriptor:
    shape, strides, heads_outer = _descriptor_view(t, spec)
    block = [1, 1, block_rows, spec.block_d] if heads_outer else [1, block_rows, 1, spec.block_d]
    return TensorDescriptor(t, shape, strides, block)


# Position of the two descriptor arguments in each kernel's argument list.
DESCRIPTOR_POSITION = {"fwd": 8, "dkdv": 11, "dq": 10}


def _launch(kind: str, spec: AttentionSpec, config: Optional[KernelConfig], n_rows: int, n_row_groups: int,
            args: tuple, tiled: Tuple[torch.Tensor, torch.Tensor]) -> None:  # fmt: skip
    """Launch `kind` with a fixed config, or through its autotuner when config is None.

    n_rows positions (split in blocks) x n_row_groups (batch x heads) programs. `tiled` are the two
    tensors its inner loop streams (K, V; or Q, dO for dK/dV): with TMA the kernel gets descriptors
    over them, else the same tensors as plain pointers, which it ignores.
    """
    if config is None:
        heads_outer = _tma_layout(spec, tiled) if _tma_by_default(tiled[0].device) else None
    elif config.use_tma:
        heads_outer = _tma_layout(spec, tiled)
        if heads_outer is None:
            raise ValueError(f"{config} asks for TMA, but these tensors cannot be described by TMA descriptors")
    else:
        heads_outer = None
    tma = heads_outer is not None
    if tma:
        # The rows a descriptor block spans; the autotuner's pre-hook sets it for each config.
        rows = 16 if config is None else config.meta()["BLOCK_M" if kind == "dkdv" else "BLOCK_N"]
        tiled = tuple(_descriptor(t, spec, rows) for t in tiled)
    split = DESCRIPTOR_POSITION[kind]
    args = (*args[:split], *tiled, *args[split:])
    meta = dict(spec.meta(), HEADS_OUTER=bool(heads_outer))
    row_block = "BLOCK_N" if kind == "dkdv" else "BLOCK_M"
    if config is None:

        def grid(launch_meta):
            return (triton.cdiv(n_rows, launch_meta[row_block]) * n_row_groups,)

        autotuned_kernel(kind, spec.block_d, tma)[grid](*args, **meta)
    else:
        grid = (triton.cdiv(n_rows, config.meta()[row_block]) * n_row_groups,)
        KERNELS[kind][grid](*args, **meta, **config.meta(), num_warps=config.num_warps, num_stages=config.num_stages)


def attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alibi_slopes: Optional[torch.Tensor],
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    spec: AttentionSpec,
    config: Optional[KernelConfig] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE): O like q (contiguous in the call's layout), LSE fp32 natural-log."""
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape(spec, q.shape[0]), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    placeholder = _placeholder_int32(q.device)
    args = (
        q, k, v, o, lse, lse if alibi_slopes is None else alibi_slopes,
        placeholder if cu_seqlens_q is None else cu_seqlens_q, placeholder if cu_seqlens_k is None else cu_seqlens_k,
        *seq_strides(q, spec), *seq_strides(k, spec), *seq_strides(v, spec), *seq_strides(o, spec),
        *_lse_strides(lse, spec), *_slope_strides(alibi_slopes),
        spec.n_heads, spec.n_heads // spec.n_kv_heads, spec.max_seqlen_q, spec.max_seqlen_k, spec.softmax_scale,
        spec.window_left, spec.window_right,
    )  # fmt: skip
    _launch("fwd", spec, config, spec.max_seqlen_q, spec.batch * spec.n_heads, args, (k, v))
    return o, lse


def attention_bwd(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    dlse: Optional[torch.Tensor],
    alibi_slopes: Optional[torch.Tensor],
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    spec: AttentionSpec,
    dkdv_config: Optional[KernelConfig] = None,
    dq_config: Optional[KernelConfig] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) in the inputs' dtypes, contiguous in the call's layout."""
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if dq.numel() == 0 and dk.numel() == 0:
        return dq, dk, dv
    delta = torch.empty_like(lse)
    placeholder = _placeholder_int32(q.device)
    cu_q = placeholder if cu_seqlens_q is None else cu_seqlens_q
    cu_k = placeholder if cu_seqlens_k is None else cu_seqlens_k
    slopes = lse if alibi_slopes is None else alibi_slopes
    # Both main kernels end their arguments with: lse strides, slope strides, heads, group, sizes, options.
    group = spec.n_heads // spec.n_kv_heads
    options = (spec.max_seqlen_q, spec.max_seqlen_k, spec.softmax_scale, spec.window_left, spec.window_right)
    lse_and_slope_strides = (*_lse_strides(lse, spec), *_slope_strides(alibi_slopes))

    if dq.numel():
        if dlse is None:
            dlse_strides = (0, 0, 0)
        elif spec.varlen:
            dlse_strides = (0, dlse.stride(0), dlse.stride(1))
        else:
            dlse_strides = dlse.stride()
        block_m = preprocess_block_m(spec.block_d)
        grid = (triton.cdiv(spec.max_seqlen_q, block_m) * spec.batch * spec.n_heads,)
        _attn_bwd_preprocess_kernel[grid](
            o, do, lse if dlse is None else dlse, delta, cu_q,
            *seq_strides(o, spec), *seq_strides(do, spec), *dlse_strides, *_lse_strides(lse, spec),
            spec.n_heads, spec.max_seqlen_q,
            HEAD_DIM=spec.head_dim, BLOCK_D=spec.block_d, BLOCK_M=block_m, IS_VARLEN=spec.varlen,
            HAS_DLSE=dlse is not None, num_warps=PREPROCESS_WARPS,
        )  # fmt: skip

    if dk.numel():
        args = (
            q, k, v, do, dk, dv, lse, delta, slopes, cu_q, cu_k,
            *seq_strides(q, spec), *seq_strides(k, spec), *seq_strides(v, spec), *seq_strides(do, spec),
            *seq_strides(dk, spec), *seq_strides(dv, spec), *lse_and_slope_strides, spec.n_kv_heads, group, *options,
        )  # fmt: skip
        _launch("dkdv", spec, dkdv_config, spec.max_seqlen_k, spec.batch * spec.n_kv_heads, args, (q, do))
    if dq.numel():
        args = (
            q, k, v, do, dq, lse, delta, slopes, cu_q, cu_k,
            *seq_strides(q, spec), *seq_strides(k, spec), *seq_strides(v, spec), *seq_strides(do, spec),
            *seq_strides(dq, spec), *lse_and_slope_strides, spec.n_heads, group, *options,
        )  # fmt: skip
        _launch("dq", spec, dq_config, spec.max_seqlen_q, spec.batch * spec.n_heads, args, (k, v))
    return dq, dk, dv
