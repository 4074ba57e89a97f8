"""Launch plans of the attention kernels: what a layout decides, fixed once in Launch objects.

Inputs are already validated (see `attention.py`). Tensors are addressed through their strides
as (batch, position, head, dim) with a unit-stride head dim; a packed varlen batch is a
(total, heads, dim) tensor plus cu_seqlens. Nothing here copies an input, except a gradient
that the kernels cannot address (`ForwardPlan.backward`).

A forward plan (`forward_plan`) is an immutable value cached per spec, dtype, device, the
inputs' shapes and strides and whether they start 16-byte aligned (what TMA needs). It fixes,
in Launch objects of the shared runtime, every kernel argument that these decide: strides,
sizes, constexprs, the config, the grid and the TMA descriptor templates. A call allocates O and
the LSE and launches. Its backward plans (`ForwardPlan.backward`), cached per forward plan and
the gradients' layouts, hold the pre-pass, the dK/dV kernel and the dQ conversion or kernel
likewise. Where a kernel has several candidate configs, the runtime's tuning runs the autotuner
on a plan's first call and publishes a Launch of its choice, which every later call of the plan
runs (ops/configs.py).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from .._compat import UPCAST_DOTS
from .._runtime.cache import PublishedCache
from .._runtime.compat import (
    HAS_GLUON_HOPPER,
    HAS_TENSOR_DESCRIPTORS,
    INTERPRETING,
    descriptor_like,
    device_capability,
    gluon_descriptor_template,
    multiprocessor_count,
    tensor_descriptor,
)
from .._runtime.dropout import dropout_threshold_and_scale
from .._runtime.launch import Launch
from .._runtime.tuning import TunedPlan
from .._validation import LOG2E
from ..kernels.attention_bwd import _attn_bwd_dq_convert_kernel, _attn_bwd_preprocess_kernel
from . import configs
from .configs import KERNELS, PREPROCESS_WARPS, KernelConfig, dq_atomic, length_class, preprocess_block_m

# Plans kept per cache (a training run meets a handful of layouts).
PLANS = 1024

# The kernels add the offsets of a tile's rows (up to 127 rows past a block's start, plus the head
# dim's lanes) in int32: an input with a larger position stride is copied, as is one whose head dim
# lacks unit stride. (Outputs and gradients are allocated packed: their strides are small.)
MAX_POSITION_STRIDE = (2**31 - 1 - 256) // 127


class AttentionSpec(NamedTuple):
    """Everything about one attention call except the tensors' data.

    Dense: tensors are (B, S, H, D) (`bhsd=False`) or (B, H, S, D) (`bhsd=True`). Varlen
    (`varlen=True`): (total, H, D) with cu_seqlens; max_seqlen_* bound every sequence.
    window_left/right: -1 for no bound; causal is window_right = 0. deterministic: the backward
    computes dQ without atomics (bit-reproducible, slower). softcap: 0 for none, else the scores
    are softcap * tanh(q.k * softmax_scale / softcap). dropout_p: the probability of dropping an
    attention weight (its Philox key comes with each call). A tuple, so that it hashes fast as part
    of a launch plan key.
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
    softcap: float = 0.0
    dropout_p: float = 0.0

    def to_op_args(self) -> Tuple[List[int], List[float]]:
        """The fields as (ints, floats): what a torch custom op can take."""
        return [int(getattr(self, name)) for name in _INT_FIELDS], [getattr(self, name) for name in _FLOAT_FIELDS]

    @classmethod
    def from_op_args(cls, ints: List[int], floats: List[float]) -> AttentionSpec:
        fields = dict(zip(_INT_FIELDS, ints), **dict(zip(_FLOAT_FIELDS, floats)))
        for name in ("has_alibi", "varlen", "bhsd", "deterministic"):
            fields[name] = bool(fields[name])
        return cls(**fields)

    @property
    def block_d(self) -> int:
        """The head dim padded to a power of two (the tile's width)."""
        return 1 << (self.head_dim - 1).bit_length()

    @property
    def seq_dim(self) -> int:
        """The position dim of q/k/v/O in the call's layout."""
        return 0 if self.varlen else 2 if self.bhsd else 1


_FLOAT_FIELDS = ("softmax_scale", "softcap", "dropout_p")
_INT_FIELDS = tuple(name for name in AttentionSpec._fields if name not in _FLOAT_FIELDS)


def contiguous_strides(shape) -> Tuple[int, ...]:
    """The strides torch gives a contiguous tensor of `shape`."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def addressable(strides: Tuple[int, ...], seq_dim: int) -> bool:
    """Whether the kernels address a tensor of these strides as it is: a unit-stride head dim and
    positions at most MAX_POSITION_STRIDE elements apart."""
    return strides[-1] == 1 and strides[seq_dim] <= MAX_POSITION_STRIDE


def seq_strides(strides: Tuple[int, ...], spec: AttentionSpec) -> Tuple[int, int, int]:
    """(batch, position, head) strides of q/k/v/O or their gradients, from their strides."""
    if spec.varlen:
        return 0, strides[0], strides[1]
    if spec.bhsd:
        return strides[0], strides[2], strides[1]
    return strides[0], strides[1], strides[2]


def lse_shape(spec: AttentionSpec, total_q: int) -> Tuple[int, ...]:
    """(B, H, S_q), or (H, total_q) for varlen, as FlashAttention-2's softmax_lse."""
    if spec.varlen:
        return (spec.n_heads, total_q)
    return (spec.batch, spec.n_heads, spec.max_seqlen_q)


def _lse_strides(spec: AttentionSpec, total_q: int) -> Tuple[int, int]:
    """(batch, head) strides of the LSE (and of delta, allocated like it); positions have unit stride."""
    strides = contiguous_strides(lse_shape(spec, total_q))
    return (0, strides[0]) if spec.varlen else (strides[0], strides[1])


def _dq_accum_shape(spec: AttentionSpec, total_q: int) -> Tuple[int, ...]:
    """The backward's fp32 dQ accumulator, (B, H, D, S_q) or (H, D, total_q) for varlen: positions
    innermost (a key block's transposed dQ share, [D, positions], adds along contiguous memory,
    with vector atomics), padded to a multiple of 16 so that every row starts 64-byte aligned."""
    if spec.varlen:
        return (spec.n_heads, spec.head_dim, -(-total_q // 16) * 16)
    return (spec.batch, spec.n_heads, spec.head_dim, -(-spec.max_seqlen_q // 16) * 16)


def _dq_accum_strides(spec: AttentionSpec, total_q: int) -> Tuple[int, int, int]:
    """(batch, head, dim) strides of the dQ accumulator (positions have unit stride)."""
    strides = contiguous_strides(_dq_accum_shape(spec, total_q))
    return (0, strides[0], strides[1]) if spec.varlen else strides[:3]


def _packed_rows(spec: AttentionSpec, total_q: int, total_k: int) -> Tuple[int, int]:
    """(total_q, total_k): the rows of a packed varlen batch, within which the kernels keep every
    sequence whatever cu_seqlens holds (int32 offsets cannot pass 2^31 - 1); 0 for dense batches."""
    if not spec.varlen:
        return 0, 0
    return min(total_q, 2**31 - 1), min(total_k, 2**31 - 1)


def _slope_strides(strides: Optional[Tuple[int, ...]]) -> Dict[str, int]:
    if strides is None:
        batch, head = 0, 0
    elif len(strides) == 1:
        batch, head = 0, strides[0]
    else:
        batch, head = strides
    return {"stride_slope_b": batch, "stride_slope_h": head}


def _strides(name: str, strides: Tuple[int, int, int]) -> Dict[str, int]:
    """The (batch, position, head) stride arguments of tensor `name` (e.g. stride_qb, stride_qs, stride_qh)."""
    return {f"stride_{name}b": strides[0], f"stride_{name}s": strides[1], f"stride_{name}h": strides[2]}


def _softcap_args(spec: AttentionSpec) -> Dict[str, float]:
    """The kernels' softcap factors (kernels/common.py, _softcap_scores); 0 without a softcap."""
    if not spec.softcap:
        return {"softcap_in": 0.0, "softcap_out": 0.0}
    return {
        "softcap_in": 2.0 * spec.softmax_scale * LOG2E / spec.softcap,
        "softcap_out": spec.softcap * LOG2E,
    }


def _sizes_and_options(spec: AttentionSpec, total_q: int, total_k: int) -> Dict[str, object]:
    """The arguments the three main kernels share: sizes, options and mask/bias constexprs."""
    dropout_threshold, dropout_scale = dropout_threshold_and_scale(spec.dropout_p)
    return dict(
        **_softcap_args(spec), SOFTCAP=spec.softcap > 0, dropout_threshold=dropout_threshold,
        dropout_scale=dropout_scale, DROPOUT=spec.dropout_p > 0,
        kv_group=spec.n_heads // spec.n_kv_heads, max_seqlen_q=spec.max_seqlen_q, max_seqlen_k=spec.max_seqlen_k,
        total_q=total_q, total_k=total_k, softmax_scale=spec.softmax_scale, window_left=spec.window_left,
        window_right=spec.window_right, HEAD_DIM=spec.head_dim, BLOCK_D=spec.block_d, IS_VARLEN=spec.varlen,
        HAS_LEFT=spec.window_left >= 0, HAS_RIGHT=spec.window_right >= 0, ALIBI=spec.has_alibi,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# TMA descriptors


def _descriptor_view(
    shape: Tuple[int, ...], strides: Tuple[int, ...], itemsize: int, spec: AttentionSpec
) -> Optional[Tuple[List[int], List[int], bool]]:
    """A tensor of this shape and strides as a 4-D TMA view (shape, strides, heads_outer), or None
    when TMA cannot address it.

    The dims follow the memory order, strides non-increasing: (batch, position, head, dim), or
    (batch, head, position, dim) when the head stride is the larger (the SDPA layout). A packed
    varlen batch is batch 1. Size-1 dims get the stride a packed tensor would have (any stride
    addresses them). TMA needs a non-empty tensor, 16-byte multiples (and a 16-byte aligned base,
    which the caller checks).
    """
    if math.prod(shape) == 0:
        return None
    stride_b, stride_s, stride_h = seq_strides(strides, spec)
    if spec.varlen:
        batch, positions, heads = 1, shape[0], shape[1]
    elif spec.bhsd:
        batch, heads, positions = shape[0], shape[1], shape[2]
    else:
        batch, positions, heads = shape[0], shape[1], shape[2]
    heads_outer = stride_h > stride_s
    dims = [[batch, stride_b], [heads, stride_h], [positions, stride_s]]
    if not heads_outer:
        dims[1], dims[2] = dims[2], dims[1]
    inner_extent = shape[-1]  # the unit-stride head dim
    for dim in reversed(dims):
        if dim[0] == 1:
            dim[1] = inner_extent
        inner_extent = dim[0] * dim[1]
    view_strides = [stride for _, stride in dims]
    if (
        any(stride * itemsize % 16 for stride in view_strides)
        or view_strides != sorted(view_strides, reverse=True)
        or view_strides[-1] < 1
    ):
        return None
    return [n for n, _ in dims] + [shape[-1]], view_strides + [1], heads_outer


def _tma_views(spec: AttentionSpec, layouts, itemsize: int, aligned: bool):
    """The TMA views of a kernel's two streamed tensors, given as (shape, strides) pairs, or None
    when they cannot both be described with the same dim order (or do not start 16-byte aligned)."""
    if not aligned:
        return None
    views = [_descriptor_view(shape, strides, itemsize, spec) for shape, strides in layouts]
    if any(view is None for view in views) or views[0][2] != views[1][2]:
        return None
    return views


def _tma_by_default(device: torch.device) -> bool:
    """The autotuned path loads through TMA on Hopper and newer with Triton >= 3.4."""
    return HAS_TENSOR_DESCRIPTORS and not INTERPRETING and device_capability(device)[0] >= 9


def _descriptor_block(heads_outer: bool, rows: int, block_d: int) -> List[int]:
    return [1, 1, rows, block_d] if heads_outer else [1, rows, 1, block_d]


# ---------------------------------------------------------------------------------------------
# The main kernels' launches

# Position of the two descriptor arguments in each kernel's argument list (the tensor arguments
# before them and the two descriptors are what each launch takes per call).
DESCRIPTOR_POSITION = {"fwd": 9, "dkdv": 13, "dq": 11}
# The config field that splits each main kernel's grid rows, and the one its descriptors tile.
_ROW_BLOCK = {"fwd": "block_m", "dkdv": "block_n", "dq": "block_m"}
_DESCRIPTOR_ROWS = {"fwd": "block_n", "dkdv": "block_m", "dq": "block_n"}


@functools.cache
def _tensor_parameters(kind: str) -> Tuple[str, ...]:
    """The per-call parameters of main kernel `kind`: its tensors, then its two descriptors."""
    names = tuple(inspect.signature(KERNELS[kind].fn).parameters)  # jitted or interpreted
    return names[: DESCRIPTOR_POSITION[kind] + 2]


class MainLaunch(NamedTuple):
    """A main kernel's launch: a Launch of one config and the TMA descriptor templates of its two
    streamed tensors (None: they are passed as plain pointers, which the kernel ignores); or, with
    several candidate configs, the plan that the runtime's tuning resolves on its first call."""

    launch: Optional[Launch]
    templates: Optional[Tuple[object, object]]
    tuned: Optional[TunedPlan]

    def __call__(self, *tensors) -> None:
        """Launch on the kernel's tensor arguments in order, the two streamed tensors (those the
        descriptors address) last."""
        launch, templates = self.launch, self.templates
        if launch is None:
            kernel = self.tuned.kernel
            entry = kernel.entry(self.tuned)
            if entry is None:  # the autotuner chooses, under the kernel's lock, and launches
                kernel.tune(self.tuned, tensors)
                return
            launch, templates = entry.launch, entry.descriptors
            if templates is not None:
                templates = templates[-2:]
        if templates is None:
            launch(*tensors)
        else:
            a, b = tensors[-2:]
            launch(*tensors[:-2], descriptor_like(templates[0], a), descriptor_like(templates[1], b))


def _tuned_grid(n_rows: int, n_row_groups: int, block: str, meta: dict) -> Tuple[int]:
    return (-(-n_rows // meta[block]) * n_row_groups,)


def _block_major(spec: AttentionSpec) -> bool:
    """Whether the main kernels' grid runs block-major in groups of 8 batch-heads (kernels/common.py
    _program_block): for dense causal attention, whose programs differ in length. Measured on an
    H200 (Triton 3.6, D = 128, S = 2048, B = 4, 16 heads) against head-major: forward and backward
    1.08x; with 4 KV heads, backward 1.26x (its grid, one program per KV head and key block, runs
    in about two waves). Full attention keeps head-major (equal programs; backward 2 % slower
    block-major at S = 4096); varlen batches and sliding windows were not measured."""
    return spec.window_right == 0 and spec.window_left < 0 and not spec.varlen


def _main_launch(
    kind: str, spec: AttentionSpec, config: Optional[KernelConfig], n_rows: int, n_row_groups: int,
    fixed: Dict[str, object], streamed, itemsize: int, aligned: bool, device: torch.device,
) -> MainLaunch:  # fmt: skip
    """Main kernel `kind`'s launch over n_rows positions (split in blocks) x n_row_groups (batch x
    heads) programs, with the arguments `fixed` (all but the tensors, UPCAST, HEADS_OUTER,
    BLOCK_MAJOR and the config's), streaming two tensors of the (shape, strides) layouts `streamed`.

    config None: the candidates of `configs.candidate_configs` (TMA ones on Hopper, where the
    streamed tensors allow it), the autotuner choosing among several on the plan's first call.
    """
    candidates = [config] if config is not None else configs.candidate_configs(
        kind, spec.block_d, _tma_by_default(device)
    )  # fmt: skip
    views = _tma_views(spec, streamed, itemsize, aligned) if candidates[0].use_tma else None
    if candidates[0].use_tma and views is None:
        if config is not None:
            raise ValueError(f"{config} asks for TMA, but these tensors cannot be described by TMA descriptors")
        candidates = configs.candidate_configs(kind, spec.block_d, False)
    fixed = dict(
        fixed, UPCAST=UPCAST_DOTS, HEADS_OUTER=views is not None and views[0][2], BLOCK_MAJOR=_block_major(spec)
    )  # fmt: skip
    row_block = _ROW_BLOCK[kind]
    if len(candidates) > 1:
        seq_class = length_class(max(spec.max_seqlen_q, spec.max_seqlen_k))
        names = _tensor_parameters(kind)
        descriptors = None
        if views is not None:  # the autotuner's pre-hook gives them each config's block shape
            descriptors = (None,) * (len(names) - 2) + tuple((tuple(shape), tuple(s)) for shape, s, _ in views)
        tuned = TunedPlan(
            configs.tuned_kernel(kind, spec.block_d, views is not None, seq_class), fixed=tuple(fixed.items()),
            tensors=names, grid=functools.partial(_tuned_grid, n_rows, n_row_groups, row_block.upper()),
            descriptors=descriptors,
        )  # fmt: skip
        return MainLaunch(None, None, tuned)
    config = candidates[0]
    templates = None
    if views is not None:
        rows = getattr(config, _DESCRIPTOR_ROWS[kind])
        templates = tuple(
            tensor_descriptor(None, shape, strides, _descriptor_block(heads_outer, rows, spec.block_d))
            for shape, strides, heads_outer in views
        )
    grid = (-(-n_rows // getattr(config, row_block)) * n_row_groups,)
    launch = Launch(
        KERNELS[kind], grid, num_warps=config.num_warps, num_stages=config.num_stages, **fixed, **config.meta()
    )
    return MainLaunch(launch, templates, None)


# Whether the backward may run kernels/attention_bwd_hopper.py's dK/dV kernel where it applies
# (tests set it False to compare with the portable kernel, then call clear_plans).
HOPPER_DKDV = True
# At D = 64 the Hopper kernel (64 keys per program) measured 1.07-1.09x the portable one (128 keys
# per program) at 2048 keys and 0.92-0.95x at 4096 (H200, causal, bf16).
HOPPER_DKDV_MAX_KEYS_D64 = 2048


class HopperDkdv(NamedTuple):
    """kernels/attention_bwd_hopper.py's dK/dV launch: a Launch of the kernel (every argument but
    the descriptors and tensors fixed) and the Gluon descriptor templates of q, k, v and dO."""

    launch: Launch
    templates: Tuple[object, object, object, object]

    def __call__(self, q, k, v, do, dk, dv, dq_accum, lse, delta, *unused) -> None:
        """The dK/dV MainLaunch's call (dq_accum and the arguments after delta are not read)."""
        q_t, k_t, v_t, do_t = self.templates
        self.launch(
            descriptor_like(q_t, q), descriptor_like(k_t, k), descriptor_like(v_t, v), descriptor_like(do_t, do), lse,
            delta, dk, dv,
        )  # fmt: skip


def _hopper_dkdv(
    fplan: ForwardPlan, do_strides, do_aligned: bool, atomic: bool, config: Optional[KernelConfig], grad_strides
) -> Optional[HopperDkdv]:  # fmt: skip
    """The Hopper dK/dV launch where its kernel applies (see its module docstring: Triton 3.6 on
    sm_90, 16-bit dense inputs, head dim 64 (up to HOPPER_DKDV_MAX_KEYS_D64 keys) or 128, causal
    with equal lengths or full attention, no ALiBi, softcap, dropout or window, TMA-addressable q,
    k, v and dO), else None. Never for a pinned config or atomic dQ accumulation."""
    spec, device = fplan.spec, fplan.device
    causal = spec.window_right == 0
    if (
        not HOPPER_DKDV or not HAS_GLUON_HOPPER or config is not None or atomic
        or fplan.dtype not in (torch.float16, torch.bfloat16) or spec.head_dim not in (64, 128)
        or spec.varlen or spec.has_alibi or spec.softcap or spec.dropout_p or spec.window_left >= 0
        or spec.window_right > 0 or (causal and spec.max_seqlen_q != spec.max_seqlen_k)
        or device.type != "cuda" or device_capability(device) != (9, 0)
        or (spec.head_dim == 64 and spec.max_seqlen_k > HOPPER_DKDV_MAX_KEYS_D64)
    ):  # fmt: skip
        return None
    itemsize = fplan.dtype.itemsize
    query_views = _tma_views(spec, ((fplan.q_shape, fplan.q_strides), (fplan.q_shape, do_strides)), itemsize,
                             fplan.aligned and do_aligned)  # fmt: skip
    key_views = _tma_views(spec, ((fplan.k_shape, fplan.k_strides), (fplan.k_shape, fplan.v_strides)), itemsize,
                           fplan.aligned)  # fmt: skip
    if query_views is None or key_views is None or query_views[0][2] != key_views[0][2]:
        return None
    from ..kernels import attention_bwd_hopper as hopper

    heads_outer = query_views[0][2]
    (q_view, do_view), (k_view, v_view) = query_views, key_views
    templates = tuple(
        gluon_descriptor_template(shape, strides, _descriptor_block(heads_outer, rows, spec.block_d), fplan.dtype)
        for (shape, strides, _), rows in ((q_view, hopper.BLOCK_M), (k_view, hopper.BLOCK_N), (v_view, hopper.BLOCK_N),
                                          (do_view, hopper.BLOCK_M))
    )  # fmt: skip
    stride_lse_b, stride_lse_h = _lse_strides(spec, fplan.q_shape[0])
    grid = (-(-spec.max_seqlen_k // hopper.BLOCK_N) * spec.batch * spec.n_kv_heads,)
    launch = Launch(
        hopper._attn_bwd_dkdv_hopper_kernel, grid, num_warps=hopper.NUM_WARPS,
        **_strides("dk", seq_strides(grad_strides[1], spec)), **_strides("dv", seq_strides(grad_strides[2], spec)),
        stride_lse_b=stride_lse_b, stride_lse_h=stride_lse_h, n_kv_heads=spec.n_kv_heads,
        kv_group=spec.n_heads // spec.n_kv_heads, seqlen_q=spec.max_seqlen_q, seqlen_k=spec.max_seqlen_k,
        qk_scale=spec.softmax_scale * LOG2E, softmax_scale=spec.softmax_scale, CAUSAL=causal,
        HEADS_OUTER=heads_outer, BLOCK_MAJOR=_block_major(spec), STAGES=hopper.STAGES[spec.head_dim],
    )  # fmt: skip
    return HopperDkdv(launch, templates)


@functools.cache
def _placeholder_int32(device: torch.device) -> torch.Tensor:
    """Stands in for absent cu_seqlens (never read: IS_VARLEN is a constexpr)."""
    return torch.zeros(1, dtype=torch.int32, device=device)


def _sms(device: torch.device) -> int:
    """Multiprocessors of `device` for the dQ mode choice; 0 when interpreting (no such limit)."""
    return 0 if INTERPRETING else multiprocessor_count(device)


# ---------------------------------------------------------------------------------------------
# Forward


@dataclasses.dataclass(frozen=True, eq=False)
class ForwardPlan:
    """One layout's forward launch and what its backward plans are built from.

    q_shape, k_shape (v has k's shape), *_strides: the inputs' layouts; slopes_strides: the ALiBi
    slopes' strides (None without); aligned: q, k and v start 16-byte aligned. O is allocated
    contiguous with q's shape, the LSE contiguous with lse_shape. main: the kernel's launch (None
    when there is no query). Compared by identity (plans come from an lru_cache'd builder).
    """

    spec: AttentionSpec
    dtype: torch.dtype
    device: torch.device
    q_shape: Tuple[int, ...]
    k_shape: Tuple[int, ...]
    q_strides: Tuple[int, ...]
    k_strides: Tuple[int, ...]
    v_strides: Tuple[int, ...]
    slopes_strides: Optional[Tuple[int, ...]]
    aligned: bool
    lse_shape: Tuple[int, ...]
    # Whether q, k and v are contiguous: O and the gradients are then allocated empty_like them.
    contiguous: Tuple[bool, bool, bool]
    main: Optional[MainLaunch]
    placeholder: torch.Tensor

    def _new(self, like: torch.Tensor, index: int, shape) -> torch.Tensor:
        """A contiguous tensor of `shape` in the inputs' dtype: empty_like(like) where input `index`
        (q, k or v, which `like` has the shape of) is contiguous, the faster allocation."""
        if self.contiguous[index]:
            return torch.empty_like(like)
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def forward(
        self, q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng=None
    ) -> Tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(O, LSE): O like q (contiguous in the call's layout), LSE fp32 natural-log. rng: the
        dropout's three int32 words (dropout_rng), with spec.dropout_p > 0."""
        o = self._new(q, 0, self.q_shape)
        lse = torch.empty(self.lse_shape, dtype=torch.float32, device=self.device)
        main = self.main
        if main is not None:
            if cu_seqlens_q is None:
                cu_seqlens_q = cu_seqlens_k = self.placeholder
            main(
                q, k, v, o, lse, lse if alibi_slopes is None else alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                self.placeholder if rng is None else rng, k, v,
            )  # fmt: skip
        return o, lse

    def backward(
        self, do, dlse, q, k, v, o, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, grads=None, grad_strides=None,
        dkdv_config=None, dq_config=None, rng=None,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """(dQ, dK, dV) in the inputs' dtypes, contiguous in the call's layout, or written into
        `grads` (tensors of q's, k's and v's shapes and dtypes and of the strides `grad_strides`,
        unit-stride head dim: e.g. views of one packed gradient). o, lse and rng: this plan's
        forward outputs and its dropout words. do: any strides (copied where the kernels cannot
        address it); None: zero. Deterministic (no atomics) when spec.deterministic or under
        torch.use_deterministic_algorithms(True)."""
        if do is None:
            do = torch.zeros_like(o)
        do_strides = do.stride()
        if not addressable(do_strides, self.spec.seq_dim):
            do = do.contiguous()
            do_strides = do.stride()
        dlse_strides = None
        if dlse is not None:
            dlse_strides = dlse.stride()
            if dlse_strides[-1] > MAX_POSITION_STRIDE:  # positions are its last dim
                dlse = dlse.contiguous()
                dlse_strides = dlse.stride()
        if grads is not None and grad_strides is None:
            grad_strides = tuple(g.stride() for g in grads)
        plan = _backward_plan(
            self, do_strides, dlse_strides, self.spec.deterministic or torch.are_deterministic_algorithms_enabled(),
            not do.data_ptr() & 15, grad_strides, dkdv_config, dq_config,
        )  # fmt: skip
        if grads is None:
            dq, dk, dv = self._new(q, 0, self.q_shape), self._new(k, 1, self.k_shape), self._new(v, 2, self.k_shape)
        else:
            dq, dk, dv = grads
        if plan.pre is None and plan.dkdv is None:  # no query and no key
            return dq, dk, dv
        delta = torch.empty_like(lse)  # the kernels index delta with the LSE's strides
        # Without atomics the dK/dV kernel's dQ accumulator argument is only a stand-in (dK, which it
        # overwrites anyway).
        dq_accum = torch.empty(plan.dq_accum_shape, dtype=torch.float32, device=self.device) if plan.dq_atomic else dk
        slopes = lse if alibi_slopes is None else alibi_slopes
        if cu_seqlens_q is None:
            cu_seqlens_q = cu_seqlens_k = self.placeholder
        if rng is None:
            rng = self.placeholder
        if plan.pre is not None:
            plan.pre(o, do, lse if dlse is None else dlse, delta, dq_accum, cu_seqlens_q)
        if plan.dkdv is not None:
            plan.dkdv(q, k, v, do, dk, dv, dq_accum, lse, delta, slopes, cu_seqlens_q, cu_seqlens_k, rng, q, do)
        if plan.post is not None:
            if plan.dq_atomic:
                plan.post(dq_accum, dq, cu_seqlens_q)
            else:
                plan.post(q, k, v, do, dq, lse, delta, slopes, cu_seqlens_q, cu_seqlens_k, rng, k, v)
        return dq, dk, dv


@functools.lru_cache(maxsize=PLANS)
def layout_plan(
    spec: AttentionSpec, dtype: torch.dtype, device: torch.device, q_shape, k_shape, q_strides, k_strides, v_strides,
    slopes_strides, aligned: bool, config: Optional[KernelConfig],
) -> ForwardPlan:  # fmt: skip
    """The forward plan of a layout (see ForwardPlan) of validated, addressable inputs; config: one
    config instead of the candidates."""
    total_q, total_k = _packed_rows(spec, q_shape[0], k_shape[0])
    main = None
    if math.prod(q_shape):
        stride_lse_b, stride_lse_h = _lse_strides(spec, q_shape[0])
        fixed = dict(
            **_strides("q", seq_strides(q_strides, spec)), **_strides("k", seq_strides(k_strides, spec)),
            **_strides("v", seq_strides(v_strides, spec)),
            **_strides("o", seq_strides(contiguous_strides(q_shape), spec)),
            stride_lse_b=stride_lse_b, stride_lse_h=stride_lse_h, **_slope_strides(slopes_strides),
            n_heads=spec.n_heads, **_sizes_and_options(spec, total_q, total_k),
        )  # fmt: skip
        streamed = ((k_shape, k_strides), (k_shape, v_strides))
        main = _main_launch(
            "fwd", spec, config, spec.max_seqlen_q, spec.batch * spec.n_heads, fixed, streamed, dtype.itemsize,
            aligned, device,
        )  # fmt: skip
    return ForwardPlan(
        spec, dtype, device, tuple(q_shape), tuple(k_shape), q_strides, k_strides, v_strides, slopes_strides, aligned,
        lse_shape(spec, q_shape[0]),
        tuple(strides == contiguous_strides(shape) for shape, strides in
              ((q_shape, q_strides), (k_shape, k_strides), (k_shape, v_strides))),
        main, _placeholder_int32(device),
    )  # fmt: skip


def _aligned(*tensors: torch.Tensor) -> bool:
    """Every tensor's data starts on a 16-byte boundary (what TMA needs)."""
    bits = 0
    for t in tensors:
        bits |= t.data_ptr()
    return bits % 16 == 0


def forward_plan(q, k, v, alibi_slopes, spec: AttentionSpec, config: Optional[KernelConfig] = None) -> ForwardPlan:
    """The forward plan of these (validated, addressable) tensors."""
    return layout_plan(
        spec, q.dtype, q.device, q.shape, k.shape, q.stride(), k.stride(), v.stride(),
        None if alibi_slopes is None else alibi_slopes.stride(), _aligned(q, k, v), config,
    )  # fmt: skip


def attention_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alibi_slopes: Optional[torch.Tensor],
    cu_seqlens_q: Optional[torch.Tensor],
    cu_seqlens_k: Optional[torch.Tensor],
    spec: AttentionSpec,
    config: Optional[KernelConfig] = None,
    rng: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(O, LSE) of validated, addressable inputs: O like q (contiguous in the call's layout), LSE
    fp32 natural-log. config: one config instead of the candidates. rng: the dropout's words."""
    plan = forward_plan(q, k, v, alibi_slopes, spec, config)
    return plan.forward(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, rng)


# ---------------------------------------------------------------------------------------------
# Backward


class BackwardPlan(NamedTuple):
    """The backward's launches (None: not launched, for empty query or key sets): the pre-pass
    (delta; with dq_atomic it also zeroes the fp32 dQ accumulator), the dK/dV kernel, then the dQ
    conversion (dq_atomic) or the dQ kernel."""

    dq_atomic: bool
    dq_accum_shape: Tuple[int, ...]
    pre: Optional[Launch]
    dkdv: Optional[object]  # a MainLaunch or a HopperDkdv
    post: Optional[object]


@functools.lru_cache(maxsize=PLANS)
def _backward_plan(
    fplan: ForwardPlan, do_strides, dlse_strides, deterministic: bool, do_aligned: bool, grad_strides,
    dkdv_config: Optional[KernelConfig], dq_config: Optional[KernelConfig],
) -> BackwardPlan:  # fmt: skip
    """The backward of `fplan` for a gradient of O of these strides (do_aligned: its data starts
    16-byte aligned), of the LSE of these strides (None: none), written into gradients of these
    strides (None: new contiguous ones)."""
    spec, device = fplan.spec, fplan.device
    q_shape, k_shape = fplan.q_shape, fplan.k_shape
    has_queries, has_keys = math.prod(q_shape) > 0, math.prod(k_shape) > 0
    if grad_strides is None:
        grad_strides = (contiguous_strides(q_shape), contiguous_strides(k_shape), contiguous_strides(k_shape))
    longest = max(spec.max_seqlen_q, spec.max_seqlen_k)
    group = spec.n_heads // spec.n_kv_heads
    kv_programs = spec.batch * spec.n_kv_heads * -(-spec.max_seqlen_k // 128)
    atomic = dq_atomic(spec.block_d, deterministic, longest, spec.window_right == 0, kv_programs, group, _sms(device))
    total_q, total_k = _packed_rows(spec, q_shape[0], k_shape[0])
    stride_lse_b, stride_lse_h = _lse_strides(spec, q_shape[0])
    lse_and_slopes = dict(stride_lse_b=stride_lse_b, stride_lse_h=stride_lse_h, **_slope_strides(fplan.slopes_strides))
    dq_accum = _dq_accum_strides(spec, q_shape[0]) if atomic else (0, 0, 0)
    dq_accum_args = dict(zip(("stride_dqab", "stride_dqah", "stride_dqad"), dq_accum))
    inputs = {
        **_strides("q", seq_strides(fplan.q_strides, spec)), **_strides("k", seq_strides(fplan.k_strides, spec)),
        **_strides("v", seq_strides(fplan.v_strides, spec)), **_strides("do", seq_strides(do_strides, spec)),
    }  # fmt: skip
    shared = _sizes_and_options(spec, total_q, total_k)
    block_m = preprocess_block_m(spec.block_d)
    rows_grid = (-(-spec.max_seqlen_q // block_m) * spec.batch * spec.n_heads,)
    rows_constexprs = dict(HEAD_DIM=spec.head_dim, BLOCK_D=spec.block_d, BLOCK_M=block_m, IS_VARLEN=spec.varlen)
    itemsize = fplan.dtype.itemsize

    pre = dkdv = post = None
    if has_queries:
        if dlse_strides is None:
            dlse_args = (0, 0, 0)
        elif spec.varlen:
            dlse_args = (0, *dlse_strides)
        else:
            dlse_args = dlse_strides
        pre = Launch(
            _attn_bwd_preprocess_kernel, rows_grid, **_strides("o", seq_strides(contiguous_strides(q_shape), spec)),
            **_strides("do", seq_strides(do_strides, spec)),
            **dict(zip(("stride_dlse_b", "stride_dlse_h", "stride_dlse_s"), dlse_args)),
            stride_delta_b=stride_lse_b, stride_delta_h=stride_lse_h, **dq_accum_args, n_heads=spec.n_heads,
            max_seqlen_q=spec.max_seqlen_q, total_q=total_q, **rows_constexprs, HAS_DLSE=dlse_strides is not None,
            ZERO_DQ=atomic, num_warps=PREPROCESS_WARPS,
        )  # fmt: skip
    if has_keys:
        dkdv = _hopper_dkdv(fplan, do_strides, do_aligned, atomic, dkdv_config, grad_strides)
    if has_keys and dkdv is None:
        fixed = dict(
            **inputs, **_strides("dk", seq_strides(grad_strides[1], spec)),
            **_strides("dv", seq_strides(grad_strides[2], spec)), **dq_accum_args, **lse_and_slopes,
            n_kv_heads=spec.n_kv_heads, **shared, DQ_ATOMIC=atomic,
        )  # fmt: skip
        streamed = ((q_shape, fplan.q_strides), (q_shape, do_strides))
        dkdv = _main_launch(
            "dkdv", spec, dkdv_config, spec.max_seqlen_k, spec.batch * spec.n_kv_heads, fixed, streamed, itemsize,
            fplan.aligned and do_aligned, device,
        )  # fmt: skip
    if has_queries and atomic:
        post = Launch(
            _attn_bwd_dq_convert_kernel, rows_grid, **dq_accum_args,
            **_strides("dq", seq_strides(grad_strides[0], spec)),
            n_heads=spec.n_heads, max_seqlen_q=spec.max_seqlen_q, total_q=total_q, softmax_scale=spec.softmax_scale,
            **rows_constexprs, UPCAST=UPCAST_DOTS, num_warps=PREPROCESS_WARPS,
        )  # fmt: skip
    elif has_queries:
        fixed = dict(
            **inputs, **_strides("dq", seq_strides(grad_strides[0], spec)), **lse_and_slopes, n_heads=spec.n_heads,
            **shared,
        )  # fmt: skip
        streamed = ((k_shape, fplan.k_strides), (k_shape, fplan.v_strides))
        post = _main_launch(
            "dq", spec, dq_config, spec.max_seqlen_q, spec.batch * spec.n_heads, fixed, streamed, itemsize,
            fplan.aligned, device,
        )  # fmt: skip
    return BackwardPlan(atomic, _dq_accum_shape(spec, q_shape[0]), pre, dkdv, post)


def attention_bwd(
    do: Optional[torch.Tensor],
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
    rng: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of attention_fwd's call on q, k, v (see ForwardPlan.backward); o and lse are
    read as contiguous tensors (as attention_fwd returns them); rng: the forward's dropout words."""
    plan = forward_plan(q, k, v, alibi_slopes, spec)
    return plan.backward(
        do, dlse, q, k, v, o.contiguous(), lse.contiguous(), alibi_slopes, cu_seqlens_q, cu_seqlens_k, grads,
        dkdv_config=dkdv_config, dq_config=dq_config, rng=rng,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Caches

_CALL_PLANS: List[PublishedCache] = []


def call_plan_cache() -> PublishedCache:
    """A cache of the public functions' plans (their checks' outcome and forward plan) by argument
    key, cleared with the launch plans."""
    cache = PublishedCache(PLANS)
    _CALL_PLANS.append(cache)
    return cache


def clear_plans() -> None:
    """Forget every plan and tuned choice (the next calls rebuild them, choosing configs again)."""
    for cache in _CALL_PLANS:
        cache.clear()
    layout_plan.cache_clear()
    _backward_plan.cache_clear()
    configs.clear()
