"""Persistent TMA matmul for Hopper (Triton >= 3.4): same contract as kernels.matmul, 16-bit operands.

    C[b] = act(prologue(A[b]) @ B[b] + bias)

NUM_SMS * PROGRAMS_PER_SM programs each walk output tiles tile_id = pid, pid + programs, ... in
grouped order (common._grouped_tile); with two programs per SM, one's epilogue overlaps the
other's main loop (configs.tma_configs). Operands arrive through tensor descriptors: the TMA engine copies each
BLOCK tile into swizzled shared memory and wgmma reads it from there, so no thread computes an
address in the main loop; the loop over (tile, k) is flattened, so the next tile's loads are in
flight while this tile's epilogue runs, and the epilogue's TMA stores drain behind the next
tile's math. Out-of-bounds TMA reads return zeros (the K tail needs no mask), and stores clip.

Layouts: a descriptor needs a unit stride in its last dim. A logical operand whose memory is
the transpose (e.g. B = W^T when W is an nn.Linear weight, or A = dY^T in dW = dY^T X) is read
through a descriptor of the transpose and transposed in the kernel (*_TRANS), which wgmma
consumes directly from shared memory. BATCHED uses 3-D descriptors (batch, rows, cols) so that
a tile never crosses into the next batch.

The prologue (PROLOGUE, ROW_SUM) and epilogue (HAS_BIAS, ACTIVATION, STORE_AUX) are those of
kernels.matmul, from the same helpers. UPCAST: interpreter only (fp32 dot operands, rounded bf16 casts).
"""

import triton
import triton.language as tl

from .._compat import AUTOTUNE_TIMING
from .common import PRO_NONE, _bias_activation, _cast, _grouped_tile, _scale_operand
from .configs import TMA_KEY, prune_tma_configs, tma_configs


@triton.jit
def _load_tile(desc, batch, off_0, off_1, BLOCK_0: tl.constexpr, BLOCK_1: tl.constexpr, TRANS: tl.constexpr,
               BATCHED: tl.constexpr):  # fmt: skip
    """The (BLOCK_0, BLOCK_1) tile at (off_0, off_1) of a matrix stored row-major, or transposed (TRANS)."""
    if TRANS:
        if BATCHED:
            tile = tl.reshape(desc.load([batch, off_1, off_0]), [BLOCK_1, BLOCK_0])
        else:
            tile = desc.load([off_1, off_0])
        tile = tl.trans(tile)
    else:
        if BATCHED:
            tile = tl.reshape(desc.load([batch, off_0, off_1]), [BLOCK_0, BLOCK_1])
        else:
            tile = desc.load([off_0, off_1])
    return tile


@triton.jit
def _store_tile(desc, batch, off_0, off_1, tile, TRANS: tl.constexpr, BATCHED: tl.constexpr):
    """Store `tile` at (off_0, off_1) of a matrix stored row-major, or transposed (TRANS)."""
    if TRANS:
        tile = tl.trans(tile)
        if BATCHED:
            desc.store([batch, off_1, off_0], tl.expand_dims(tile, 0))
        else:
            desc.store([off_1, off_0], tile)
    else:
        if BATCHED:
            desc.store([batch, off_0, off_1], tl.expand_dims(tile, 0))
        else:
            desc.store([off_0, off_1], tile)


@triton.autotune(
    configs=tma_configs(), key=TMA_KEY, prune_configs_by={"early_config_prune": prune_tma_configs}, **AUTOTUNE_TIMING
)
@triton.jit
def _matmul_tma_kernel(
    a_desc,
    b_desc,
    c_desc,
    s_desc,
    aux_desc,
    bias_ptr,
    row_sum_ptr,
    stride_bias,
    stride_row_sum_batch,
    M,
    N,
    K,
    BATCH,
    PROLOGUE: tl.constexpr,
    ROW_SUM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    STORE_AUX: tl.constexpr,
    A_TRANS: tl.constexpr,
    B_TRANS: tl.constexpr,
    C_TRANS: tl.constexpr,
    BATCHED: tl.constexpr,
    UPCAST: tl.constexpr,
    NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr,
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_batch = num_pid_m * num_pid_n
    num_tiles = BATCH * tiles_per_batch
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SMS * PROGRAMS_PER_SM, flatten=True):
        batch = tile_id // tiles_per_batch
        pid_m, pid_n = _grouped_tile(tile_id % tiles_per_batch, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
            a = _load_tile(a_desc, batch, off_m, off_k, BLOCK_M, BLOCK_K, A_TRANS, BATCHED)
            b = _load_tile(b_desc, batch, off_k, off_n, BLOCK_K, BLOCK_N, B_TRANS, BATCHED)
            if PROLOGUE != PRO_NONE:
                s = _load_tile(s_desc, batch, off_m, off_k, BLOCK_M, BLOCK_K, A_TRANS, BATCHED)
                a_scaled = _scale_operand(a, s, PROLOGUE)
                if ROW_SUM:
                    if pid_n == 0:
                        row_sum += tl.sum(a_scaled, axis=1)
                a = _cast(a_scaled, b.dtype, UPCAST)
            elif ROW_SUM:
                if pid_n == 0:
                    row_sum += tl.sum(a.to(tl.float32), axis=1)
            if UPCAST:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
            else:
                acc = tl.dot(a, b, acc)

        cols = off_n + tl.arange(0, BLOCK_N)
        y, grad = _bias_activation(acc, bias_ptr, stride_bias, cols, N, HAS_BIAS, ACTIVATION)
        _store_tile(c_desc, batch, off_m, off_n, _cast(y, c_desc.dtype, UPCAST), C_TRANS, BATCHED)
        if STORE_AUX:
            _store_tile(aux_desc, batch, off_m, off_n, _cast(grad, aux_desc.dtype, UPCAST), C_TRANS, BATCHED)
        if ROW_SUM:
            rows = off_m + tl.arange(0, BLOCK_M)
            row_sum_ptrs = row_sum_ptr + batch.to(tl.int64) * stride_row_sum_batch + rows
            rows_written = tl.where(pid_n == 0, M, 0)
            tl.store(row_sum_ptrs, _cast(row_sum, row_sum_ptr.dtype.element_ty, UPCAST), mask=rows < rows_written)
