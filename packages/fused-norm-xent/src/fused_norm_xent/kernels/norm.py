"""LayerNorm and RMSNorm over the last dim of a (rows, cols) view, forward and backward, with an
optional fused prologue: dropout of x (mask regenerated from a seed, never stored) plus a residual.

    s = dropout(x) + residual      (rounded to the residual's dtype when it is stored)
    y = (s - mean(s)) * rstd * (w + offset) + b          LayerNorm
    y = s * rstd * (w + offset) + b                      RMSNorm (mean taken as 0)

Two shapes of kernel, chosen by the launcher from the row width:
- one block holds whole rows (BLOCK_M rows x BLOCK_N >= cols): the row is read once and y written
  once, the memory floor;
- wider rows stream through BLOCK_N chunks: a first pass keeps per-lane Welford statistics (mean
  and M2, merged once at the end: no cancellation), a second pass re-reads s (from L2, and from
  the stored residual when there is one) and writes y.
Statistics are fp32 whatever the dtypes; mean and rstd are saved per row for the backward.
Means divide with IEEE rounding and the launcher compiles these kernels without FMA contraction
(enable_fp_fusion=False), so a quantity and the mean it is compared with are rounded alike: a
width-1 row, or a constant one, normalizes to exactly 0 and gets exactly 0 gradient, as in the
interpreter (no cost: the kernels are memory-bound). A row whose statistics are not finite (an
inf or NaN in it, or a sum of squares that overflows) normalizes to NaN throughout, as torch's
CUDA kernels do.

Backward, persistent: each program walks a strided set of row tiles, writes dx (and the residual
gradient) per row, and accumulates the weight and bias gradients of its rows in registers
(single-block rows) or in its own fp32 row of the partial buffer (chunked rows). A second small
kernel sums the (programs, cols) partial buffers into dw and db: no per-row fp32 buffer, no atomics,
a deterministic order. With a single program (few rows) its row is the gradient itself: it writes
dw and db directly, in their dtypes, and the second kernel is not launched.

Dropout: the shared runtime's Philox-4x32 (7 rounds), keyed by the call's key words (read from
rng_ptr), counter (col, row low 32 bits, row high 32 bits, key offset). An element is kept when
the top 31 bits of its draw are >= threshold (= round(p * 2^31)), and scaled by 1 / (1 - p). The
same words give the same mask in the forward, the backward and on any Triton version. The forward
stores the three words after the statistics, where the backward reads them: nothing about the
mask goes through the host between the two. Offsets are int64 throughout.
"""

import triton
import triton.language as tl

from .._runtime.dropout import load_rng_words, philox_keep

# Arguments the JIT must not specialize on their value (== 1, divisible by 16): the dropout's
# threshold, and row counts, which only mask whole rows (no load's vector width depends on them),
# so that each new row count does not compile the kernel again.
_UNSPECIALIZED = ["n_rows", "dropout_threshold"]


@triton.jit
def _dropout_keep(offs_m, offs_n, dropout_threshold, seed_lo, seed_hi, rng_offset):
    """Keep mask of the dropout at rows offs_m x cols offs_n (int64 vectors); uint32 key words."""
    rows = offs_m[:, None] + offs_n[None, :] * 0
    c0 = (offs_n[None, :] + offs_m[:, None] * 0).to(tl.uint32)
    c1 = rows.to(tl.uint32)
    c2 = (rows >> 32).to(tl.uint32)
    return philox_keep(c0, c1, c2, c0 * 0 + rng_offset, seed_lo, seed_hi, dropout_threshold)


@triton.jit
def _forward_rng_words(rng_ptr, HAS_DROPOUT: tl.constexpr):
    """The key words the forward reads (uint32), or zeros without dropout (rng_ptr is then None)."""
    if HAS_DROPOUT:
        seed_lo, seed_hi, rng_offset = load_rng_words(rng_ptr)
    else:
        seed_lo = tl.program_id(0).to(tl.uint32) * 0
        seed_hi = seed_lo
        rng_offset = seed_lo
    return seed_lo, seed_hi, rng_offset


@triton.jit
def _norm_input(
    x_ptr, residual_ptr, offs_m, offs_n, mask,
    stride_x_row, stride_x_col, stride_res_row, stride_res_col,
    dropout_scale, dropout_threshold, seed_lo, seed_hi, rng_offset,
    HAS_RESIDUAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
):  # fmt: skip
    """dropout(x) + residual on a tile, in fp32."""
    x_ptrs = x_ptr + offs_m[:, None] * stride_x_row + offs_n[None, :] * stride_x_col
    s = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    if HAS_DROPOUT:
        keep = _dropout_keep(offs_m, offs_n, dropout_threshold, seed_lo, seed_hi, rng_offset)
        s = tl.where(keep, s * dropout_scale, 0.0)
    if HAS_RESIDUAL:
        res_ptrs = residual_ptr + offs_m[:, None] * stride_res_row + offs_n[None, :] * stride_res_col
        s += tl.load(res_ptrs, mask=mask, other=0.0).to(tl.float32)
    return s


@triton.jit
def _store_rounded(ptrs, s, mask):
    """Store s in the pointer's dtype and return the stored values in fp32, so that statistics
    and output use exactly the values the backward will read back."""
    stored = s.to(ptrs.dtype.element_ty)
    tl.store(ptrs, stored, mask=mask)
    return stored.to(tl.float32)


@triton.jit
def _affine(
    xhat, weight_ptr, bias_ptr, offs_n, mask_n, weight_offset, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr
):
    """xhat * (w + offset) + b, broadcast over the rows of the tile."""
    y = xhat
    if HAS_WEIGHT:
        w = tl.load(weight_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32) + weight_offset
        y = y * w[None, :]
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    return y


@triton.jit
def _row_mean(total, n_cols):
    """total / n_cols, correctly rounded (the default fp32 division is approximate). n_cols may be
    the constexpr 1 the JIT makes of a width-1 argument."""
    return tl.fdiv(total, n_cols * 1.0, ieee_rounding=True)


@triton.jit
def _rstd(var, eps):
    """1 / sqrt(var + eps); NaN where var is inf (a row holding an inf, or overflowing squares)."""
    return tl.where(var == float("inf"), float("nan"), 1.0 / tl.sqrt(var + eps))


@triton.jit
def _xhat(s, mean, rstd, IS_RMS_NORM: tl.constexpr):
    if IS_RMS_NORM:
        return s * rstd[:, None]
    return (s - mean[:, None]) * rstd[:, None]


@triton.jit
def _store_stats(stats_ptr, offs_m, mask_m, n_rows, mean, rstd, IS_RMS_NORM: tl.constexpr):
    """stats: fp32 (2, rows) = (mean, rstd) for LayerNorm, (1, rows) = rstd for RMSNorm."""
    if IS_RMS_NORM:
        tl.store(stats_ptr + offs_m, rstd, mask=mask_m)
    else:
        tl.store(stats_ptr + offs_m, mean, mask=mask_m)
        tl.store(stats_ptr + n_rows + offs_m, rstd, mask=mask_m)


@triton.jit
def _load_stats(stats_ptr, offs_m, mask_m, n_rows, IS_RMS_NORM: tl.constexpr):
    """(mean, rstd) of the rows offs_m (mean is rstd, unused, for RMSNorm)."""
    if IS_RMS_NORM:
        rstd = tl.load(stats_ptr + offs_m, mask=mask_m, other=0.0)
        return rstd, rstd
    mean = tl.load(stats_ptr + offs_m, mask=mask_m, other=0.0)
    return mean, tl.load(stats_ptr + n_rows + offs_m, mask=mask_m, other=0.0)


@triton.jit
def _rng_words_ptr(stats_ptr, n_rows, IS_RMS_NORM: tl.constexpr):
    """The three int32 words (seed_lo, seed_hi, rng_offset) stored after the statistics."""
    if IS_RMS_NORM:
        words = stats_ptr + n_rows.to(tl.int64)
    else:
        words = stats_ptr + 2 * n_rows.to(tl.int64)
    return words.to(tl.pointer_type(tl.int32), bitcast=True)


@triton.jit
def _store_rng_words(stats_ptr, n_rows, seed_lo, seed_hi, rng_offset, IS_RMS_NORM: tl.constexpr):
    """Program 0 keeps the dropout's key and offset beside the statistics, for the backward."""
    if tl.program_id(0) == 0:
        words = _rng_words_ptr(stats_ptr, n_rows, IS_RMS_NORM)
        tl.store(words, seed_lo.to(tl.int32, bitcast=True))
        tl.store(words + 1, seed_hi.to(tl.int32, bitcast=True))
        tl.store(words + 2, rng_offset.to(tl.int32, bitcast=True))


@triton.jit
def _load_rng_words(stats_ptr, n_rows, IS_RMS_NORM: tl.constexpr):
    return load_rng_words(_rng_words_ptr(stats_ptr, n_rows, IS_RMS_NORM))


@triton.jit(do_not_specialize=_UNSPECIALIZED)
def _norm_fwd_kernel(
    x_ptr, weight_ptr, bias_ptr, y_ptr, stats_ptr, residual_ptr, residual_out_ptr, rng_ptr,
    stride_x_row, stride_x_col, stride_res_row, stride_res_col,
    n_rows, n_cols, eps, weight_offset, dropout_scale, dropout_threshold,
    IS_RMS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    STORE_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    seed_lo, seed_hi, rng_offset = _forward_rng_words(rng_ptr, HAS_DROPOUT)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < n_rows
    mask_n = offs_n < n_cols
    mask = mask_m[:, None] & mask_n[None, :]
    s = _norm_input(
        x_ptr, residual_ptr, offs_m, offs_n, mask, stride_x_row, stride_x_col, stride_res_row, stride_res_col,
        dropout_scale, dropout_threshold, seed_lo, seed_hi, rng_offset, HAS_RESIDUAL, HAS_DROPOUT,
    )  # fmt: skip
    if STORE_RESIDUAL:
        s = _store_rounded(residual_out_ptr + offs_m[:, None] * n_cols + offs_n[None, :], s, mask)
    if IS_RMS_NORM:
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        var = _row_mean(tl.sum(s * s, axis=1), n_cols)
    else:
        # The first mean is off by the rounding of a sum of large values; one correction with the
        # (small, exactly computed) deviations from it makes it accurate even when |mean| >> std.
        mean = _row_mean(tl.sum(s, axis=1), n_cols)
        mean += _row_mean(tl.sum(tl.where(mask, s - mean[:, None], 0.0), axis=1), n_cols)
        centered = tl.where(mask, s - mean[:, None], 0.0)
        var = _row_mean(tl.sum(centered * centered, axis=1), n_cols)
    rstd = _rstd(var, eps)
    _store_stats(stats_ptr, offs_m, mask_m, n_rows, mean, rstd, IS_RMS_NORM)
    if HAS_DROPOUT:
        _store_rng_words(stats_ptr, n_rows, seed_lo, seed_hi, rng_offset, IS_RMS_NORM)
    y = _affine(
        _xhat(s, mean, rstd, IS_RMS_NORM), weight_ptr, bias_ptr, offs_n, mask_n, weight_offset, HAS_WEIGHT, HAS_BIAS
    )
    tl.store(y_ptr + offs_m[:, None] * n_cols + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=_UNSPECIALIZED)
def _norm_fwd_chunked_kernel(
    x_ptr, weight_ptr, bias_ptr, y_ptr, stats_ptr, residual_ptr, residual_out_ptr, rng_ptr,
    stride_x_row, stride_x_col, stride_res_row, stride_res_col,
    n_rows, n_cols, eps, weight_offset, dropout_scale, dropout_threshold,
    IS_RMS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    STORE_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    seed_lo, seed_hi, rng_offset = _forward_rng_words(rng_ptr, HAS_DROPOUT)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    mask_m = offs_m < n_rows
    # Pass 1: per-lane statistics. Every lane of chunk k has seen k + 1 values, so the Welford
    # update divides by a scalar; lanes past the row's end in the last chunk are left as they are.
    lane_mean = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    lane_m2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs_n
        mask = mask_m[:, None] & (cols < n_cols)[None, :]
        s = _norm_input(
            x_ptr, residual_ptr, offs_m, cols, mask, stride_x_row, stride_x_col, stride_res_row, stride_res_col,
            dropout_scale, dropout_threshold, seed_lo, seed_hi, rng_offset, HAS_RESIDUAL, HAS_DROPOUT,
        )  # fmt: skip
        if STORE_RESIDUAL:
            s = _store_rounded(residual_out_ptr + offs_m[:, None] * n_cols + cols[None, :], s, mask)
        if IS_RMS_NORM:
            lane_m2 += s * s
        else:
            inv_count = 1.0 / (start // BLOCK_N + 1)
            delta = s - lane_mean
            lane_mean += tl.where(mask, delta * inv_count, 0.0)
            lane_m2 += tl.where(mask, delta * (s - lane_mean), 0.0)
    if IS_RMS_NORM:
        mean = tl.zeros([BLOCK_M], dtype=tl.float32)
        var = _row_mean(tl.sum(lane_m2, axis=1), n_cols)
    else:
        # Merge the lanes (Chan et al.): lane j holds ceil((n_cols - j) / BLOCK_N) values. The means
        # are summed as deviations from lane 0's, so a large common offset costs no precision.
        lane_count = ((n_cols - offs_n + BLOCK_N - 1) // BLOCK_N).to(tl.float32)[None, :]
        shift = tl.sum(tl.where(offs_n[None, :] == 0, lane_mean, 0.0), axis=1)
        mean = shift + _row_mean(tl.sum(lane_count * (lane_mean - shift[:, None]), axis=1), n_cols)
        spread = lane_mean - mean[:, None]
        var = _row_mean(tl.sum(lane_m2 + lane_count * spread * spread, axis=1), n_cols)
    rstd = _rstd(var, eps)
    _store_stats(stats_ptr, offs_m, mask_m, n_rows, mean, rstd, IS_RMS_NORM)
    if HAS_DROPOUT:
        _store_rng_words(stats_ptr, n_rows, seed_lo, seed_hi, rng_offset, IS_RMS_NORM)
    # Pass 2: normalize. Without a stored residual the norm input is x itself.
    if STORE_RESIDUAL:
        s_ptr = residual_out_ptr
        stride_s_row = n_cols
        stride_s_col = 1
    else:
        s_ptr = x_ptr
        stride_s_row = stride_x_row
        stride_s_col = stride_x_col
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs_n
        mask_n = cols < n_cols
        mask = mask_m[:, None] & mask_n[None, :]
        s_ptrs = s_ptr + offs_m[:, None] * stride_s_row + cols[None, :] * stride_s_col
        s = tl.load(s_ptrs, mask=mask, other=0.0).to(tl.float32)
        y = _affine(
            _xhat(s, mean, rstd, IS_RMS_NORM), weight_ptr, bias_ptr, cols, mask_n, weight_offset, HAS_WEIGHT, HAS_BIAS
        )
        tl.store(y_ptr + offs_m[:, None] * n_cols + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_bwd_tile(
    s_ptr, dy_ptr, weight_ptr, stats_ptr, offs_m, offs_n, mask_m, mask_n,
    stride_s_row, stride_s_col, stride_dy_row, stride_dy_col, n_rows, weight_offset,
    IS_RMS_NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr,
):  # fmt: skip
    """(xhat, dy, w * dy, rstd) of a tile in fp32, zero outside the mask."""
    mask = mask_m[:, None] & mask_n[None, :]
    s = tl.load(s_ptr + offs_m[:, None] * stride_s_row + offs_n[None, :] * stride_s_col, mask=mask, other=0.0)
    dy = tl.load(dy_ptr + offs_m[:, None] * stride_dy_row + offs_n[None, :] * stride_dy_col, mask=mask, other=0.0)
    dy = dy.to(tl.float32)
    mean, rstd = _load_stats(stats_ptr, offs_m, mask_m, n_rows, IS_RMS_NORM)
    xhat = tl.where(mask, _xhat(s.to(tl.float32), mean, rstd, IS_RMS_NORM), 0.0)
    wdy = dy
    if HAS_WEIGHT:
        wdy = dy * (tl.load(weight_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32) + weight_offset)[None, :]
    return xhat, dy, wdy, rstd


@triton.jit
def _input_grad(
    xhat, wdy, rstd, mean_xhat_wdy, mean_wdy, dres_out_ptr, dx_ptr, dres_ptr, offs_m, offs_n, mask,
    stride_dres_out_row, stride_dres_out_col, n_cols,
    dropout_scale, dropout_threshold, seed_lo, seed_hi, rng_offset,
    IS_RMS_NORM: tl.constexpr, HAS_DRES_OUT: tl.constexpr, STORE_DRES: tl.constexpr, HAS_DROPOUT: tl.constexpr,
):  # fmt: skip
    """ds = rstd * (w*dy - xhat * mean(xhat*w*dy) - mean(w*dy)) (+ the residual-out gradient),
    stored as the residual's gradient; dx = ds through the dropout mask (dx, dres contiguous)."""
    if IS_RMS_NORM:
        ds = (wdy - xhat * mean_xhat_wdy[:, None]) * rstd[:, None]
    else:
        ds = (wdy - xhat * mean_xhat_wdy[:, None] - mean_wdy[:, None]) * rstd[:, None]
    if HAS_DRES_OUT:
        dres_out_ptrs = dres_out_ptr + offs_m[:, None] * stride_dres_out_row + offs_n[None, :] * stride_dres_out_col
        ds += tl.load(dres_out_ptrs, mask=mask, other=0.0).to(tl.float32)
    if STORE_DRES:
        dres_ptrs = dres_ptr + offs_m[:, None] * n_cols + offs_n[None, :]
        tl.store(dres_ptrs, ds.to(dres_ptr.dtype.element_ty), mask=mask)
    if HAS_DROPOUT:
        keep = _dropout_keep(offs_m, offs_n, dropout_threshold, seed_lo, seed_hi, rng_offset)
        ds = tl.where(keep, ds * dropout_scale, 0.0)
    tl.store(dx_ptr + offs_m[:, None] * n_cols + offs_n[None, :], ds.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=_UNSPECIALIZED)
def _norm_bwd_kernel(
    s_ptr, dy_ptr, weight_ptr, stats_ptr, dx_ptr, dw_ptr, db_ptr, dres_out_ptr, dres_ptr,
    stride_s_row, stride_s_col, stride_dy_row, stride_dy_col, stride_dres_out_row, stride_dres_out_col,
    n_rows, n_cols, db_offset, weight_offset, dropout_scale, dropout_threshold,
    IS_RMS_NORM: tl.constexpr, HAS_DRES_OUT: tl.constexpr, STORE_DRES: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    seed_lo, seed_hi, rng_offset = 0, 0, 0
    if HAS_DROPOUT:
        seed_lo, seed_hi, rng_offset = _load_rng_words(stats_ptr, n_rows, IS_RMS_NORM)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_cols
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    n_tiles = (n_rows + BLOCK_M - 1) // BLOCK_M
    for tile in range(pid, n_tiles, n_programs):
        offs_m = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        mask_m = offs_m < n_rows
        mask = mask_m[:, None] & mask_n[None, :]
        xhat, dy, wdy, rstd = _load_bwd_tile(
            s_ptr, dy_ptr, weight_ptr, stats_ptr, offs_m, offs_n, mask_m, mask_n,
            stride_s_row, stride_s_col, stride_dy_row, stride_dy_col, n_rows, weight_offset, IS_RMS_NORM, HAS_WEIGHT,
        )  # fmt: skip
        mean_xhat_wdy = _row_mean(tl.sum(xhat * wdy, axis=1), n_cols)
        mean_wdy = _row_mean(tl.sum(wdy, axis=1), n_cols)
        _input_grad(
            xhat, wdy, rstd, mean_xhat_wdy, mean_wdy, dres_out_ptr, dx_ptr, dres_ptr, offs_m, offs_n, mask,
            stride_dres_out_row, stride_dres_out_col, n_cols,
            dropout_scale, dropout_threshold, seed_lo, seed_hi, rng_offset,
            IS_RMS_NORM, HAS_DRES_OUT, STORE_DRES, HAS_DROPOUT,
        )  # fmt: skip
        if HAS_WEIGHT:
            dw += tl.sum(dy * xhat, axis=0)
        if HAS_BIAS:
            # dy is already 0 outside the mask; summing the load itself miscompiles on Triton 2.2
            # (fp32, where no conversion comes between: d(bias) came out wrong on an H100, while
            # the same sum of a where() was right).
            db += tl.sum(tl.where(mask, dy, 0.0), axis=0)
    if HAS_WEIGHT:
        tl.store(dw_ptr + pid.to(tl.int64) * n_cols + offs_n, dw.to(dw_ptr.dtype.element_ty), mask=mask_n)
    if HAS_BIAS:
        db_row = db_ptr + db_offset + pid.to(tl.int64) * n_cols
        tl.store(db_row + offs_n, db.to(db_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _accumulate_partial(partial_ptr, cols, mask_n, value, first):
    """partial[cols] += value, or = value on the program's first tile (the buffer is not zeroed)."""
    if first:
        tl.store(partial_ptr + cols, value.to(partial_ptr.dtype.element_ty), mask=mask_n)
    else:
        total = tl.load(partial_ptr + cols, mask=mask_n, other=0.0).to(tl.float32) + value
        tl.store(partial_ptr + cols, total.to(partial_ptr.dtype.element_ty), mask=mask_n)


@triton.jit(do_not_specialize=_UNSPECIALIZED)
def _norm_bwd_chunked_kernel(
    s_ptr, dy_ptr, weight_ptr, stats_ptr, dx_ptr, dw_ptr, db_ptr, dres_out_ptr, dres_ptr,
    stride_s_row, stride_s_col, stride_dy_row, stride_dy_col, stride_dres_out_row, stride_dres_out_col,
    n_rows, n_cols, db_offset, weight_offset, dropout_scale, dropout_threshold,
    IS_RMS_NORM: tl.constexpr, HAS_DRES_OUT: tl.constexpr, STORE_DRES: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    seed_lo, seed_hi, rng_offset = 0, 0, 0
    if HAS_DROPOUT:
        seed_lo, seed_hi, rng_offset = _load_rng_words(stats_ptr, n_rows, IS_RMS_NORM)
    offs_n = tl.arange(0, BLOCK_N)
    # This program's own row of the partial buffers (every program has at least one tile).
    partial_offset = pid.to(tl.int64) * n_cols
    n_tiles = (n_rows + BLOCK_M - 1) // BLOCK_M
    for tile in range(pid, n_tiles, n_programs):
        offs_m = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        mask_m = offs_m < n_rows
        # Pass 1: the two row reductions.
        sum_xhat_wdy = tl.zeros([BLOCK_M], dtype=tl.float32)
        sum_wdy = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + offs_n
            xhat, dy, wdy, rstd = _load_bwd_tile(
                s_ptr, dy_ptr, weight_ptr, stats_ptr, offs_m, cols, mask_m, cols < n_cols,
                stride_s_row, stride_s_col, stride_dy_row, stride_dy_col, n_rows, weight_offset,
                IS_RMS_NORM, HAS_WEIGHT,
            )  # fmt: skip
            sum_xhat_wdy += tl.sum(xhat * wdy, axis=1)
            sum_wdy += tl.sum(wdy, axis=1)
        mean_xhat_wdy = _row_mean(sum_xhat_wdy, n_cols)
        mean_wdy = _row_mean(sum_wdy, n_cols)
        # Pass 2: the input gradient, and this tile's share of the parameter gradients.
        first = tile == pid
        for start in range(0, n_cols, BLOCK_N):
            cols = start + offs_n
            mask_n = cols < n_cols
            xhat, dy, wdy, rstd = _load_bwd_tile(
                s_ptr, dy_ptr, weight_ptr, stats_ptr, offs_m, cols, mask_m, mask_n,
                stride_s_row, stride_s_col, stride_dy_row, stride_dy_col, n_rows, weight_offset,
                IS_RMS_NORM, HAS_WEIGHT,
            )  # fmt: skip
            _input_grad(
                xhat, wdy, rstd, mean_xhat_wdy, mean_wdy, dres_out_ptr, dx_ptr, dres_ptr, offs_m, cols,
                mask_m[:, None] & mask_n[None, :], stride_dres_out_row, stride_dres_out_col, n_cols,
                dropout_scale, dropout_threshold, seed_lo, seed_hi, rng_offset,
                IS_RMS_NORM, HAS_DRES_OUT, STORE_DRES, HAS_DROPOUT,
            )  # fmt: skip
            if HAS_WEIGHT:
                _accumulate_partial(dw_ptr + partial_offset, cols, mask_n, tl.sum(dy * xhat, axis=0), first)
            if HAS_BIAS:
                _accumulate_partial(db_ptr + db_offset + partial_offset, cols, mask_n, tl.sum(dy, axis=0), first)


@triton.jit
def _column_sum(partial_ptr, out_ptr, offs_n, mask_n, n_partials, n_cols, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_p = tl.arange(0, BLOCK_P)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for start in range(0, n_partials, BLOCK_P):
        rows = (start + offs_p).to(tl.int64)
        mask = (rows < n_partials)[:, None] & mask_n[None, :]
        acc += tl.load(partial_ptr + rows[:, None] * n_cols + offs_n[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + offs_n, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit(do_not_specialize=["n_partials"])
def _norm_param_grad_kernel(
    partial_ptr, dw_ptr, db_ptr,
    n_partials, n_cols, db_offset,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """dw, db = column sums of the (n_partials, n_cols) fp32 partial sums of each, in their own
    dtypes; the bias's start db_offset elements into the partial buffer."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_cols
    if HAS_WEIGHT:
        _column_sum(partial_ptr, dw_ptr, offs_n, mask_n, n_partials, n_cols, BLOCK_P, BLOCK_N)
    if HAS_BIAS:
        _column_sum(partial_ptr + db_offset, db_ptr, offs_n, mask_n, n_partials, n_cols, BLOCK_P, BLOCK_N)
