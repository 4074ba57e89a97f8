"""LayerNorm / RMSNorm / residual + dropout + norm: plans, launchers, autograd and functional API.

Two differentiable ops share the kernels: `norm` (y = norm(x), the plain layer_norm / rms_norm)
and `add_dropout_norm` (s = dropout(x) + residual, y = norm(s), s stored). Per call, a launcher
looks up one plan (a cached function of everything the launch depends on: shapes, strides,
dtypes, devices and options; building it checks the arguments), allocates what it returns and
calls the plan's Launch objects. The dropout's seed and offset travel from the forward kernel to
the backward kernel in the statistics buffer, so nothing goes through the host between them.
"""

from __future__ import annotations

import functools
import math
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .._runtime.compat import is_compiling, multiprocessor_count
from .._runtime.dropout import check_seed, dropout_rng, dropout_threshold_and_scale
from .._runtime.launch import Launch
from .._runtime.registration import differentiable_op
from .._runtime.validation import FLOAT_DTYPES, dtype_names
from .._validation import (
    cached_plan,
    check_choice,
    check_device,
    check_float,
    check_normalized,
    check_shape,
    check_tensor,
    normalized_shape_tuple,
    stand_in,
)
from ..kernels.norm import (
    _norm_bwd_chunked_kernel,
    _norm_bwd_kernel,
    _norm_fwd_chunked_kernel,
    _norm_fwd_kernel,
    _norm_param_grad_kernel,
)

# The norm kernels compile without FMA contraction (enable_fp_fusion=False): a quantity and the mean
# it is compared with round alike, so a width-1 or constant row normalizes to exactly 0.
FMA_CONTRACTION = False
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
# A backward over at most this many elements (of rows held whole in one block) runs as one
# program, whose register sums are the parameter gradients: no partial buffer, no second launch.
# One SM reads 64K bf16 elements of x and dy in a few microseconds, less than a launch's host
# time (which autograd's device thread makes larger still, about 12 us per launch on an H100 host).
ONE_PROGRAM_ELEMENTS = 65536
# int32 words after the statistics when there is dropout: the seed's two words and the offset.
RNG_WORDS = 3
NORMS = ("layernorm", "rmsnorm")


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


def _bwd_programs(n_rows: int, n_cols: int, device: torch.device) -> int:
    cfg = norm_config(n_cols, True)
    if not cfg.chunked and n_rows * n_cols <= ONE_PROGRAM_ELEMENTS:
        return 1
    per_sm = 1 if cfg.chunked else max(1, BWD_WARPS_PER_SM // cfg.num_warps)
    return max(1, min(-(-n_rows // cfg.block_m), multiprocessor_count(device) * per_sm))


def _rows_strides(shape: Sequence[int], strides: Sequence[int], n_cols: int) -> Optional[Tuple[int, int]]:
    """(row stride, col stride) of a tensor seen as (numel / n_cols, n_cols) rows without a copy,
    or None when no such view exists."""
    n_rows = math.prod(shape) // n_cols if n_cols else 0
    try:
        view = torch.empty_strided(tuple(shape), tuple(strides), device="meta").view(n_rows, n_cols)
    except RuntimeError:
        return None
    return view.stride()


def _is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    return torch.empty_strided(tuple(shape), tuple(strides), device="meta").is_contiguous()


def _param_key(t: Optional[Tensor]):
    """What a weight or bias contributes to a forward plan's key."""
    return None if t is None else (t.shape, t.dtype, t.device, t.is_contiguous())


def _contiguity(t: Optional[Tensor]) -> Optional[bool]:
    """What a weight or bias contributes to a backward plan's key (its shape and dtype were checked)."""
    return None if t is None else t.is_contiguous()


def _require_tensors(x, weight, bias, residual=None) -> None:
    """Tensors (or None) before autograd reads them; their dtypes and shapes are the plan's checks."""
    if not isinstance(x, Tensor):
        check_tensor("x", x)
    if weight is not None and not isinstance(weight, Tensor):
        check_tensor("weight", weight)
    if bias is not None and not isinstance(bias, Tensor):
        check_tensor("bias", bias)
    if residual is not None and not isinstance(residual, Tensor):
        check_tensor("residual", residual)


def _hashable_shape(normalized_shape):
    return tuple(normalized_shape) if isinstance(normalized_shape, list) else normalized_shape


# Forward --------------------------------------------------------------------------------------


class ForwardPlan(NamedTuple):
    """One forward call's launch and allocations, for one key of shapes, strides, dtypes and options."""

    launch: Optional[Launch]  # None when there are no rows
    shape: torch.Size  # of x, y and the stored residual
    dtype: torch.dtype  # of x
    y_dtype: torch.dtype  # of y: x's, or the out_dtype asked for
    y_like_x: bool  # x is contiguous: y = empty_like(x)
    x_rows: Optional[Tuple[int, int]]  # (rows, cols) to copy x into when its strides do not map to rows
    residual_rows: Optional[Tuple[int, int]]  # the same for the residual
    flat_params: bool  # a weight or bias is not contiguous: pass a contiguous copy
    stats_numel: int
    residual_out_dtype: Optional[torch.dtype]  # the stored norm input's dtype (add_dropout_norm)
    dropout: bool


def _device_of(key, index: int):
    return None if key is None else key[index]


def _check_param(name: str, key, shape: Tuple[int, ...]) -> None:
    if key is not None:
        param = check_tensor(name, stand_in(key[0], key[1]))
        check_shape(name, param, shape, "normalized_shape")


@functools.lru_cache(maxsize=1024)
def _forward_plan(
    shape, strides, dtype, device, weight, bias, residual, normalized_shape, eps, weight_offset, is_rms_norm,
    dropout_p, residual_in_fp32, out_dtype=None,
) -> ForwardPlan:  # fmt: skip
    """The plan of a forward call; raises on invalid arguments (never cached then).

    weight, bias: _param_key of each; residual: (shape, strides, dtype, device) or None;
    normalized_shape None: x's last dim (add_dropout_norm); out_dtype None: y in x's dtype.
    """
    check_tensor("x", stand_in((), dtype))
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"out_dtype must be None or one of {dtype_names(FLOAT_DTYPES)}, got {out_dtype!r}")
    fused = normalized_shape is None
    normalized = tuple(shape[-1:]) if fused else normalized_shape_tuple(normalized_shape)
    if fused and not shape:
        raise ValueError("x must have at least 1 dim, (..., hidden); got shape ()")
    n_cols = check_normalized(shape, normalized)
    _check_param("weight", weight, normalized)
    _check_param("bias", bias, normalized)
    if residual is not None:
        check_shape("residual", check_tensor("residual", stand_in(residual[0], residual[2])), shape, "x's shape")
    eps = torch.finfo(dtype).eps if eps is None else check_float("eps", eps, 0.0)
    weight_offset = check_float("offset", weight_offset)
    dropout_p = check_float("p", dropout_p, 0.0, 1.0)
    check_device(x=device, weight=_device_of(weight, 2), bias=_device_of(bias, 2), residual=_device_of(residual, 3))

    n_rows = math.prod(shape) // n_cols
    x_strides = _rows_strides(shape, strides, n_cols)
    residual_strides = (0, 0) if residual is None else _rows_strides(shape, residual[1], n_cols)
    residual_out_dtype = None
    if fused:
        residual_out_dtype = residual[2] if residual is not None else (torch.float32 if residual_in_fp32 else dtype)
    dropout = dropout_p > 0.0
    threshold, scale = dropout_threshold_and_scale(dropout_p) if dropout else (0, 1.0)
    launch = None
    if n_rows:
        cfg = norm_config(n_cols, False)
        no_dropout = {} if dropout else {"rng_ptr": None}
        plain = {} if fused else {"residual_ptr": None, "residual_out_ptr": None}
        launch = Launch(
            _norm_fwd_chunked_kernel if cfg.chunked else _norm_fwd_kernel, (-(-n_rows // cfg.block_m),),
            **plain, **no_dropout,
            stride_x_row=(x_strides or (n_cols, 1))[0], stride_x_col=(x_strides or (n_cols, 1))[1],
            stride_res_row=(residual_strides or (n_cols, 1))[0], stride_res_col=(residual_strides or (n_cols, 1))[1],
            n_rows=n_rows, n_cols=n_cols, eps=float(eps), weight_offset=weight_offset, dropout_scale=scale,
            dropout_threshold=threshold, IS_RMS_NORM=is_rms_norm, HAS_RESIDUAL=residual is not None,
            HAS_DROPOUT=dropout, STORE_RESIDUAL=fused, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps, enable_fp_fusion=FMA_CONTRACTION,
        )  # fmt: skip
    return ForwardPlan(
        launch=launch,
        shape=torch.Size(shape),
        dtype=dtype,
        y_dtype=dtype if out_dtype is None else out_dtype,
        y_like_x=_is_contiguous(shape, strides),
        x_rows=None if x_strides is not None else (n_rows, n_cols),
        residual_rows=None if residual_strides is not None else (n_rows, n_cols),
        flat_params=any(p is not None and not p[3] for p in (weight, bias)),
        stats_numel=(1 if is_rms_norm else 2) * n_rows + (RNG_WORDS if dropout else 0),
        residual_out_dtype=residual_out_dtype,
        dropout=dropout,
    )


def _rows(t: Tensor, rows: Optional[Tuple[int, int]]) -> Tensor:
    return t if rows is None else t.reshape(rows)


def _flat(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.contiguous()


def _empty_like_x(plan: ForwardPlan, x: Tensor, device) -> Tensor:
    """y: x's shape (and strides when x is contiguous), in the plan's y dtype."""
    if plan.y_like_x:
        return torch.empty_like(x, dtype=plan.y_dtype)
    return torch.empty(plan.shape, dtype=plan.y_dtype, device=device)


def norm_forward(
    x: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    normalized_shape: List[int],
    eps: Optional[float],
    weight_offset: float,
    is_rms_norm: bool,
    out_dtype: Optional[torch.dtype],
) -> Tuple[Tensor, Tensor]:
    """(y, stats) of the norm of x over its trailing normalized_shape dims; stats holds fp32
    (mean, rstd) per row (rstd only for RMSNorm). eps None: torch.finfo(x.dtype).eps. y in
    out_dtype (None: x's)."""
    device = x.device
    plan = cached_plan(_forward_plan, (
        x.shape, x.stride(), x.dtype, device, _param_key(weight), _param_key(bias), None,
        _hashable_shape(normalized_shape), eps, weight_offset, is_rms_norm, 0.0, False, out_dtype,
    ))  # fmt: skip
    y = _empty_like_x(plan, x, device)
    stats = torch.empty(plan.stats_numel, dtype=torch.float32, device=device)
    if plan.launch is not None:
        if plan.flat_params:
            weight, bias = _flat(weight), _flat(bias)
        plan.launch(_rows(x, plan.x_rows), weight, bias, y, stats)
    return y, stats


def _norm_forward_fake(x, weight, bias, normalized_shape, eps, weight_offset, is_rms_norm, out_dtype):
    n_rows = x.numel() // math.prod(normalized_shape)
    return torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format), x.new_empty(
        ((1 if is_rms_norm else 2) * n_rows,), dtype=torch.float32
    )


def add_dropout_norm_forward(
    x: Tensor,
    residual: Optional[Tensor],
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    eps: float,
    weight_offset: float,
    is_rms_norm: bool,
    dropout_p: float,
    rng: Optional[Tensor],
    residual_in_fp32: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """(y, s, stats): s = dropout(x) + residual in the residual stream's dtype, y = norm(s) in x's.

    rng: the dropout's three int32 key words (the runtime's dropout_rng), with dropout_p > 0; the
    forward copies them after the statistics, for the backward.
    """
    device = x.device
    residual_key = None if residual is None else (residual.shape, residual.stride(), residual.dtype, residual.device)
    plan = cached_plan(_forward_plan, (
        x.shape, x.stride(), x.dtype, device, _param_key(weight), _param_key(bias), residual_key, None, eps,
        weight_offset, is_rms_norm, dropout_p, residual_in_fp32,
    ))  # fmt: skip
    y = _empty_like_x(plan, x, device)
    residual_out = torch.empty(plan.shape, dtype=plan.residual_out_dtype, device=device)
    stats = torch.empty(plan.stats_numel, dtype=torch.float32, device=device)
    if plan.launch is not None:
        if plan.flat_params:
            weight, bias = _flat(weight), _flat(bias)
        x = _rows(x, plan.x_rows)
        if residual is not None:
            residual = _rows(residual, plan.residual_rows)
        if plan.dropout:
            plan.launch(x, weight, bias, y, stats, residual, residual_out, rng)
        else:
            plan.launch(x, weight, bias, y, stats, residual, residual_out)
    return y, residual_out, stats


def _add_dropout_norm_forward_fake(
    x, residual, weight, bias, eps, weight_offset, is_rms_norm, dropout_p, rng, residual_in_fp32
):
    n_rows = x.numel() // x.shape[-1]
    dtype = residual.dtype if residual is not None else (torch.float32 if residual_in_fp32 else x.dtype)
    stats = ((1 if is_rms_norm else 2) * n_rows + (RNG_WORDS if dropout_p > 0.0 else 0),)
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        x.new_empty(x.shape, dtype=dtype),
        x.new_empty(stats, dtype=torch.float32),
    )


# Backward -------------------------------------------------------------------------------------


class BackwardPlan(NamedTuple):
    """One backward call's launches and allocations."""

    launch: Optional[Launch]  # None when there are no rows
    param_launch: Optional[Launch]  # sums the partial rows into dw, db; None with one program
    shape: torch.Size
    dx_like_s: bool  # the saved norm input is contiguous: dx = empty_like(s)
    s_rows: Optional[Tuple[int, int]]  # (rows, cols) to copy a tensor into when its strides do not map to rows
    dy_rows: Optional[Tuple[int, int]]
    dres_out_rows: Optional[Tuple[int, int]]
    flat_params: bool
    partial_numel: int  # fp32 partial sums of dw then db; 0: one program writes dw, db itself


@functools.lru_cache(maxsize=1024)
def _backward_plan(
    shape, s_strides, device, dy_strides, dres_out_strides, weight, bias, normalized_shape, weight_offset,
    is_rms_norm, dropout_p, store_dres,
) -> BackwardPlan:  # fmt: skip
    """weight, bias: None or whether the tensor is contiguous; *_strides: the tensors' strides;
    normalized_shape None: the last dim (add_dropout_norm, whose launch takes the residual's
    gradient tensors)."""
    fused = normalized_shape is None
    n_cols = shape[-1] if fused else math.prod(normalized_shape_tuple(normalized_shape))
    n_rows = math.prod(shape) // n_cols
    s_map = _rows_strides(shape, s_strides, n_cols) or (n_cols, 1)
    dy_map = _rows_strides(shape, dy_strides, n_cols)
    dres_out_map = (0, 0) if dres_out_strides is None else _rows_strides(shape, dres_out_strides, n_cols)
    launch = param_launch = None
    partial_numel = 0
    if n_rows:
        cfg = norm_config(n_cols, True)
        programs = _bwd_programs(n_rows, n_cols, device)
        n_params = (weight is not None) + (bias is not None)
        partial_numel = n_params * programs * n_cols if programs > 1 else 0
        db_offset = programs * n_cols if partial_numel and weight is not None else 0
        dy_map_or_rows = dy_map or (n_cols, 1)
        dres_out_map_or_rows = dres_out_map or (n_cols, 1)
        plain = {} if fused else {"dres_out_ptr": None, "dres_ptr": None}
        launch = Launch(
            _norm_bwd_chunked_kernel if cfg.chunked else _norm_bwd_kernel, (programs,), **plain,
            stride_s_row=s_map[0], stride_s_col=s_map[1], stride_dy_row=dy_map_or_rows[0],
            stride_dy_col=dy_map_or_rows[1], stride_dres_out_row=dres_out_map_or_rows[0],
            stride_dres_out_col=dres_out_map_or_rows[1], n_rows=n_rows, n_cols=n_cols, db_offset=db_offset,
            weight_offset=weight_offset, dropout_scale=dropout_threshold_and_scale(dropout_p)[1],
            dropout_threshold=dropout_threshold_and_scale(dropout_p)[0], IS_RMS_NORM=is_rms_norm,
            HAS_DRES_OUT=dres_out_strides is not None, STORE_DRES=store_dres, HAS_DROPOUT=dropout_p > 0.0,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            num_warps=cfg.num_warps, enable_fp_fusion=FMA_CONTRACTION,
        )  # fmt: skip
        if partial_numel:
            block_p, block_n = PARAM_GRAD_BLOCK
            param_launch = Launch(
                _norm_param_grad_kernel, (-(-n_cols // block_n),), n_partials=programs, n_cols=n_cols,
                db_offset=db_offset, HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK_P=block_p,
                BLOCK_N=block_n, num_warps=4,
            )  # fmt: skip
    return BackwardPlan(
        launch=launch,
        param_launch=param_launch,
        shape=torch.Size(shape),
        dx_like_s=_is_contiguous(shape, s_strides),
        s_rows=None if _rows_strides(shape, s_strides, n_cols) is not None else (n_rows, n_cols),
        dy_rows=None if dy_map is not None else (n_rows, n_cols),
        dres_out_rows=None if dres_out_map is not None else (n_rows, n_cols),
        flat_params=weight is False or bias is False,
        partial_numel=partial_numel,
    )


def _empty_contiguous_like(t: Tensor, strided: bool) -> Tensor:
    """empty_like(t), contiguous; strided: a parameter may not be contiguous."""
    return torch.empty_like(t, memory_format=torch.contiguous_format) if strided else torch.empty_like(t)


def _launch_backward(
    plan: BackwardPlan, before: Tuple, after: Tuple, weight: Optional[Tensor], bias: Optional[Tensor], device
) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """Launch the backward kernel with its tensors before dw, db and after them, then the
    parameter-gradient reduction; returns (dw, db)."""
    dw = None if weight is None else _empty_contiguous_like(weight, plan.flat_params)
    db = None if bias is None else _empty_contiguous_like(bias, plan.flat_params)
    if plan.launch is None:
        for grad in (dw, db):
            if grad is not None:
                grad.zero_()
    elif not plan.partial_numel:  # one program: its partial sums are the gradients
        plan.launch(*before, dw, db, *after)
    else:
        partial = torch.empty(plan.partial_numel, dtype=torch.float32, device=device)
        plan.launch(*before, None if dw is None else partial, None if db is None else partial, *after)
        plan.param_launch(partial, dw, db)
    return dw, db


def norm_backward(
    dy: Tensor,
    x: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    stats: Tensor,
    normalized_shape: List[int],
    weight_offset: float,
    is_rms_norm: bool,
) -> List[Tensor]:
    """[dx, dw (with a weight), db (with a bias)] of norm_forward."""
    device = x.device
    plan = cached_plan(_backward_plan, (
        x.shape, x.stride(), device, dy.stride(), None, _contiguity(weight), _contiguity(bias),
        _hashable_shape(normalized_shape), weight_offset, is_rms_norm, 0.0, False,
    ))  # fmt: skip
    dx = torch.empty_like(x) if plan.dx_like_s else torch.empty(plan.shape, dtype=x.dtype, device=device)
    w = _flat(weight) if plan.flat_params else weight
    before = (_rows(x, plan.s_rows), _rows(dy, plan.dy_rows), w, stats, dx)
    dw, db = _launch_backward(plan, before, (), weight, bias, device)
    return _present(dx, dw, db)


def _present(*tensors: Optional[Tensor]) -> List[Tensor]:
    return [t for t in tensors if t is not None]


def _norm_backward_fake(dy, x, weight, bias, stats, normalized_shape, weight_offset, is_rms_norm):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    return _present(dx, *(None if p is None else torch.empty_like(p) for p in (weight, bias)))


def _norm_setup_context(ctx, inputs, output):
    x, weight, bias, normalized_shape, _, weight_offset, is_rms_norm, _ = inputs
    ctx.save_for_backward(x, weight, bias, output[1])
    ctx.options = (normalized_shape, weight_offset, is_rms_norm)


def _split_param_grads(grads: List[Tensor], first: int, weight, bias) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """(dw, db) from grads[first:], which holds dw when there is a weight, then db with a bias."""
    dw = grads[first] if weight is not None else None
    db = grads[first + (weight is not None)] if bias is not None else None
    return dw, db


def _norm_backward_rule(ctx, grads, backward, eager):
    x, weight, bias, stats = ctx.saved_tensors
    normalized_shape, weight_offset, is_rms_norm = ctx.options
    out = backward(grads[0], x, weight, bias, stats, normalized_shape, weight_offset, is_rms_norm)
    return (out[0], *_split_param_grads(out, 1, weight, bias), None, None, None, None, None)


NormFunction, _norm_apply = differentiable_op(
    "fused_norm_xent::norm",
    forward=norm_forward,
    fake_forward=_norm_forward_fake,
    backward=norm_backward,
    fake_backward=_norm_backward_fake,
    setup_context=_norm_setup_context,
    backward_rule=_norm_backward_rule,
    n_differentiable_outputs=1,
    differentiable_args=(0, 1, 2),
)


def add_dropout_norm_backward(
    dy: Tensor,
    dresidual_out: Optional[Tensor],
    s: Tensor,
    weight: Optional[Tensor],
    bias: Optional[Tensor],
    stats: Tensor,
    x_dtype: torch.dtype,
    has_residual: bool,
    weight_offset: float,
    is_rms_norm: bool,
    dropout_p: float,
) -> List[Tensor]:
    """[dx, dresidual (when it differs from dx), dw, db (with a weight, a bias)] of
    add_dropout_norm_forward, from dy, the gradient of s (or None) and the saved s."""
    device = s.device
    store_dres = has_residual and (dropout_p > 0.0 or s.dtype != x_dtype)
    plan = cached_plan(_backward_plan, (
        s.shape, s.stride(), device, dy.stride(), None if dresidual_out is None else dresidual_out.stride(),
        _contiguity(weight), _contiguity(bias), None, weight_offset, is_rms_norm, dropout_p, store_dres,
    ))  # fmt: skip
    dx = torch.empty(plan.shape, dtype=x_dtype, device=device)
    dresidual = torch.empty_like(s, memory_format=torch.contiguous_format) if store_dres else None
    if dresidual_out is not None:
        dresidual_out = _rows(dresidual_out, plan.dres_out_rows)
    w = _flat(weight) if plan.flat_params else weight
    before = (_rows(s, plan.s_rows), _rows(dy, plan.dy_rows), w, stats, dx)
    dw, db = _launch_backward(plan, before, (dresidual_out, dresidual), weight, bias, device)
    return _present(dx, dresidual, dw, db)


def _add_dropout_norm_backward_fake(
    dy, dresidual_out, s, weight, bias, stats, x_dtype, has_residual, weight_offset, is_rms_norm, dropout_p
):
    store_dres = has_residual and (dropout_p > 0.0 or s.dtype != x_dtype)
    dx = s.new_empty(s.shape, dtype=x_dtype)
    dres = s.new_empty(s.shape) if store_dres else None
    return _present(dx, dres, *(None if p is None else torch.empty_like(p) for p in (weight, bias)))


def _add_dropout_norm_setup_context(ctx, inputs, output):
    x, residual, weight, bias, _, weight_offset, is_rms_norm, dropout_p, _, _ = inputs
    ctx.save_for_backward(output[1], weight, bias, output[2])
    ctx.options = (x.dtype, residual is not None, weight_offset, is_rms_norm, dropout_p)


def _add_dropout_norm_backward_rule(ctx, grads, backward, eager):
    dy, dresidual_out = grads[0], grads[1]
    s, weight, bias, stats = ctx.saved_tensors
    x_dtype, has_residual, weight_offset, is_rms_norm, dropout_p = ctx.options
    if dy is None:  # only the new residual was used: a zero gradient that occupies no memory
        dy = s.new_zeros((), dtype=x_dtype).expand(s.shape)
    out = backward(
        dy, dresidual_out, s, weight, bias, stats, x_dtype, has_residual, weight_offset, is_rms_norm, dropout_p
    )
    dx = out[0]
    store_dres = has_residual and (dropout_p > 0.0 or s.dtype != x_dtype)
    dresidual = (out[1] if store_dres else dx) if has_residual else None
    return (dx, dresidual, *_split_param_grads(out, 1 + store_dres, weight, bias), *([None] * 6))


AddDropoutNormFunction, _add_dropout_norm_apply = differentiable_op(
    "fused_norm_xent::add_dropout_norm",
    forward=add_dropout_norm_forward,
    fake_forward=_add_dropout_norm_forward_fake,
    backward=add_dropout_norm_backward,
    fake_backward=_add_dropout_norm_backward_fake,
    setup_context=_add_dropout_norm_setup_context,
    backward_rule=_add_dropout_norm_backward_rule,
    n_differentiable_outputs=2,
    differentiable_args=(0, 1, 2, 3),
)


# Functional API -------------------------------------------------------------------------------


def _op_shape(normalized_shape):
    """normalized_shape as the custom op takes it while torch.compile traces (a list of ints)."""
    if is_compiling():
        return [normalized_shape] if isinstance(normalized_shape, int) else list(normalized_shape)
    return normalized_shape


def layer_norm(
    x: Tensor,
    normalized_shape: Union[int, Sequence[int]],
    weight: Optional[Tensor] = None,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
    *,
    out_dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """LayerNorm over the trailing `normalized_shape` dims of x, differentiable (F.layer_norm).

    x: (..., *normalized_shape), fp32/fp16/bf16, any strides, on a CUDA device (the CPU under
    TRITON_INTERPRET=1). weight, bias: normalized_shape, any float dtype, optional.
    out_dtype: y's dtype (None: x's), rounded once from fp32: an fp32 x can feed a bf16 matmul with
    no cast kernel (the gradient comes back in x's dtype). Returns x's shape; mean and variance are fp32.
    """
    _require_tensors(x, weight, bias)
    return _norm_apply(x, weight, bias, _op_shape(normalized_shape), eps, 0.0, False, out_dtype)[0]


def rms_norm(
    x: Tensor,
    normalized_shape: Union[int, Sequence[int]],
    weight: Optional[Tensor] = None,
    eps: Optional[float] = None,
    *,
    offset: float = 0.0,
    out_dtype: Optional[torch.dtype] = None,
) -> Tensor:
    """RMSNorm over the trailing `normalized_shape` dims of x, differentiable (F.rms_norm).

    x: (..., *normalized_shape), fp32/fp16/bf16, any strides. weight: normalized_shape, optional.
    eps: None uses torch.finfo(x.dtype).eps, as torch does. offset: y = x * rstd * (offset + weight)
    (offset=1.0 is the Gemma-style `1 + w` form). out_dtype: y's dtype (None: x's), as layer_norm.
    Returns x's shape.
    """
    _require_tensors(x, weight, None)
    return _norm_apply(x, weight, None, _op_shape(normalized_shape), eps, offset, True, out_dtype)[0]


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
    The dropout mask is drawn from Philox keyed by `seed` and `seed_offset` (seed None: the key
    drawn from torch's generator on x's device, so torch.manual_seed repeats it and a CUDA-graph
    replay draws a new one); the backward regenerates it, nothing is stored. Same seed and
    offset, same mask.
    """
    is_rms_norm = check_choice("norm", norm, NORMS) == "rmsnorm"
    check_seed(seed, seed_offset)
    _require_tensors(x, weight, bias, residual)
    if residual is None and p == 0.0 and not (residual_in_fp32 and x.dtype != torch.float32):
        # The norm input is x itself: nothing to add, drop or store.
        y = _norm_apply(x, weight, bias, _op_shape(x.shape[-1:]), eps, offset, is_rms_norm, None)[0]
        return (y, x) if prenorm else (y, y)
    # The key words are drawn (or written) only for a dropout that runs: p is checked first.
    rng = dropout_rng(x.device, seed, seed_offset) if check_float("p", p, 0.0, 1.0) > 0.0 else None
    y, residual_out, _ = _add_dropout_norm_apply(
        x, residual, weight, bias, eps, offset, is_rms_norm, p, rng, residual_in_fp32
    )
    return (y, residual_out) if prenorm else (y, y)
