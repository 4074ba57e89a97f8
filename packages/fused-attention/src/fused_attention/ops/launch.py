"""Launchers of the attention kernels: allocate outputs, look up the launch plan, launch.

Inputs are already validated (see `attention.py`). Tensors are addressed through their strides
as (batch, position, head, dim) with a unit-stride head dim; a packed varlen batch is a
(total, heads, dim) tensor plus cu_seqlens. Nothing here copies an input.

The host path is short because it is paid once per layer per step, and at short sequences it
can take longer than the kernels. Everything a launch needs that the call's shapes, strides,
dtype, pointer alignment and options decide is computed once and cached as a launch plan:
the config (autotuned once per plan, then never consulted again), the grid, every integer
argument, the constexprs, the TMA descriptor templates. A call then builds one key, allocates
its outputs and launches. After a plan's first launch (through Triton's JIT, which compiles)
the compiled kernel is launched directly where `_compat.direct_launch` allows it (Triton >= 3.4,
no launch hooks installed): the JIT's per-call argument binding and specialization, which the
plan key has already decided, are skipped.
"""

from __future__ import annotations

import functools
from typing import Callable, List, NamedTuple, Optional, Tuple

import torch

from .._compat import (
    HAS_TENSOR_DESCRIPTOR,
    INTERPRETING,
    UPCAST_DOTS,
    TensorDescriptor,
    current_device_index,
    descriptor_like,
    device_capability,
    direct_launcher,
    multiprocessor_count,
)
from ..kernels.attention_bwd import _attn_bwd_dq_convert_kernel, _attn_bwd_preprocess_kernel
from .configs import (
    KERNELS,
    PREPROCESS_WARPS,
    KernelConfig,
    autotuned_kernel,
    candidate_configs,
    config_of,
    dq_atomic,
    length_class,
    preprocess_block_m,
)


class AttentionSpec(NamedTuple):
    """Everything about one attention call except the tensors' data.

    Dense: tensors are (B, S, H, D) (`bhsd=False`) or (B, H, S, D) (`bhsd=True`). Varlen
    (`varlen=True`): (total, H, D) with cu_seqlens; max_seqlen_* bound every sequence.
    window_left/right: -1 for no bound; causal is window_right = 0. deterministic: the backward
    computes dQ without atomics (bit-reproducible, slower). A tuple, so that it hashes fast as
    part of a launch plan key.
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
    deterministic: bool = False

    def to_op_args(self) -> Tuple[List[int], float]:
        """The fields as (ints, softmax_scale): what a torch custom op can take."""
        return [int(getattr(self, name)) for name in _INT_FIELDS], self.softmax_scale

    @classmethod
    def from_op_args(cls, ints: List[int], softmax_scale: float) -> AttentionSpec:
        fields = dict(zip(_INT_FIELDS, ints), softmax_scale=softmax_scale)
        for name in ("has_alibi", "varlen", "bhsd", "deterministic"):
            fields[name] = bool(fields[name])
        return cls(**fields)

    @property
    def block_d(self) -> int:
        """The head dim padded to a power of two (the tile's width)."""
        return 1 << (self.head_dim - 1).bit_length()


_INT_FIELDS = tuple(name for name in AttentionSpec._fields if name != "softmax_scale")


def _main_constexprs(spec: AttentionSpec) -> tuple:
    """HEAD_DIM, BLOCK_D, IS_VARLEN, HAS_LEFT, HAS_RIGHT, ALIBI: the leading constexprs of the
    three main kernels, in their parameter order."""
    return (
        spec.head_dim, spec.block_d, spec.varlen, spec.window_left >= 0, spec.window_right >= 0, spec.has_alibi,
    )  # fmt: skip


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


def _dq_accum_shape(spec: AttentionSpec, total_q: int) -> Tuple[int, ...]:
    """The backward's fp32 dQ accumulator, (B, H, D, S_q) or (H, D, total_q) for varlen: positions
    innermost (a key block's transposed dQ share, [D, positions], adds along contiguous memory,
    with vector atomics), padded to a multiple of 16 so that every row starts 64-byte aligned."""
    if spec.varlen:
        return (spec.n_heads, spec.head_dim, -(-total_q // 16) * 16)
    return (spec.batch, spec.n_heads, spec.head_dim, -(-spec.max_seqlen_q // 16) * 16)


def _dq_accum_strides(dq_accum: torch.Tensor, spec: AttentionSpec) -> Tuple[int, int, int]:
    """(batch, head, dim) strides of the dQ accumulator (positions have unit stride)."""
    if spec.varlen:
        return 0, dq_accum.stride(0), dq_accum.stride(1)
    return dq_accum.stride(0), dq_accum.stride(1), dq_accum.stride(2)


def _packed_rows(spec: AttentionSpec, q: torch.Tensor, k: torch.Tensor) -> Tuple[int, int]:
    """(total_q, total_k): the rows of a packed varlen batch, within which the kernels keep every
    sequence whatever cu_seqlens holds (int32 offsets cannot pass 2^31 - 1); 0 for dense batches."""
    if not spec.varlen:
        return 0, 0
    return min(q.shape[0], 2**31 - 1), min(k.shape[0], 2**31 - 1)


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


def _aligned(*tensors: Optional[torch.Tensor]) -> bool:
    """Every given tensor's data starts on a 16-byte boundary (what Triton specializes pointers
    on, and what TMA needs)."""
    bits = 0
    for t in tensors:
        if t is not None:
            bits |= t.data_ptr()
    return bits % 16 == 0


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
DESCRIPTOR_POSITION = {"fwd": 8, "dkdv": 12, "dq": 10}
# The config field that splits each main kernel's grid rows, and the one its descriptors tile.
_ROW_BLOCK = {"fwd": "block_m", "dkdv": "block_n", "dq": "block_m"}
_DESCRIPTOR_ROWS = {"fwd": "block_n", "dkdv": "block_m", "dq": "block_n"}


class _Launch:
    """One kernel launch as a plan fixes it: kernel, grid, launch options and the trailing
    arguments (integers, constexprs) that the plan key decides; each call passes the tensors.

    The first call goes through Triton's JIT (which compiles, and returns the compiled kernel);
    later calls use the compiled kernel's launcher directly where `_compat.direct_launcher`
    gives one (and fall back to the JIT while it declines, e.g. with launch hooks installed).
    """

    __slots__ = ("kernel", "grid", "trailing", "options", "direct")

    def __init__(self, kernel, grid: tuple, trailing: tuple, num_warps: int, num_stages: Optional[int] = None):
        self.kernel = kernel
        self.grid = (*grid, 1, 1)[:3]  # the direct launch takes all three dims
        self.trailing = trailing
        self.options = {"num_warps": num_warps}
        if num_stages is not None:
            self.options["num_stages"] = num_stages
        self.direct: Optional[Callable] = None

    def __call__(self, *tensors) -> None:
        direct = self.direct
        if direct is not None and direct(self.grid, tensors, self.trailing):
            return
        compiled = self.kernel[self.grid](*tensors, *self.trailing, **self.options)
        if direct is None:
            self.direct = direct_launcher(compiled)


class _MainLaunch(NamedTuple):
    """A main kernel's launch, and the TMA descriptor templates its two streamed tensors become
    (None: they are passed as plain pointers, which the kernel ignores)."""

    launch: _Launch
    descriptors: Optional[Tuple[TensorDescriptor, TensorDescriptor]]

    def __call__(self, head: tuple, tiled: Tuple[torch.Tensor, torch.Tensor]) -> None:
        descriptors = self.descriptors
        if descriptors is not None:
            tiled = (descriptor_like(descriptors[0], tiled[0]), descriptor_like(descriptors[1], tiled[1]))
        self.launch(*head, *tiled)


def _main_launch(kind: str, spec: AttentionSpec, config: Optional[KernelConfig], n_rows: int, n_row_groups: int,
                 head: tuple, tiled: Tuple[torch.Tensor, torch.Tensor], ints: tuple,
                 atomic: bool = False) -> _MainLaunch:  # fmt: skip
    """The plan of main kernel `kind` for this call, after launching it once.

    config None: the candidates of `configs.candidate_configs` (TMA ones on Hopper), the
    autotuner choosing among several (it times them the first time its key is seen); the plan
    keeps the winner. n_rows positions (split in blocks) x n_row_groups (batch x heads)
    programs. `head` are the tensor arguments before the descriptor pair, `tiled` the two
    tensors the inner loop streams (K, V; or Q, dO for dK/dV), `ints` the arguments after them
    up to the constexprs. atomic: the dK/dV kernel's DQ_ATOMIC.
    """
    constexprs = _main_constexprs(spec)
    if kind == "dkdv":
        constexprs += (atomic,)
    constexprs += (UPCAST_DOTS,)
    if config is None:
        candidates = candidate_configs(kind, spec.block_d, _tma_by_default(head[0].device))
    else:
        candidates = [config]
    heads_outer = _tma_layout(spec, tiled) if candidates[0].use_tma else None
    if candidates[0].use_tma and heads_outer is None:
        if config is not None:
            raise ValueError(f"{config} asks for TMA, but these tensors cannot be described by TMA descriptors")
        candidates = candidate_configs(kind, spec.block_d, False)
    tma = heads_outer is not None
    constexprs += (bool(heads_outer),)
    compiled = None
    if len(candidates) > 1:
        # The autotuner's pre-hook gives the descriptors each config's block shape.
        block = _ROW_BLOCK[kind].upper()
        seq_class = length_class(max(spec.max_seqlen_q, spec.max_seqlen_k))
        autotuned = autotuned_kernel(kind, spec.block_d, tma, seq_class)
        streamed = tuple(_descriptor(t, spec, 16) for t in tiled) if tma else tiled
        compiled = autotuned[lambda meta: (-(-n_rows // meta[block]) * n_row_groups,)](
            *head, *streamed, *ints, *constexprs
        )
        config = config_of(autotuned.best_config)
    else:
        config = candidates[0]
    templates = tuple(_descriptor(t, spec, getattr(config, _DESCRIPTOR_ROWS[kind])) for t in tiled) if tma else None
    for template in templates or ():
        template.base = None  # each call's copy gets its own tensor; the plan must not keep this one alive
    grid = (-(-n_rows // getattr(config, _ROW_BLOCK[kind])) * n_row_groups,)
    trailing = (*ints, *constexprs, config.block_m, config.block_n, config.use_tma)
    main = _MainLaunch(_Launch(KERNELS[kind], grid, trailing, config.num_warps, config.num_stages), templates)
    if compiled is None:
        main(head, tiled)
    else:
        main.launch.direct = direct_launcher(compiled)
    return main


# Launch plans by key (see the module docstring); bounded, cleared when full.
_PLANS: dict = {}
_MAX_PLANS = 4096


def clear_plans() -> None:
    """Forget every launch plan (the next calls rebuild them, choosing configs again)."""
    _PLANS.clear()


def _remember(key, plan):
    if len(_PLANS) >= _MAX_PLANS:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


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
    device = q.device
    o = torch.empty(q.shape, dtype=q.dtype, device=device)
    lse = torch.empty(lse_shape(spec, q.shape[0]), dtype=torch.float32, device=device)
    if o.numel() == 0:
        return o, lse
    slopes = lse if alibi_slopes is None else alibi_slopes
    if cu_seqlens_q is None:
        cu_seqlens_q = cu_seqlens_k = _placeholder_int32(device)
    key = (
        "fwd", spec, q.dtype, q.stride(), k.stride(), v.stride(), q.shape[0], k.shape[0],
        None if alibi_slopes is None else alibi_slopes.stride(),
        _aligned(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k), device, current_device_index(), config,
    )  # fmt: skip
    head = (q, k, v, o, lse, slopes, cu_seqlens_q, cu_seqlens_k)
    plan = _PLANS.get(key)
    if plan is not None:
        plan(head, (k, v))
        return o, lse
    ints = (
        *seq_strides(q, spec), *seq_strides(k, spec), *seq_strides(v, spec), *seq_strides(o, spec),
        *_lse_strides(lse, spec), *_slope_strides(alibi_slopes),
        spec.n_heads, spec.n_heads // spec.n_kv_heads, spec.max_seqlen_q, spec.max_seqlen_k, *_packed_rows(spec, q, k),
        spec.softmax_scale, spec.window_left, spec.window_right,
    )  # fmt: skip
    _remember(key, _main_launch("fwd", spec, config, spec.max_seqlen_q, spec.batch * spec.n_heads, head, (k, v), ints))
    return o, lse


class _BackwardPlan(NamedTuple):
    """The backward's launches (None: not launched, for empty query or key sets): the pre-pass
    (delta; with dq_atomic it also zeroes the fp32 dQ accumulator), the dK/dV kernel, then the dQ
    conversion (dq_atomic) or the dQ kernel."""

    dq_atomic: bool
    pre: Optional[_Launch]
    dkdv: Optional[_MainLaunch]
    post: Optional[object]


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
    grads: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) in the inputs' dtypes, contiguous in the call's layout, or written into `grads`
    (tensors of q's, k's and v's shapes and dtypes, unit-stride head dim: e.g. views of one packed
    gradient). Deterministic (no atomics) when spec.deterministic or under
    torch.use_deterministic_algorithms(True)."""
    if not spec.deterministic and torch.are_deterministic_algorithms_enabled():
        spec = spec._replace(deterministic=True)
    device = q.device
    if grads is None:
        dq = torch.empty(q.shape, dtype=q.dtype, device=device)
        dk = torch.empty(k.shape, dtype=k.dtype, device=device)
        dv = torch.empty(v.shape, dtype=v.dtype, device=device)
        grad_strides = None
    else:
        dq, dk, dv = grads
        grad_strides = (dq.stride(), dk.stride(), dv.stride())
    if dq.numel() == 0 and dk.numel() == 0:
        return dq, dk, dv
    delta = torch.empty_like(lse)  # the kernels index delta with the LSE's strides
    slopes = lse if alibi_slopes is None else alibi_slopes
    if cu_seqlens_q is None:
        cu_seqlens_q = cu_seqlens_k = _placeholder_int32(device)
    key = (
        "bwd", spec, q.dtype, q.stride(), k.stride(), v.stride(), do.stride(), o.stride(), lse.stride(), q.shape[0],
        k.shape[0], None if dlse is None else dlse.stride(), None if alibi_slopes is None else alibi_slopes.stride(),
        _aligned(q, k, v, do, dlse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, *(grads or ())), device,
        current_device_index(), dkdv_config, dq_config, grad_strides,
    )  # fmt: skip
    plan = _PLANS.get(key)
    if plan is not None:
        atomic = plan.dq_atomic
    else:
        kv_programs = spec.batch * spec.n_kv_heads * -(-spec.max_seqlen_k // 128)
        sm_count = multiprocessor_count(device.index or 0)
        longest = max(spec.max_seqlen_q, spec.max_seqlen_k)
        group = spec.n_heads // spec.n_kv_heads
        causal = spec.window_right == 0
        atomic = dq_atomic(spec.block_d, spec.deterministic, longest, causal, kv_programs, group, sm_count)
    # Without atomics the dK/dV kernel's dQ accumulator argument is only a stand-in (dK, which it
    # overwrites anyway).
    dq_accum = torch.empty(_dq_accum_shape(spec, q.shape[0]), dtype=torch.float32, device=device) if atomic else dk
    pre_args = (o, do, lse if dlse is None else dlse, delta, dq_accum, cu_seqlens_q)
    dkdv_head = (q, k, v, do, dk, dv, dq_accum, lse, delta, slopes, cu_seqlens_q, cu_seqlens_k)
    dq_head = (q, k, v, do, dq, lse, delta, slopes, cu_seqlens_q, cu_seqlens_k)
    if plan is None:
        _remember(key, _backward_plan(spec, atomic, pre_args, dkdv_head, dq_head, dkdv_config, dq_config))
        return dq, dk, dv
    if plan.pre is not None:
        plan.pre(*pre_args)
    if plan.dkdv is not None:
        plan.dkdv(dkdv_head, (q, do))
    if plan.post is not None:
        if atomic:
            plan.post(dq_accum, dq, cu_seqlens_q)
        else:
            plan.post(dq_head, (k, v))
    return dq, dk, dv


def _backward_plan(
    spec: AttentionSpec, atomic: bool, pre_args: tuple, dkdv_head: tuple, dq_head: tuple,
    dkdv_config: Optional[KernelConfig], dq_config: Optional[KernelConfig],
) -> _BackwardPlan:  # fmt: skip
    """Build the backward's plan for these tensors, launching each kernel once on the way."""
    o, do, dlse_or_lse, delta, dq_accum, cu_seqlens_q = pre_args
    q, k, v, _, dk, dv, _, lse, _, slopes, _, _ = dkdv_head
    dq = dq_head[4]
    has_queries, has_keys = dq.numel() > 0, dk.numel() > 0
    alibi_slopes = None if slopes is lse else slopes
    group = spec.n_heads // spec.n_kv_heads
    total_q, total_k = _packed_rows(spec, q, k)
    options = (
        spec.max_seqlen_q, spec.max_seqlen_k, total_q, total_k, spec.softmax_scale, spec.window_left, spec.window_right
    )  # fmt: skip
    lse_and_slope_strides = (*_lse_strides(lse, spec), *_slope_strides(alibi_slopes))
    zero = (0, 0, 0)
    block_m = preprocess_block_m(spec.block_d)
    rows_grid = (-(-spec.max_seqlen_q // block_m) * spec.batch * spec.n_heads,)
    rows_constexprs = (spec.head_dim, spec.block_d, block_m, spec.varlen)

    pre = dkdv = post = None
    if has_queries:
        if dlse_or_lse is lse:
            dlse_strides = zero
        elif spec.varlen:
            dlse_strides = (0, dlse_or_lse.stride(0), dlse_or_lse.stride(1))
        else:
            dlse_strides = dlse_or_lse.stride()
        pre = _Launch(
            _attn_bwd_preprocess_kernel, rows_grid,
            (
                *seq_strides(o, spec), *seq_strides(do, spec), *dlse_strides, *_lse_strides(lse, spec),
                *(_dq_accum_strides(dq_accum, spec) if atomic else zero), spec.n_heads, spec.max_seqlen_q, total_q,
                *rows_constexprs, dlse_or_lse is not lse, atomic,
            ),
            PREPROCESS_WARPS,
        )  # fmt: skip
        pre(*pre_args)
    if has_keys:
        ints = (
            *seq_strides(q, spec), *seq_strides(k, spec), *seq_strides(v, spec), *seq_strides(do, spec),
            *seq_strides(dk, spec), *seq_strides(dv, spec), *(_dq_accum_strides(dq_accum, spec) if atomic else zero),
            *lse_and_slope_strides, spec.n_kv_heads, group, *options,
        )  # fmt: skip
        dkdv = _main_launch(
            "dkdv", spec, dkdv_config, spec.max_seqlen_k, spec.batch * spec.n_kv_heads, dkdv_head, (q, do), ints, atomic
        )
    if has_queries and atomic:
        post = _Launch(
            _attn_bwd_dq_convert_kernel, rows_grid,
            (
                *_dq_accum_strides(dq_accum, spec), *seq_strides(dq, spec), spec.n_heads, spec.max_seqlen_q, total_q,
                spec.softmax_scale, *rows_constexprs, UPCAST_DOTS,
            ),
            PREPROCESS_WARPS,
        )  # fmt: skip
        post(dq_accum, dq, cu_seqlens_q)
    elif has_queries:
        ints = (
            *seq_strides(q, spec), *seq_strides(k, spec), *seq_strides(v, spec), *seq_strides(do, spec),
            *seq_strides(dq, spec), *lse_and_slope_strides, spec.n_heads, group, *options,
        )  # fmt: skip
        post = _main_launch("dq", spec, dq_config, spec.max_seqlen_q, spec.batch * spec.n_heads, dq_head, (k, v), ints)
    return _BackwardPlan(atomic, pre, dkdv, post)
