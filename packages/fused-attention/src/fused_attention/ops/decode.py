"""Decoding attention against a KV cache: checks, launch plans, the launcher and the public function.

`flash_attention_with_kvcache` attends a few new queries per sequence to a preallocated
(B, S_max, H_kv, D) key/value cache, optionally appending the new keys and values in the same
launch, rotary embedding of the new queries and keys included (kernels/decode.py). The cache
length is split over several programs when the batch and heads alone would leave streaming
multiprocessors idle (flash-decoding); a second kernel then combines the splits.

Host path: the argument checks' outcome is cached per combination of shapes, dtypes, devices and
options, and the launch plan (splits, blocks, grid and every integer argument, as Launch objects)
per spec, strides and device; a call then allocates its output (and, when split, the fp32
partials) and launches. The launcher is the custom op `fused_attention::decode` (it mutates the
caches) while torch.compile traces, and a plain call otherwise.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional, Tuple

import torch

from .._compat import UPCAST_DOTS
from .._runtime.compat import autocast_dtype, is_compiling, multiprocessor_count
from .._runtime.launch import Launch
from .._runtime.registration import custom_op
from .._runtime.validation import FLOAT_DTYPES, check_int, check_ndim, check_same_dtype, check_shape
from .._validation import (
    ATTENTION_DTYPES,
    check_alibi_slopes,
    check_bool,
    check_device,
    check_heads,
    check_softmax_scale,
    check_tensor,
    check_window,
)
from ..kernels.decode import _decode_combine_kernel, _decode_split_kernel

# Splits of one (batch, key/value head) at most: the combine kernel holds them in one tile.
MAX_SPLITS = 64
# flash-attn's rule: programs on most SMs already stream the cache at the memory's pace, and
# splitting only adds the combine.
BUSY_FRACTION = 0.8
# The combine kernel's cost in the split model's unit, one key block streamed by a program: on an
# H100 a block took about 0.9 us of a lone program and the combine's launch about 2 us.
COMBINE_BLOCKS = 2


class DecodeSpec(NamedTuple):
    """One call's shapes and options (what the checks decide; a tuple so it hashes fast)."""

    batch: int
    seqlen_q: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    capacity: int  # S_max, the cache's positions
    softmax_scale: float
    window_left: int  # -1: unbounded
    window_right: int  # -1: unbounded; causal is 0
    has_alibi: bool
    has_new: bool
    rotary_dim: int  # 0: no rotary embedding
    num_splits: int  # 0: chosen by the plan

    @property
    def block_d(self) -> int:
        return 1 << (self.head_dim - 1).bit_length()

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads


class DecodePlan(NamedTuple):
    split: Launch
    combine: Optional[Launch]  # None with one split: the split kernel writes the output
    n_splits: int
    partial_rows: int  # B * H * S_q


def block_sizes(spec: DecodeSpec) -> Tuple[int, int]:
    """(BLOCK_M, BLOCK_N): query rows (the GQA group's heads times S_q, padded to a power of two of
    at least 16, the smallest dot) and keys per block; smaller for head dims above 128, whose
    fp32 accumulator rows are twice as wide."""
    wide = spec.block_d > 128
    rows = spec.group * spec.seqlen_q
    block_m = min(max(16, 1 << max(rows - 1, 0).bit_length()), 32 if wide else 64)
    return block_m, 32 if wide else 64


def choose_splits(programs: int, capacity: int, block_n: int, sm_count: int) -> int:
    """Splits of the cache length per program (`programs`: batch x key/value heads x row blocks):
    1 when the programs fill most SMs; else the count with the least modelled time, waves x key
    blocks per split, plus COMBINE_BLOCKS when split; the fewer splits on a tie. At most one per
    block of the cache, sm_count and MAX_SPLITS. On an H100 (batch 1 and 4, 16 and 32 query heads,
    caches 256-4096) its choice was within 0.4 us of the best count measured."""
    n_blocks = max(1, -(-capacity // block_n))
    programs = max(1, programs)
    if programs >= BUSY_FRACTION * sm_count:
        return 1
    best, best_cost = 1, None
    for splits in range(1, max(1, min(MAX_SPLITS, sm_count, n_blocks)) + 1):
        waves = -(-programs * splits // sm_count)
        cost = waves * -(-n_blocks // splits) + (COMBINE_BLOCKS if splits > 1 else 0)
        if best_cost is None or cost < best_cost:
            best, best_cost = splits, cost
    return best


def _strides3(t: Optional[torch.Tensor]) -> Tuple[int, int, int]:
    """(batch, position, head) strides of a (B, S, H, D) tensor; zeros for an absent one."""
    return (0, 0, 0) if t is None else t.stride()[:3]


def _slope_strides(alibi_slopes: Optional[torch.Tensor]) -> Tuple[int, int]:
    if alibi_slopes is None:
        return 0, 0
    if alibi_slopes.dim() == 1:
        return 0, alibi_slopes.stride(0)
    return alibi_slopes.stride(0), alibi_slopes.stride(1)


@functools.lru_cache(maxsize=1024)
def _plan(spec: DecodeSpec, strides: tuple, device: torch.device) -> DecodePlan:
    """The launches of one spec; strides: (q, k_cache, v_cache, k_new, v_new, out) as
    (batch, position, head) triples, the slopes' (batch, head), the rotary tables' row strides."""
    block_m, block_n = block_sizes(spec)
    m_blocks = -(-(spec.group * spec.seqlen_q) // block_m)
    programs = spec.batch * spec.n_kv_heads * m_blocks
    n_splits = spec.num_splits or choose_splits(programs, spec.capacity, block_n, multiprocessor_count(device))
    q_s, kc_s, vc_s, kn_s, vn_s, o_s, slope_s, rotary_s = strides
    split = Launch(
        _decode_split_kernel, (n_splits, spec.batch * spec.n_kv_heads, m_blocks), num_warps=4,
        stride_qb=q_s[0], stride_qs=q_s[1], stride_qh=q_s[2],
        stride_kb=kc_s[0], stride_ks=kc_s[1], stride_kh=kc_s[2],
        stride_vb=vc_s[0], stride_vs=vc_s[1], stride_vh=vc_s[2],
        stride_knb=kn_s[0], stride_kns=kn_s[1], stride_knh=kn_s[2],
        stride_vnb=vn_s[0], stride_vns=vn_s[1], stride_vnh=vn_s[2],
        stride_ob=o_s[0], stride_os=o_s[1], stride_oh=o_s[2],
        stride_slope_b=slope_s[0], stride_slope_h=slope_s[1], stride_cos=rotary_s[0], stride_sin=rotary_s[1],
        n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads, seqlen_q=spec.seqlen_q, capacity=spec.capacity,
        softmax_scale=spec.softmax_scale, window_left=spec.window_left, window_right=spec.window_right,
        HEAD_DIM=spec.head_dim, BLOCK_D=spec.block_d, GROUP=spec.group, BLOCK_M=block_m, BLOCK_N=block_n,
        N_SPLITS=n_splits, HAS_NEW=spec.has_new, HAS_LEFT=spec.window_left >= 0, HAS_RIGHT=spec.window_right >= 0,
        ALIBI=spec.has_alibi, ROTARY_DIM=spec.rotary_dim, UPCAST=UPCAST_DOTS,
    )  # fmt: skip
    partial_rows = spec.batch * spec.n_heads * spec.seqlen_q
    combine = None
    if n_splits > 1:
        block_s = 1 << (n_splits - 1).bit_length()
        combine = Launch(
            _decode_combine_kernel, (partial_rows,), num_warps=max(1, min(4, block_s * spec.block_d // 256)),
            stride_ob=o_s[0], stride_os=o_s[1], stride_oh=o_s[2], n_heads=spec.n_heads, seqlen_q=spec.seqlen_q,
            HEAD_DIM=spec.head_dim, BLOCK_D=spec.block_d, N_SPLITS=n_splits, BLOCK_S=block_s, UPCAST=UPCAST_DOTS,
        )  # fmt: skip
    return DecodePlan(split, combine, n_splits, partial_rows)


def _spec_of(q, k_cache, k_new, alibi_slopes, rotary_cos, softmax_scale, window_left, window_right,
             num_splits) -> DecodeSpec:  # fmt: skip
    batch, seqlen_q, n_heads, head_dim = q.shape
    return DecodeSpec(
        batch, seqlen_q, n_heads, k_cache.shape[2], head_dim, k_cache.shape[1], softmax_scale, window_left,
        window_right, alibi_slopes is not None, k_new is not None, 0 if rotary_cos is None else rotary_cos.shape[1],
        num_splits,
    )  # fmt: skip


def _decode_fake(q, k_cache, v_cache, cache_seqlens, k_new, v_new, alibi_slopes, rotary_cos, rotary_sin,
                 softmax_scale, window_left, window_right, num_splits) -> torch.Tensor:  # fmt: skip
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


@custom_op("fused_attention::decode", fake=_decode_fake, mutates_args=("k_cache", "v_cache"))
def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    k_new: Optional[torch.Tensor],
    v_new: Optional[torch.Tensor],
    alibi_slopes: Optional[torch.Tensor],
    rotary_cos: Optional[torch.Tensor],
    rotary_sin: Optional[torch.Tensor],
    softmax_scale: float,
    window_left: int,
    window_right: int,
    num_splits: int,
) -> torch.Tensor:
    """The launcher (arguments checked, q/k_new/v_new and the rotary tables with a unit-stride last
    dim): the output (B, S_q, H, D) in q's dtype; k_new/v_new written into the caches at cache_seqlens."""
    spec = _spec_of(q, k_cache, k_new, alibi_slopes, rotary_cos, softmax_scale, window_left, window_right, num_splits)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    strides = (
        _strides3(q), _strides3(k_cache), _strides3(v_cache), _strides3(k_new), _strides3(v_new), _strides3(out),
        _slope_strides(alibi_slopes), (0, 0) if rotary_cos is None else (rotary_cos.stride(0), rotary_sin.stride(0)),
    )  # fmt: skip
    plan = _plan(spec, strides, q.device)
    if plan.combine is None:
        plan.split(q, k_cache, v_cache, cache_seqlens, k_new, v_new, alibi_slopes, rotary_cos, rotary_sin, out, None,
                   None)  # fmt: skip
        return out
    o_part = torch.empty((plan.partial_rows, plan.n_splits, spec.head_dim), dtype=torch.float32, device=q.device)
    lse_part = torch.empty((plan.partial_rows, plan.n_splits), dtype=torch.float32, device=q.device)
    plan.split(q, k_cache, v_cache, cache_seqlens, k_new, v_new, alibi_slopes, rotary_cos, rotary_sin, out, o_part,
               lse_part)  # fmt: skip
    plan.combine(o_part, lse_part, out)
    return out


def _check_cache(name: str, cache, q: torch.Tensor) -> None:
    check_tensor(name, cache, ATTENTION_DTYPES)
    check_same_dtype("q", q, **{name: cache})
    check_ndim(name, cache, (4,), "(B, S_max, H_kv, D)")
    if cache.shape[0] != q.shape[0]:
        raise ValueError(f"{name} has batch {cache.shape[0]} but q has {q.shape[0]}")
    if cache.stride(-1) != 1 and cache.numel() > 0:
        raise ValueError(
            f"{name} must have a unit-stride head dim (it is read and written in place), got strides {cache.stride()}"
        )


def _check_new(name: str, value, q: torch.Tensor, k_cache: torch.Tensor) -> None:
    check_tensor(name, value, ATTENTION_DTYPES)
    check_same_dtype("q", q, **{name: value})
    check_shape(name, value, (q.shape[0], q.shape[1], k_cache.shape[2], k_cache.shape[3]), "(B, S_q, H_kv, D)")


def _check_rotary(rotary_cos, rotary_sin, k_new, head_dim: int, capacity: int) -> None:
    """rotary_cos and rotary_sin: together, with k_new, (positions >= S_max, rotary_dim) of one shape."""
    if rotary_cos is None and rotary_sin is None:
        return
    if (rotary_cos is None) != (rotary_sin is None):
        given = "rotary_cos" if rotary_sin is None else "rotary_sin"
        raise ValueError(f"rotary_cos and rotary_sin must be given together, got {given} alone")
    for name, table in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        check_tensor(name, table, FLOAT_DTYPES)
        check_ndim(name, table, (2,), "(positions, rotary_dim)")
    if rotary_sin.shape != rotary_cos.shape:
        raise ValueError(
            f"rotary_sin must have rotary_cos's shape {tuple(rotary_cos.shape)}, got {tuple(rotary_sin.shape)}"
        )
    positions, rotary_dim = rotary_cos.shape
    if rotary_dim % 2 or not 2 <= rotary_dim <= head_dim:
        raise ValueError(
            f"rotary_cos has {rotary_dim} columns; expected an even rotary_dim from 2 to the head dim {head_dim}"
        )
    if positions < capacity:
        raise ValueError(
            f"rotary_cos has {positions} positions but the cache has {capacity} (k_cache's dim 1): each position a new "
            "token can take needs a row"
        )
    if k_new is None:
        raise ValueError("rotary_cos and rotary_sin rotate the new queries and keys: give k_new and v_new with them")


def _check(q, k_cache, v_cache, cache_seqlens, k_new, v_new, rotary_cos, rotary_sin, causal, alibi_slopes,
           window_size, softmax_scale, num_splits) -> Tuple[float, int, int, int]:  # fmt: skip
    """Every argument check, in argument order, then the devices: (scale, left, right, num_splits)."""
    check_tensor("q", q, ATTENTION_DTYPES)
    check_ndim("q", q, (4,), "(B, S_q, H, D)")
    _check_cache("k_cache", k_cache, q)
    _check_cache("v_cache", v_cache, q)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    batch, seqlen_q, n_heads, head_dim = q.shape
    capacity, n_kv_heads = k_cache.shape[1], k_cache.shape[2]
    check_heads(n_heads, n_kv_heads, k_cache.shape[3], v_cache.shape[3])
    if head_dim != k_cache.shape[3]:
        raise ValueError(f"q has head dim {head_dim} but k_cache has {k_cache.shape[3]}")
    check_tensor("cache_seqlens", cache_seqlens, (torch.int32,))
    check_shape("cache_seqlens", cache_seqlens, (batch,), "one length per batch row")
    if (k_new is None) != (v_new is None):
        raise ValueError(f"k_new and v_new must be given together, got {'k_new' if v_new is None else 'v_new'} alone")
    if k_new is not None:
        _check_new("k_new", k_new, q, k_cache)
        _check_new("v_new", v_new, q, k_cache)
        if seqlen_q > capacity:
            raise ValueError(f"k_new holds {seqlen_q} positions but the cache only {capacity} (k_cache's dim 1)")
    _check_rotary(rotary_cos, rotary_sin, k_new, head_dim, capacity)
    check_bool("causal", causal)
    window_left, window_right = check_window(window_size, causal, seqlen_q, capacity)
    check_alibi_slopes(alibi_slopes, batch, n_heads)
    scale = check_softmax_scale(softmax_scale, head_dim)
    num_splits = check_int("num_splits", num_splits, 0, MAX_SPLITS)
    check_device(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens, k_new=k_new, v_new=v_new,
                 rotary_cos=rotary_cos, rotary_sin=rotary_sin, alibi_slopes=alibi_slopes)  # fmt: skip
    return scale, window_left, window_right, num_splits


# Checked argument combinations (bounded: cleared when full).
_CHECKED: dict = {}
_MAX_CHECKED = 4096


def _describe(t):
    return None if t is None else (t.shape, t.dtype, t.device, t.stride(-1) if t.dim() else None)


def _checked(q, k_cache, v_cache, cache_seqlens, k_new, v_new, rotary_cos, rotary_sin, causal, alibi_slopes,
             window_size, softmax_scale, num_splits) -> Tuple[float, int, int, int]:  # fmt: skip
    """_check's outcome, cached by everything it reads (option types too, so that a bool where an int
    belongs is not let through by an equal cached key). Run as is while torch.compile traces."""
    args = (q, k_cache, v_cache, cache_seqlens, k_new, v_new, rotary_cos, rotary_sin, causal, alibi_slopes,
            window_size, softmax_scale, num_splits)  # fmt: skip
    if is_compiling():
        return _check(*args)
    try:
        key = (
            _describe(q), _describe(k_cache), _describe(v_cache), _describe(cache_seqlens), _describe(k_new),
            _describe(v_new), _describe(rotary_cos), _describe(rotary_sin), _describe(alibi_slopes), causal,
            causal.__class__, window_size, window_size.__class__, window_size[0].__class__, window_size[1].__class__,
            softmax_scale, softmax_scale.__class__, num_splits, num_splits.__class__,
        )  # fmt: skip
        result = _CHECKED.get(key)
    except Exception:  # a non-tensor or an unhashable option: the checks name the culprit
        key = result = None
    if result is None:
        result = _check(*args)
        if key is not None:
            if len(_CHECKED) >= _MAX_CHECKED:
                _CHECKED.clear()
            _CHECKED[key] = result
    return result


def _autocast_inputs(q, k_new, v_new):
    """Under torch.autocast, fp32 q / k_new / v_new are cast to the autocast dtype (the cache, written
    in place, must already have it)."""
    if isinstance(q, torch.Tensor) and q.dtype == torch.float32:
        dtype = autocast_dtype(q.device.type)
        if dtype in ATTENTION_DTYPES:
            cast = [
                t.to(dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t
                for t in (q, k_new, v_new)
            ]
            return tuple(cast)
    return q, k_new, v_new


def _unit_stride(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def flash_attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    k_new: Optional[torch.Tensor] = None,
    v_new: Optional[torch.Tensor] = None,
    *,
    rotary_cos: Optional[torch.Tensor] = None,
    rotary_sin: Optional[torch.Tensor] = None,
    causal: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    window_size: Tuple[int, int] = (-1, -1),
    softmax_scale: Optional[float] = None,
    num_splits: int = 0,
) -> torch.Tensor:
    """Attention of a few new queries to a key/value cache, appending new keys and values in place.

    q: (B, S_q, H, D), fp16 or bf16, S_q small (one new token, or a few); any strides.
    k_cache, v_cache: (B, S_max, H_kv, D), q's dtype, unit-stride head dim (written in place);
        H a multiple of H_kv (GQA/MQA: the query heads of a key/value head share its loads).
        D in 16, 32, 64, 80, 96, 128, 160, 192, 256.
    cache_seqlens: int32 (B,): the keys already in each row's cache, positions 0 ... len - 1.
    k_new, v_new: optional (B, S_q, H_kv, D): written into the caches at positions
        cache_seqlens ... cache_seqlens + S_q - 1 and attended to with them. cache_seqlens is not
        advanced: the caller adds S_q after the call (after every layer, for a model).
    rotary_cos, rotary_sin: optional (positions >= S_max, rotary_dim) tables, fp32/fp16/bf16, with
        k_new: the new queries and keys are rotated rotate-half (GPT-NeoX / LLaMA pairs j and
        j + rotary_dim / 2; columns from rotary_dim on pass through) at their positions,
        cache_seqlens + i, before they attend and before the keys enter the cache, in fp32 and
        rounded once (fused_rope's tables and arithmetic; one launch instead of two). The query's
        rotation waits for its table rows before the cache streams: on an H100 (batch 1, 16 heads,
        512 keys) the call took 1.5 us longer, about what a separate rotary launch costs.
    causal: the queries sit at the last S_q positions of the keys (bottom-right): query i sees
        positions below cache_seqlens + i + 1 with k_new, below cache_seqlens - S_q + i + 1 without.
    alibi_slopes: fp32 (H,) or (B, H): adds -slope * |query position - key position|.
    window_size: (left, right): query at position p sees keys p - left ... p + right; -1 unbounded.
    softmax_scale: default 1 / sqrt(D).
    num_splits: splits of the cache length per (row, key/value head); 0 chooses from the batch,
        heads, S_max and the SM count (1 when they fill the GPU already); at most 64.

    Returns out (B, S_q, H, D) in q's dtype, contiguous. A query that sees no key gets 0.

    cache_seqlens is read on the device only (no host sync): a length outside
    [0, S_max - (S_q if k_new else 0)] is clamped into that range, so the kernels never address
    memory outside the caches, and that row's output is the clamped length's. Not differentiable
    (inference); under torch.autocast, fp32 q / k_new / v_new are cast to the autocast dtype.
    """
    q, k_new, v_new = _autocast_inputs(q, k_new, v_new)
    scale, left, right, num_splits = _checked(
        q, k_cache, v_cache, cache_seqlens, k_new, v_new, rotary_cos, rotary_sin, causal, alibi_slopes, window_size,
        softmax_scale, num_splits,
    )  # fmt: skip
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k_new, v_new, k_cache, v_cache)):
        raise ValueError(
            "flash_attention_with_kvcache is not differentiable: call it under torch.no_grad() or "
            "torch.inference_mode() (an input requires grad)"
        )
    q, k_new, v_new = _unit_stride(q), _unit_stride(k_new), _unit_stride(v_new)
    rotary_cos, rotary_sin = _unit_stride(rotary_cos), _unit_stride(rotary_sin)
    return decode_attention(q, k_cache, v_cache, cache_seqlens, k_new, v_new, alibi_slopes, rotary_cos, rotary_sin,
                            scale, left, right, num_splits)  # fmt: skip
