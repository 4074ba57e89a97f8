"""The backward's elementwise pass: dZ = dY * act'(Z) and the column sums of dZ (d(bias)), in one read.

    dz[r, :] = dy[r, :] * act'(saved[r, :])      r over the batch * M rows
    partial[p, :] = sum of dz[r, :] over the rows of program p (fp32)

Both backward matmuls (dX = dZ @ W^T, dW^T = dZ^T @ X) then read dZ as a plain operand: the
persistent TMA kernel runs them at the plain matmul's speed. Forming dZ inside their main loops
instead (a prologue on the A tiles) put the A operand in registers, which Triton's Hopper
pipeline serializes (one wgmma in flight, the tile converted through shared memory): the
backward ran at half speed. This pass costs three M x N memory passes (read dy and saved, write
dz), the same as torch's gelu_backward, and d(bias) rides along for free.

Each program covers ROWS rows (a runtime count, a multiple of BLOCK_M) of one BLOCK_N column
slice, in BLOCK_M-row steps, and writes its column sums (fp32; fp64 for fp32 gradients) to
partial[pid_m]; the launcher adds the few partial rows up (deterministic: no atomics). Without an
activation (ACTIVATION = 0, WRITE_DZ off) it only sums dy's columns: d(bias) of a plain biased layer.

dy has any strides (batch, M, N); saved and dz are contiguous (batch, M, N). Offsets are int64.
UPCAST: interpreter only (plain division and exp instead of inline PTX, rounded bf16 casts).
"""

import triton
import triton.language as tl

from .common import _activation_grad, _cast


# M and ROWS only bound loops and masks across rows: unspecialized, one compile serves every row count.
@triton.jit(do_not_specialize=["M", "ROWS"])
def _activation_grad_kernel(
    dy_ptr,
    saved_ptr,
    dz_ptr,
    partial_ptr,
    stride_dy_batch,
    stride_dy_m,
    stride_dy_n,
    M,
    N,
    ROWS,
    ACTIVATION: tl.constexpr,
    WRITE_DZ: tl.constexpr,
    COLUMN_SUM: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Axis 0: the row ranges of every batch, batch-major (partial's row index); axis 1: column slices.
    pid = tl.program_id(0)
    row_programs = tl.cdiv(M, ROWS)
    batch = (pid // row_programs).to(tl.int64)
    first = (pid % row_programs) * ROWS
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    cols64 = cols.to(tl.int64)
    # Column sums accumulate in a whole tile of fp32 registers and reduce across rows once, at the
    # end: a reduction per row step would cross warps through shared memory (a barrier) each time.
    # fp64 column sums for fp32 gradients (partial is fp64 then): summed in fp32 here, d(bias) came
    # out 1.5-2x less accurate than torch's sum of the same dz on the H100.
    col_sum = tl.zeros((BLOCK_M, BLOCK_N), dtype=partial_ptr.dtype.element_ty)
    for start in range(first, tl.minimum(first + ROWS, M), BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        rows64 = rows.to(tl.int64)
        mask = (rows < M)[:, None] & col_in[None, :]
        dy_offs = batch * stride_dy_batch + rows64[:, None] * stride_dy_m + cols64[None, :] * stride_dy_n
        dy = tl.load(dy_ptr + dy_offs, mask=mask, other=0.0).to(tl.float32)
        offs = (batch * M + rows64)[:, None] * N + cols64[None, :]
        if ACTIVATION != 0:
            saved = tl.load(saved_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            dz = _activation_grad(dy, saved, ACTIVATION, UPCAST, dy_ptr.dtype.element_ty == tl.float32)
        else:
            dz = dy
        if WRITE_DZ:
            tl.store(dz_ptr + offs, _cast(dz, dz_ptr.dtype.element_ty, UPCAST), mask=mask)
        if COLUMN_SUM:
            col_sum += dz.to(partial_ptr.dtype.element_ty)
    if COLUMN_SUM:
        tl.store(partial_ptr + pid.to(tl.int64) * N + cols64, tl.sum(col_sum, axis=0), mask=col_in)
