"""Cross-entropy over the rows of (rows, classes) logits: loss, log-sum-exp and the logits gradient.

Per valid row (target != ignore_index), with lse = logsumexp(x), eps = label_smoothing, V classes
and z = lse_square_scale:
    loss = lse - (1 - eps) * x[target] - eps * mean(x) + z * lse^2
    dloss/dx_j = (1 + 2 z lse) * softmax(x)_j - (1 - eps) * [j == target] - eps / V
Ignored rows have loss 0 and gradient 0 whatever their upstream gradient, NaN or inf included (as
torch): the upstream gradient reaches a row through a select, never through a product with 0.
With HAS_SOFTCAP (Gemma-2's final-logit softcapping, c = softcap > 0) x is c * tanh(raw / c),
computed in fp32 as each chunk is loaded, and the gradient wrt the raw logits is the one above
times 1 - tanh(raw / c)^2.

Three kernels:
- _cross_entropy_kernel: persistent (each program walks a strided set of row tiles, so the rows in
  flight, and with them the L2 footprint, stay bounded), two passes over a row in BLOCK_N chunks
  (rows of any width; BLOCK_M rows per tile when rows are narrow). Each pass loads the next chunk
  before it reduces the current one (PREFETCH), keeping a load in flight through the reductions.
  - pass 1 (COMPUTE_LOSS): online max and sum of exponentials, reduced per chunk so that each
    element costs one exp; the sum of the row for label smoothing; the target logit by one load.
    Writes lse per row and either the loss (and z-loss) per row or, with REDUCE, this program's
    fp64 sums of them and its count of rows not ignored (one (loss, z-loss, count) triple per
    program: an accurate, deterministic reduction).
  - pass 2 (COMPUTE_GRAD): re-reads the row, last chunk first: the chunks pass 1 read last are
    the likeliest to still be in L2. Writes the gradient times grad_scale (divided by the number
    of valid rows with MEAN_SCALE, which every program counts itself among the call's targets
    before its first row, a few microseconds of L2 reads that need no kernel or host read before
    this one; times a per-row scale with HAS_ROW_SCALE), possibly into the logits buffer
    itself: each element is read before the same thread overwrites it. Without COMPUTE_LOSS, lse
    is read from lse_ptr (a backward from saved statistics), and the n_cols columns may be a
    slice of the rows' n_classes classes, those from col_start on (the vocabulary-chunked pass of
    the fused linear cross-entropy); with it they are the whole row (col_start 0).
- _loss_finalize_kernel: one program sums the fp64 partials and divides a mean by the count.
- _scale_kernel: multiplies a gradient computed for an upstream 1 by the actual upstream gradient.
NaN/inf follow torch: a NaN or +inf logit makes the row NaN, an all -inf row gives NaN, a -inf
target logit gives +inf (with the softcap, +-inf logits are capped at +-softcap first). Offsets
are int64, row and column alike, so logits past 2^31 elements are addressed correctly in any
layout (a column-major row's column offsets reach N * V).
A target outside [0, V) that is not ignored loads nothing: its row's loss and gradient are NaN
(the launcher rejects such targets first where asked to).
"""

import triton
import triton.language as tl

# Entries per program in the partial sums: (loss, z-loss, rows not ignored).
PARTIAL_ENTRIES = tl.constexpr(3)
# Targets per step of a program counting the valid ones.
COUNT_BLOCK = tl.constexpr(4096)


@triton.jit
def _count_valid(target_ptr, stride_target, n_targets, ignore_index):
    """How many of the n_targets targets are not ignore_index (every program counts for itself)."""
    offs = tl.arange(0, COUNT_BLOCK).to(tl.int64)
    count = tl.zeros([COUNT_BLOCK], dtype=tl.int32)
    for start in range(0, n_targets, COUNT_BLOCK):
        mask = start + offs < n_targets
        target = tl.load(target_ptr + (start + offs) * stride_target, mask=mask, other=ignore_index)
        count += (target != ignore_index).to(tl.int32)
    return tl.sum(count, axis=0)


@triton.jit
def _chunk_mask(mask_m, cols, n_cols):
    return mask_m[:, None] & ((cols >= 0) & (cols < n_cols))[None, :]


@triton.jit
def _col_offsets(cols, stride_col):
    """Element offsets of columns `cols`, in int64: with a column stride of N (column-major logits)
    they pass 2^31 once N * V does."""
    return cols.to(tl.int64) * stride_col


@triton.jit
def _softcap(x, softcap):
    """(softcap * tanh(x / softcap), its derivative 1 - tanh(x / softcap)^2), fp32.

    With e = exp(-2|u|), u = x / softcap (e <= 1: no overflow, whatever x): tanh|u| = (1 - e) / (1 + e)
    and 1 - tanh^2 = 4e / (1 + e)^2, which does not cancel where tanh saturates. Below |u| = 0.55,
    where 1 - e would cancel, tanh|u| = |u| + |u|^3 Q(u^2), Q fitted for this kernel (relative error
    1e-9): at most 1.7 ulp against mpmath with a correctly rounded exp (the interpreter's). No
    libdevice tanh: its module moved between Triton versions.
    """
    u = x / softcap
    a = tl.abs(u)
    e = tl.exp(-2.0 * a)
    s = a * a
    q = (((-6.274300162e-03 * s + 2.107171714e-02) * s - 5.385231972e-02) * s + 1.333258599e-01) * s - 3.333331645e-01
    t = tl.where(a < 0.55, a + a * (s * q), (1.0 - e) / (1.0 + e))
    p = 1.0 + e
    return softcap * tl.where(u < 0.0, -t, t), 4.0 * e / (p * p)


@triton.jit
def _load_chunk(row_ptrs, stride_col, mask_m, cols, n_cols, other: tl.constexpr, softcap, SOFTCAP: tl.constexpr):
    """Columns `cols` of the tile's rows in fp32 (`other` where masked), softcapped with SOFTCAP."""
    ptrs = row_ptrs[:, None] + _col_offsets(cols, stride_col)[None, :]
    mask = _chunk_mask(mask_m, cols, n_cols)
    x = tl.load(ptrs, mask=mask, other=other).to(tl.float32)
    if SOFTCAP:
        # Masked columns keep `other`: a capped -inf (-softcap) would enter the row's sums.
        capped, _ = _softcap(x, softcap)
        x = tl.where(mask, capped, other)
    return x


# Specialized on n_cols and the logits/grad strides only (the loads' vector width depends on them);
# row counts, class offsets, per-row scalars' strides and ignore_index would only multiply the
# compiled variants.
@triton.jit(
    do_not_specialize=["col_start", "stride_target", "stride_row_scale", "n_rows", "n_classes", "n_targets",
                       "ignore_index"]
)  # fmt: skip
def _cross_entropy_kernel(
    logits_ptr, target_ptr, grad_ptr, loss_ptr, z_loss_ptr, partial_ptr, lse_ptr, row_scale_ptr, all_target_ptr,
    col_start, stride_logits_row, stride_logits_col, stride_grad_row, stride_grad_col, stride_target,
    stride_row_scale, n_rows, n_cols, n_classes, n_targets, ignore_index, label_smoothing, lse_square_scale, softcap,
    grad_scale,
    COMPUTE_LOSS: tl.constexpr, REDUCE: tl.constexpr, STORE_Z_LOSS: tl.constexpr, COMPUTE_GRAD: tl.constexpr,
    MEAN_SCALE: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_Z_LOSS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr, PREFETCH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    n_tiles = (n_rows + BLOCK_M - 1) // BLOCK_M
    n_chunks = (n_cols + BLOCK_N - 1) // BLOCK_N
    if COMPUTE_GRAD and MEAN_SCALE:
        # A mean over the valid rows among all n_targets of the call (all_target_ptr, of which these
        # rows may be a chunk): 1 / their count (no division by 0: without valid rows no row uses
        # the scale).
        count = _count_valid(all_target_ptr, stride_target, n_targets, ignore_index)
        grad_scale = grad_scale / tl.maximum(count, 1).to(tl.float32)
    if REDUCE:
        loss_sum = tl.zeros([BLOCK_M], dtype=tl.float64)
        z_loss_sum = tl.zeros([BLOCK_M], dtype=tl.float64)
        valid_sum = tl.zeros([BLOCK_M], dtype=tl.int32)
    for tile in range(pid, n_tiles, tl.num_programs(0)):
        offs_m = (tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        offs_n = tl.arange(0, BLOCK_N)
        mask_m = offs_m < n_rows
        target = tl.load(target_ptr + offs_m * stride_target, mask=mask_m, other=0).to(tl.int64)
        valid = mask_m & (target != ignore_index)
        row_ptrs = logits_ptr + offs_m * stride_logits_row
        if COMPUTE_LOSS:
            row_max = tl.full([BLOCK_M], -float("inf"), tl.float32)
            sum_exp = tl.zeros([BLOCK_M], dtype=tl.float32)
            row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
            if PREFETCH:
                x = _load_chunk(row_ptrs, stride_logits_col, mask_m, offs_n, n_cols, -float("inf"), softcap,
                                HAS_SOFTCAP)  # fmt: skip
            for start in range(BLOCK_N, n_cols + BLOCK_N, BLOCK_N):
                if PREFETCH:
                    # The next chunk (fully masked past the row's end: no memory access) is in
                    # flight while this one is reduced.
                    x_next = _load_chunk(row_ptrs, stride_logits_col, mask_m, start + offs_n, n_cols, -float("inf"),
                                         softcap, HAS_SOFTCAP)  # fmt: skip
                else:
                    x = _load_chunk(row_ptrs, stride_logits_col, mask_m, start - BLOCK_N + offs_n, n_cols,
                                    -float("inf"), softcap, HAS_SOFTCAP)  # fmt: skip
                new_max = tl.maximum(row_max, tl.max(x, axis=1))
                # Rows that have seen only -inf keep a zero sum instead of exp(-inf - -inf) = NaN.
                shift = tl.where(new_max == -float("inf"), 0.0, new_max)
                sum_exp = sum_exp * tl.exp(row_max - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
                row_max = new_max
                if HAS_SMOOTHING:
                    mask = _chunk_mask(mask_m, start - BLOCK_N + offs_n, n_cols)
                    row_sum += tl.sum(tl.where(mask, x, 0.0), axis=1)
                if PREFETCH:
                    x = x_next
            lse = row_max + tl.log(sum_exp)
            in_range = valid & (target >= 0) & (target < n_cols)
            target_logit = tl.load(row_ptrs + target * stride_logits_col, mask=in_range, other=float("nan"))
            target_logit = target_logit.to(tl.float32)
            if HAS_SOFTCAP:
                target_logit, _ = _softcap(target_logit, softcap)
            loss = lse - target_logit
            if HAS_SMOOTHING:
                loss = lse - (1.0 - label_smoothing) * target_logit - label_smoothing * row_sum / n_classes
            z_loss = tl.zeros([BLOCK_M], dtype=tl.float32)
            if HAS_Z_LOSS:
                z_loss = lse_square_scale * lse * lse
                loss += z_loss
            loss = tl.where(valid, loss, 0.0)
            z_loss = tl.where(valid, z_loss, 0.0)
            if REDUCE:
                loss_sum += loss.to(tl.float64)
                z_loss_sum += z_loss.to(tl.float64)
                valid_sum += valid.to(tl.int32)
            else:
                tl.store(loss_ptr + offs_m, loss.to(loss_ptr.dtype.element_ty), mask=mask_m)
                if STORE_Z_LOSS:
                    tl.store(z_loss_ptr + offs_m, z_loss.to(z_loss_ptr.dtype.element_ty), mask=mask_m)
            tl.store(lse_ptr + offs_m, lse, mask=mask_m)
        else:
            lse = tl.load(lse_ptr + offs_m, mask=mask_m, other=0.0)
        if COMPUTE_GRAD:
            scale = grad_scale
            if HAS_ROW_SCALE:
                row_scale = tl.load(row_scale_ptr + offs_m * stride_row_scale, mask=mask_m, other=0.0)
                scale = grad_scale * row_scale.to(tl.float32)
            # Selected, not multiplied by 0: an ignored row's upstream gradient may be NaN or inf
            # (a per-sequence mean over a sequence of padding only), and torch gives that row 0.
            # A row whose target is out of range gets NaN, as its loss.
            scale = tl.where(valid, scale, 0.0)
            scale = tl.where(valid & ((target < 0) | (target >= n_classes)), float("nan"), scale)
            softmax_scale = scale
            if HAS_Z_LOSS:
                softmax_scale = scale * (1.0 + 2.0 * lse_square_scale * lse)
            target_grad = scale
            if HAS_SMOOTHING:
                target_grad = scale * (1.0 - label_smoothing)
            uniform_grad = scale * label_smoothing / n_classes
            target_col = target - col_start  # this launch's column of the target class, if it has it
            grad_row_ptrs = grad_ptr + offs_m * stride_grad_row
            # Last chunk first (see the module docstring); `start` walks down to the first chunk,
            # the prefetch past it is fully masked.
            last = (n_chunks - 1) * BLOCK_N
            # The raw logits: the cap's derivative needs them (masked columns are not stored).
            if PREFETCH:
                x = _load_chunk(row_ptrs, stride_logits_col, mask_m, last + offs_n, n_cols, 0.0, softcap, False)
            for chunk in range(0, n_chunks):
                cols = last - chunk * BLOCK_N + offs_n
                if PREFETCH:
                    x_next = _load_chunk(row_ptrs, stride_logits_col, mask_m, cols - BLOCK_N, n_cols, 0.0, softcap,
                                         False)  # fmt: skip
                else:
                    x = _load_chunk(row_ptrs, stride_logits_col, mask_m, cols, n_cols, 0.0, softcap, False)
                logit = x
                if HAS_SOFTCAP:
                    logit, cap_grad = _softcap(x, softcap)
                grad = tl.exp(logit - lse[:, None]) * softmax_scale[:, None]
                grad -= tl.where(cols[None, :] == target_col[:, None], target_grad[:, None], 0.0)
                if HAS_SMOOTHING:
                    grad -= uniform_grad[:, None]
                if HAS_SOFTCAP:
                    grad *= cap_grad
                grad_ptrs = grad_row_ptrs[:, None] + _col_offsets(cols, stride_grad_col)[None, :]
                tl.store(grad_ptrs, grad.to(grad_ptr.dtype.element_ty), mask=_chunk_mask(mask_m, cols, n_cols))
                if PREFETCH:
                    x = x_next
    if REDUCE:
        out = partial_ptr + PARTIAL_ENTRIES * pid
        tl.store(out, tl.sum(loss_sum, axis=0))
        tl.store(out + 1, tl.sum(z_loss_sum, axis=0))
        tl.store(out + 2, tl.sum(valid_sum, axis=0).to(tl.float64))


@triton.jit(do_not_specialize=["n_partials"])
def _loss_finalize_kernel(
    partial_ptr, loss_ptr, z_loss_ptr,
    n_partials,
    MEAN: tl.constexpr, STORE_Z_LOSS: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    """loss (and z_loss) = the sum of the (n_partials, 3) fp64 partials, divided by the number of
    valid rows (their third entries) for a mean (0 / 0 = NaN when there are none, as torch), in
    their own dtypes."""
    offs = tl.arange(0, BLOCK_P)
    loss_sum = tl.zeros([BLOCK_P], dtype=tl.float64)
    z_loss_sum = tl.zeros([BLOCK_P], dtype=tl.float64)
    count_sum = tl.zeros([BLOCK_P], dtype=tl.float64)
    for start in range(0, n_partials, BLOCK_P):
        mask = start + offs < n_partials
        entries = partial_ptr + PARTIAL_ENTRIES * (start + offs)
        loss_sum += tl.load(entries, mask=mask, other=0.0)
        z_loss_sum += tl.load(entries + 1, mask=mask, other=0.0)
        count_sum += tl.load(entries + 2, mask=mask, other=0.0)
    loss = tl.sum(loss_sum, axis=0)
    z_loss = tl.sum(z_loss_sum, axis=0)
    if MEAN:
        count = tl.sum(count_sum, axis=0)
        loss = loss / count
        z_loss = z_loss / count
    tl.store(loss_ptr, loss.to(tl.float32).to(loss_ptr.dtype.element_ty))
    if STORE_Z_LOSS:
        tl.store(z_loss_ptr, z_loss.to(tl.float32).to(z_loss_ptr.dtype.element_ty))


@triton.jit(do_not_specialize=["n_rows", "stride_target", "n_targets", "ignore_index"])
def _scale_kernel(
    x_ptr, scale_ptr, target_ptr,
    stride_x_row, stride_x_col, stride_target,
    n_rows, n_cols, n_targets, ignore_index,
    ROW_TARGETS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """x *= scale (a one-element tensor), in place, persistent over (BLOCK_M, BLOCK_N) tiles.

    Every program reads the scale first and touches nothing when it is 1: the common backward of
    a mean or summed loss costs one launch and no memory traffic, and no host synchronization.
    What ignored rows contribute to x stays as it is whatever the scale, NaN or inf included, as
    in torch: with ROW_TARGETS row i of x belongs to target i (logits or hidden-state gradients)
    and ignored rows keep their values; without, x sums over every row (weight or bias
    gradients) and is left as it is when none of the n_targets targets is valid.
    """
    scale = tl.load(scale_ptr).to(tl.float32)
    active = scale != 1.0
    if not ROW_TARGETS:
        if active:
            active = _count_valid(target_ptr, stride_target, n_targets, ignore_index) > 0
    if active:
        n_col_tiles = (n_cols + BLOCK_N - 1) // BLOCK_N
        n_tiles = (n_rows + BLOCK_M - 1) // BLOCK_M * n_col_tiles
        for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            offs_m = ((tile // n_col_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            offs_n = (tile % n_col_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
            mask_m = offs_m < n_rows
            mask = mask_m[:, None] & (offs_n < n_cols)[None, :]
            ptrs = x_ptr + offs_m[:, None] * stride_x_row + _col_offsets(offs_n, stride_x_col)[None, :]
            x = tl.load(ptrs, mask=mask, other=0.0)
            y = (x.to(tl.float32) * scale).to(x_ptr.dtype.element_ty)
            if ROW_TARGETS:
                target = tl.load(target_ptr + offs_m * stride_target, mask=mask_m, other=ignore_index)
                y = tl.where((target == ignore_index)[:, None], x, y)
            tl.store(ptrs, y, mask=mask)
