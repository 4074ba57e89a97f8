"""Softmax and log-softmax over the last dim of a (rows, cols) view, forward and backward.

Two shapes of kernel, chosen by the launcher from the row width:
- one block holds whole rows (BLOCK_M rows x BLOCK_N >= cols): each row is read once and
  written once, the memory floor;
- rows wider than a block are streamed in BLOCK_N chunks: a first pass keeps a running max and
  sum per lane (online softmax, one reduction at the end), a second pass writes the output.
  That reads the row twice; the second read mostly hits L2.
Statistics are fp32 whatever the input dtype. Rows whose entries are all -inf give NaN, as
torch does. Offsets are int64, so tensors past 2^31 elements are addressed correctly.
"""

import triton
import triton.language as tl


@triton.jit
def _softmax_from_stats(x, row_max, denom, LOG: tl.constexpr):
    """softmax(x) or log_softmax(x), given the row max and sum(exp(x - max)) (fp32)."""
    if LOG:
        return x - row_max - tl.log(denom)
    return tl.exp(x - row_max) / denom


@triton.jit
def _softmax_grad(y, dy, row_dot, LOG: tl.constexpr):
    """dx from the output y, dy and the row reduction (sum(y*dy) for softmax, sum(dy) for log)."""
    if LOG:
        return dy - tl.exp(y) * row_dot
    return y * (dy - row_dot)


@triton.jit(do_not_specialize=["n_rows"])  # rows only mask whole rows: no recompile per row count
def _softmax_fwd_kernel(
    x_ptr,
    y_ptr,
    stride_x_row,
    stride_x_col,
    stride_y_row,
    n_rows,
    n_cols,
    LOG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    mask = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)
    x_ptrs = x_ptr + offs_m[:, None] * stride_x_row + offs_n[None, :] * stride_x_col
    x = tl.load(x_ptrs, mask=mask, other=-float("inf")).to(tl.float32)
    row_max = tl.max(x, axis=1)[:, None]
    denom = tl.sum(tl.exp(x - row_max), axis=1)[:, None]
    y = _softmax_from_stats(x, row_max, denom, LOG)
    y_ptrs = y_ptr + offs_m[:, None] * stride_y_row + offs_n[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_chunked_kernel(
    x_ptr,
    y_ptr,
    stride_x_row,
    stride_x_col,
    stride_y_row,
    n_cols,
    LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x_row
    y_row = y_ptr + row * stride_y_row
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    # Per-lane running max and sum of exp(x - max): no reduction inside the loop.
    lane_max = tl.full([BLOCK_N], -float("inf"), tl.float32)
    lane_sum = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs_n
        x = tl.load(x_row + cols * stride_x_col, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(lane_max, x)
        # A lane that has seen only -inf keeps a sum of 0 instead of exp(-inf - -inf) = NaN.
        shift = tl.where(new_max == -float("inf"), 0.0, new_max)
        lane_sum = lane_sum * tl.exp(lane_max - shift) + tl.exp(x - shift)
        lane_max = new_max
    row_max = tl.max(lane_max, axis=0)
    # An all -inf row gives NaN here (-inf - -inf), as torch.softmax does.
    denom = tl.sum(lane_sum * tl.exp(lane_max - row_max), axis=0)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs_n
        mask = cols < n_cols
        x = tl.load(x_row + cols * stride_x_col, mask=mask, other=-float("inf")).to(tl.float32)
        y = _softmax_from_stats(x, row_max, denom, LOG)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n_rows"])
def _softmax_bwd_kernel(
    y_ptr,
    dy_ptr,
    dx_ptr,
    stride_y_row,
    stride_dy_row,
    stride_dy_col,
    stride_dx_row,
    n_rows,
    n_cols,
    LOG: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    mask = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)
    y = tl.load(y_ptr + offs_m[:, None] * stride_y_row + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    dy_ptrs = dy_ptr + offs_m[:, None] * stride_dy_row + offs_n[None, :] * stride_dy_col
    dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
    if LOG:
        row_dot = tl.sum(dy, axis=1)[:, None]
    else:
        row_dot = tl.sum(y * dy, axis=1)[:, None]
    dx = _softmax_grad(y, dy, row_dot, LOG)
    tl.store(dx_ptr + offs_m[:, None] * stride_dx_row + offs_n[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_chunked_kernel(
    y_ptr,
    dy_ptr,
    dx_ptr,
    stride_y_row,
    stride_dy_row,
    stride_dy_col,
    stride_dx_row,
    n_cols,
    LOG: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * stride_y_row
    dy_row = dy_ptr + row * stride_dy_row
    dx_row = dx_ptr + row * stride_dx_row
    offs_n = tl.arange(0, BLOCK_N).to(tl.int64)
    lane_dot = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs_n
        mask = cols < n_cols
        dy = tl.load(dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            lane_dot += dy
        else:
            lane_dot += tl.load(y_row + cols, mask=mask, other=0.0).to(tl.float32) * dy
    row_dot = tl.sum(lane_dot, axis=0)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + offs_n
        mask = cols < n_cols
        y = tl.load(y_row + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols * stride_dy_col, mask=mask, other=0.0).to(tl.float32)
        dx = _softmax_grad(y, dy, row_dot, LOG)
        tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
