"""LayerNorm / RMSNorm / residual + dropout + norm: launchers, autograd and functional API."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .._autograd import differentiable_op
from .._compat import sm_count
from .._validation import (
    check_choice,
    check_device,
    check_float,
    check_int,
    check_normalized,
    check_optional_tensor,
    check_shape,
    check_tensor,
    normalized_shape_tuple,
)
from ..kernels.norm import (
    _norm_bwd_chunked_kernel,
    _norm_bwd_kernel,
    _norm_fwd_chunked_kernel,
    _norm_fwd_kernel,
    _norm_param_grad_kernel,
)

# Widest row one block holds (x, dy, w, dw, db of a row stay in registers in the backward).
MAX_SINGLE_BLOCK_COLS = 8192
# Rows per program when rows are narrow: about this many elements per tile.
ELEMENTS_PER_TILE = 4096
# Chunked rows: (rows, cols) of a tile, forward and backward.
FWD_CHUNK = (1, 4096)
BWD_CHUNK = (4, 1024)
# Persistent backward: warps per SM to aim at, which sets the programs. The 4096-wide bf16 tile
# takes 123 registers per thread at 8 warps (ptxas, sm_90): two such programs fill an SM; narrower
# tiles fit more. Measured on an H100 (Triton 3.6, the fused residual + LayerNorm backward with an
# fp32 residual stream): 16384 x 1024 rows take 0.110 ms with 4-row tiles over 8 warps at 16 warps
# per SM, 0.095 over 4 warps at 32; 8192 x 2048 (RMSNorm), 2-row tiles over 8 warps, 0.0955 at 16
# and 0.0941 at 32 (over 4 warps: 0.101-0.105).
BWD_WARPS_PER_SM = 32
# fp32 elements of the backward's tile per thread: more loads in flight per thread on rows up to
# BWD_WIDE_ROW columns (32 per thread), fewer registers beyond (16 per thread).
BWD_WIDE_ROW = 1024
# The parameter-gradient reduction: (partials, cols) per step of a program.
PARAM_GRAD_BLOCK = (64, 32)


class NormConfig(NamedTuple):
    chunked: bool
    block_m: int
    block_n: int
    num_warps: int


@functools.cache
def norm_config(n_cols: int, backward: bool) -> NormConfig:
    """Tile shape and warps for rows of n_cols: whole rows in one block up to 8192, else chunks."""
    if n_cols > MAX_SINGLE_BLOCK_COLS:
        block_m, block_n = BWD_CHUNK if backward else FWD_CHUNK
        return NormConfig(True, block_m, block_n, max(1, min(block_m * block_n // 512, 16)))
    block_n = 1 << max(n_cols - 1, 0).bit_length()
    block_m = max(1, min(ELEMENTS_PER_TILE // block_n, 64))
    # About 16 fp32 elements of each live tile per thread (32 in the backward of rows up to
    # BWD_WIDE_ROW): enough loads in flight, no spills.
    per_thread = 32 if backward and block_n <= BWD_WIDE_ROW else 16
    return NormConfig(False, block_m, block_n, max(1, min(block_m * block_n // (32 * per_thread), 16)))


@functools.lru_cache(maxsize=1024)
def _bwd_programs(n_rows: int, n_cols: int, device_index: int) -> int:
    cfg = norm_config(n_cols, True)
    per_sm = 1 if cfg.chunked else max(1, BWD_WARPS_PER_SM // cfg.num_warps)
    return max(1, min(-(-n_rows // cfg.block_m), sm_count(device_index) * per_sm))


def _as_int32(value: int) -> int:
    """The 32-bit word `value` (0 <= value < 2**32) as the signed int the kernel reinterprets."""
    return value - (value >> 31 << 32)


# The kernels' dropout arguments when there is no dropout (never read: HAS_DROPOUT is off).
NO_DROPOUT = (1.0, 0, 0, 0, 0)


def dropout_rng_args(p: float, seed: int, seed_offset: int) -> Tuple[float, int, int, int, int]:
    """(scale, threshold, seed_lo, seed_hi, offset) of the kernels' Philox dropout: an element is
    kept where the top 31 bits of its draw are >= threshold, then scaled by 1 / (1 - p)."""
    if p == 0.0:
        return NO_DROPOUT
    threshold = min(int(round(p * 2**31)), 2**31 - 1)
    scale = 1.0 / (1.0 - p) if p < 1.0 else 0.0
    lo, hi = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    return scale, threshold, _as_int32(lo), _as_int32(hi), _as_int32(seed_offset)


def _draw_seed() -> int:
    """A 63-bit seed from torch's default generator, so torch.manual_seed makes runs repeatable."""
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))


def _residual_out_dtype(x: Tensor, residual: Optional[Tensor], residual_in_fp32: bool) -> torch.dtype:
    if residual is not None:
        return residual.dtype
    return torch.float32 if residual_in_fp32 else x.dtype


def _stores_residual(x: Tensor, residual: Optional[Tensor], dropout_p: float, residual_in_fp32: bool) -> bool:
    """Whether the norm input differs from x and must be written out (else it is x itself)."""
    return residual is not None or dropout_p > 0.0 or _residual_out_dtype(x, residual, residual_in_fp32) != x.dtype


def _strides(t: Optional[Tensor]) -> Tuple[int, int]:
    return (0, 0) if t is None else t.stride()


def _empty(device) -> Tensor:
    return torch.empty(0, device=device)


def _alloc_forward(x, residual, dropout_p, residual_in_fp32, is_rms_norm):
    """y, residual_out (empty when the norm input is x itself) and the fp32 statistics
    ((2, rows): mean and rstd for LayerNorm; (1, rows): rstd for RMSNorm)."""
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if _stores_residual(x, residual, dropout_p, residual_in_fp32):
        residual_out = torch.empty(
            (n_rows, n_cols), dtype=_residual_out_dtype(x, residual, residual_in_fp32), device=x.device
        )
    else:
        residual_out = _empty(x.device)
    stats = torch.empty((1 if is_rms_norm else 2, n_rows), dtype=torch.float32, device=x.device)
    return y, residual_out, stats


def norm_forward(
    x: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    eps: float,
    weight_offset: float,
    is_rms_norm: bool,
    dropout_p: float,
    seed: int,
    seed_offset: int,
    residual_in_fp32: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, residual_out, stats, seed) of the (rows, cols) views x and residual.

    residual_out is empty when the norm input is x itself; stats holds (mean, rstd) per row
    (rstd only for RMSNorm); seed (a CPU int64 scalar) is the dropout seed used, drawn from
    torch's generator when seed < 0 and there is dropout.
    """
    y, residual_out, stats = _alloc_forward(x, residual, dropout_p, residual_in_fp32, is_rms_norm)
    if seed < 0 and dropout_p > 0.0:
        seed = _draw_seed()
    n_rows, n_cols = x.shape
    if n_rows:
        store_residual = residual_out.numel() > 0
        cfg = norm_config(n_cols, False)
        kernel = _norm_fwd_chunked_kernel if cfg.chunked else _norm_fwd_kernel
        kernel[((n_rows + cfg.block_m - 1) // cfg.block_m,)](
            x, residual, weight, bias, y, residual_out if store_residual else None, stats,
            *x.stride(), *_strides(residual),
            n_rows, n_cols, eps, weight_offset, *dropout_rng_args(dropout_p, seed, seed_offset),
            IS_RMS_NORM=is_rms_norm, HAS_RESIDUAL=residual is not None, HAS_DROPOUT=dropout_p > 0.0,
            STORE_RESIDUAL=store_residual, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, enable_fp_fusion=False,
        )  # fmt: skip
    return y, residual_out, stats, torch.tensor(seed, dtype=torch.int64)


def _norm_forward_fake(
    x, weight, bias, residual, eps, weight_offset, is_rms_norm, dropout_p, seed, seed_offset, residual_in_fp32
):
    return (*_alloc_forward(x, residual, dropout_p, residual_in_fp32, is_rms_norm), torch.empty((), dtype=torch.int64))


def _alloc_backward(s, weight, bias, x_dtype, residual_dtype, store_dresidual):
    n_rows, n_cols = s.shape
    dx = torch.empty((n_rows, n_cols), dtype=x_dtype, device=s.device)
    dresidual = (
        torch.empty((n_rows, n_cols), dtype=residual_dtype, device=s.device) if store_dresidual else _empty(s.device)
    )
    dw = _empty(s.device) if weight is None else torch.empty_like(weight)
    db = _empty(s.device) if bias is None else torch.empty_like(bias)
    return dx, dresidual, dw, db


def norm_backward(
    dy: Tensor,
    dresidual_out: Optional[Tensor],
    s: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    stats: Tensor,
    weight_offset: float,
    is_rms_norm: bool,
    dropout_p: float,
    seed: Tensor,
    seed_offset: int,
    x_dtype: torch.dtype,
    residual_dtype: torch.dtype,
    store_dresidual: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dresidual, dw, db) from dy, the residual-out gradient and the saved norm input s.

    dresidual is empty unless store_dresidual (otherwise the residual's gradient is dx itself);
    dw / db are empty when there is no weight / bias.
    """
    dx, dresidual, dw, db = _alloc_backward(s, weight, bias, x_dtype, residual_dtype, store_dresidual)
    n_rows, n_cols = s.shape
    if n_rows == 0:
        if weight is not None:
            dw.zero_()
        if bias is not None:
            db.zero_()
        return dx, dresidual, dw, db
    cfg = norm_config(n_cols, True)
    programs = _bwd_programs(n_rows, n_cols, s.device.index or 0)
    # One fp32 row per program, written by it (every program has at least one row tile).
    partial_dw = None if weight is None else torch.empty((programs, n_cols), dtype=torch.float32, device=s.device)
    partial_db = None if bias is None else torch.empty((programs, n_cols), dtype=torch.float32, device=s.device)
    rng = dropout_rng_args(dropout_p, int(seed), seed_offset) if dropout_p > 0.0 else NO_DROPOUT
    kernel = _norm_bwd_chunked_kernel if cfg.chunked else _norm_bwd_kernel
    kernel[(programs,)](
        s, dy, dresidual_out, weight, stats, dx, dresidual if store_dresidual else None, partial_dw, partial_db,
        *s.stride(), *dy.stride(), *_strides(dresidual_out),
        n_rows, n_cols, weight_offset, *rng,
        IS_RMS_NORM=is_rms_norm, HAS_DRES_OUT=dresidual_out is not None, STORE_DRES=store_dresidual,
        HAS_DROPOUT=dropout_p > 0.0, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, enable_fp_fusion=False,
    )  # fmt: skip
    if weight is not None or bias is not None:
        block_p, block_n = PARAM_GRAD_BLOCK
        _norm_param_grad_kernel[((n_cols + block_n - 1) // block_n,)](
            partial_dw, partial_db, dw if weight is not None else None, db if bias is not None else None,
            programs, n_cols,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK_P=block_p, BLOCK_N=block_n, num_warps=4,
        )  # fmt: skip
    return dx, dresidual, dw, db


def _norm_backward_fake(
    dy, dresidual_out, s, weight, bias, stats, weight_offset, is_rms_norm, dropout_p, seed, seed_offset,
    x_dtype, residual_dtype, store_dresidual,
):  # fmt: skip
    return _alloc_backward(s, weight, bias, x_dtype, residual_dtype, store_dresidual)


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual, _, ctx.weight_offset, ctx.is_rms_norm, ctx.dropout_p, _, ctx.seed_offset, _ = inputs
    _, residual_out, stats, seed = output
    # The norm input: the stored residual, or x itself.
    ctx.save_for_backward(residual_out if residual_out.numel() else x, weight, bias, stats, seed)
    ctx.x_dtype = x.dtype
    ctx.has_residual = residual is not None
    ctx.residual_dtype = residual.dtype if residual is not None else residual_out.dtype
    ctx.has_residual_out = residual_out.numel() > 0


def _backward_rule(ctx, grads, backward, eager):
    dy, dresidual_out = grads[0], grads[1]
    s, weight, bias, stats, seed = ctx.saved_tensors
    if dy is None:  # only the new residual was used: a zero gradient that occupies no memory
        dy = s.new_zeros((), dtype=ctx.x_dtype).expand(s.shape)
    if not ctx.has_residual_out:
        dresidual_out = None
    # The residual gets its own gradient tensor when it differs from dx (dropout or dtype).
    store_dresidual = ctx.has_residual and (ctx.dropout_p > 0.0 or ctx.residual_dtype != ctx.x_dtype)
    dx, dresidual, dw, db = backward(
        dy, dresidual_out, s, weight, bias, stats, ctx.weight_offset, ctx.is_rms_norm, ctx.dropout_p, seed,
        ctx.seed_offset, ctx.x_dtype, ctx.residual_dtype, store_dresidual,
    )  # fmt: skip
    if ctx.has_residual and not store_dresidual:
        dresidual = dx
    return (
        dx,
        dw if weight is not None else None,
        db if bias is not None else None,
        dresidual if ctx.has_residual else None,
        *([None] * 7),
    )


NormFunction, _norm_apply = differentiable_op(
    "norm",
    forward=norm_forward,
    fake_forward=_norm_forward_fake,
    backward=norm_backward,
    fake_backward=_norm_backward_fake,
    setup_context=_setup_context,
    backward_rule=_backward_rule,
    n_differentiable_outputs=2,
    differentiable_args=(0, 1, 2, 3),
    # It may draw its dropout seed: two calls with equal arguments are not the same computation.
    forward_tags=(torch.Tag.nondeterministic_seeded,),
)


def _rows(t: Optional[Tensor], n_cols: int) -> Optional[Tensor]:
    """(rows, n_cols) view of t (a copy only when none exists); None stays None."""
    if t is None or t.dim() == 2:
        return t
    return t.reshape(t.numel() // n_cols, n_cols)


def _flat(t: Optional[Tensor], n_cols: int) -> Optional[Tensor]:
    return t if t is None or t.dim() == 1 else t.reshape(n_cols)


def _check_param(name: str, value: Optional[Tensor], normalized_shape: Tuple[int, ...]) -> Optional[Tensor]:
    check_optional_tensor(name, value)
    if value is not None:
        check_shape(name, value, normalized_shape, "normalized_shape")
    return value


def _run(
    x: Tensor,
    normalized_shape,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    eps: float,
    weight_offset: float,
    is_rms_norm: bool,
    dropout_p: float,
    seed: Optional[int],
    seed_offset: int,
    residual_in_fp32: bool,
) -> Tuple[Tensor, Tensor]:
    """Checks, then the fused op; returns (y, new residual) in x's shape."""
    check_tensor("x", x)
    shape = normalized_shape_tuple(normalized_shape)
    n_cols = check_normalized(x, shape)
    _check_param("weight", weight, shape)
    _check_param("bias", bias, shape)
    check_optional_tensor("residual", residual)
    if residual is not None:
        check_shape("residual", residual, x.shape, "x's shape")
    check_float("eps", eps, 0.0, math.inf)
    check_float("p", dropout_p, 0.0, 1.0)
    seed = -1 if seed is None else check_int("seed", seed, 0)
    if check_int("seed_offset", seed_offset, 0) >= 2**32:
        raise ValueError(f"seed_offset={seed_offset} must be < 2**32")
    if seed >= 2**63:
        raise ValueError(f"seed={seed} must be < 2**63")
    check_device(x=x, weight=weight, bias=bias, residual=residual)
    y, residual_out, _, _ = _norm_apply(
        _rows(x, n_cols), _flat(weight, n_cols), _flat(bias, n_cols), _rows(residual, n_cols),
        float(eps), float(weight_offset), is_rms_norm, float(dropout_p), seed, seed_offset, residual_in_fp32,
    )  # fmt: skip
    if x.dim() != 2:
        y = y.view(x.shape)
        residual_out = residual_out.view(x.shape) if residual_out.numel() or x.numel() == 0 else x
    elif not residual_out.numel() and x.numel():
        residual_out = x
    return y, residual_out


def layer_norm(
    x: Tensor,
    normalized_shape: Union[int, Sequence[int]],
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
) -> Tensor:
    """LayerNorm over the trailing `normalized_shape` dims of x, differentiable (F.layer_norm).

    x: (..., *normalized_shape), fp32/fp16/bf16, any strides, on a CUDA device (the CPU under
    TRITON_INTERPRET=1). weight, bias: normalized_shape, any float dtype, optional.
    Returns x's shape and dtype; mean and variance are fp32.
    """
    return _run(x, normalized_shape, weight, bias, None, eps, 0.0, False, 0.0, None, 0, False)[0]


def rms_norm(
    x: Tensor,
    normalized_shape: Union[int, Sequence[int]],
    weight: Optional[Tensor] = None,
    eps: Optional[float] = None,
    *,
    offset: float = 0.0,
) -> Tensor:
    """RMSNorm over the trailing `normalized_shape` dims of x, differentiable (F.rms_norm).

    x: (..., *normalized_shape), fp32/fp16/bf16, any strides. weight: normalized_shape, optional.
    eps: None uses torch.finfo(x.dtype).eps, as torch does. offset: y = x * rstd * (offset + weight)
    (offset=1.0 is the Gemma-style `1 + w` form). Returns x's shape and dtype.
    """
    check_tensor("x", x)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    check_float("offset", offset, -math.inf, math.inf)
    return _run(x, normalized_shape, weight, None, None, eps, offset, True, 0.0, None, 0, False)[0]


def add_dropout_norm(
    x: Tensor,
    residual: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor] = None,
    p: float = 0.0,
    *,
    prenorm: bool = True,
    norm: str = "layernorm",
    eps: float = 1e-5,
    offset: float = 0.0,
    residual_in_fp32: bool = False,
    seed: Optional[int] = None,
    seed_offset: int = 0,
) -> Tuple[Tensor, Tensor]:
    """Fused `s = dropout(x, p) + residual; y = norm(s)`, as in flash-attention's training blocks.

    x: (..., hidden), fp32/fp16/bf16. residual: x's shape, any float dtype, or None (first block).
    weight, bias: (hidden,), optional. norm: "layernorm" or "rmsnorm" (offset as in rms_norm).
    Returns (y, new_residual):
    - y: norm(s) in x's dtype;
    - prenorm=True: new_residual = s, in residual's dtype (fp32 when residual is None and
      residual_in_fp32, else x's dtype), for the next block's residual stream;
    - prenorm=False (post-norm): new_residual = y, the normalized sum carries the stream.
    The dropout mask is drawn from Philox keyed by `seed` (None: drawn from torch's generator,
    so torch.manual_seed repeats it) at counter offset `seed_offset`; the backward regenerates it,
    nothing is stored. Same seed and offset, same mask.
    """
    check_choice("norm", norm, ("layernorm", "rmsnorm"))
    y, residual_out = _run(
        x, x.shape[-1:] if isinstance(x, Tensor) else 1, weight, bias, residual, eps, offset, norm == "rmsnorm",
        p, seed, seed_offset, residual_in_fp32,
    )  # fmt: skip
    return (y, residual_out) if prenorm else (y, y)
