"""Portable tiled matmul with a fused epilogue: every Triton from 2.2, any GPU, any strides.

    C[b] = act(A[b] @ B[b] + bias),  A (batch, M, K), B (batch, K, N), C (batch, M, N)

One program per BLOCK_M x BLOCK_N output tile, tiles in grouped order (common._grouped_tile),
batches stacked along the one grid axis. The K loop streams BLOCK_K slices of A and B through
tl.dot with an fp32 accumulator; Triton pipelines the loads num_stages deep (cp.async on
sm_80, wgmma from shared memory on sm_90). Any strides. Loads are masked at the M and N edges
(never clamped: a clamped index would break the contiguity that lets a tile load as 16-byte
vectors) and at the K tail, which needs no mask when BLOCK_K divides K (EVEN_K). Along a unit
stride the loads vectorize when the size there is a multiple of 16, which Triton's argument
specialization tells the compiler.

Epilogue options (constexprs), fused in registers:
- HAS_BIAS, ACTIVATION: C = act(acc + bias[None, :]).
- STORE_Z: also write the pre-activation z = acc + bias to z_ptr (laid out like C), which the
  backward of a GELU reads (kernels.grad).
- ALLOW_TF32: fp32 operands through TF32 tensor cores; otherwise full-precision fp32 ("ieee").
- UPCAST: under the interpreter, bf16/fp16 dot operands are upcast to fp32 (its bf16 dot
  computes on raw bits), bf16 casts round explicitly (common._cast), and the activations divide
  and exponentiate plainly (compiled, they use rcp/ex2.approx.ftz through inline PTX).

Offsets are int64, so tensors past 2^31 elements are addressed correctly.
"""

import triton
import triton.language as tl

from .._runtime.compat import AUTOTUNE_TIMING
from .common import _activation, _add_bias, _cast, _grouped_tile
from .configs import EVEN_K_HEURISTIC, PORTABLE_KEY, portable_configs, prune_portable_configs

# K tiles per fp32 partial sum (see _matmul_kernel): 8 x BLOCK_K (32) = 256 products per partial.
FP32_SUM_GROUP = tl.constexpr(8)


@triton.jit
def _load_k_tiles(a_ptrs, b_ptrs, k, K, offs_k, row_in, col_in, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The k-th BLOCK_K slices of A and B; zeros past the M/N edges and, unless EVEN_K, past K."""
    if EVEN_K:
        a = tl.load(a_ptrs, mask=row_in[:, None], other=0.0)
        b = tl.load(b_ptrs, mask=col_in[None, :], other=0.0)
    else:
        k_in = offs_k < K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=row_in[:, None] & k_in[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_in[:, None] & col_in[None, :], other=0.0)
    return a, b


@triton.jit
def _round_to_tf32(x):
    """fp32 rounded to TF32's 10 mantissa bits, to nearest (ties away, as cvt.rna.tf32.f32): the
    tensor cores read fp32 operands by dropping the low 13 bits, a truncation whose bias doubled
    the error against cuBLAS (which rounds) on the H100."""
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _accumulate(a_ptrs, b_ptrs, stride_ak, stride_bk, K, offs_k, row_in, col_in, ALLOW_TF32: tl.constexpr,
                UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN_K: tl.constexpr):  # fmt: skip
    """A @ B for one tile, every K slice's products added into one fp32 accumulator."""
    # Pointer steps along K in int64: BLOCK_K * stride can pass 2^31 for a transposed operand.
    step_k = tl.full((), BLOCK_K, tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a, b = _load_k_tiles(a_ptrs, b_ptrs, k, K, offs_k, row_in, col_in, BLOCK_K, EVEN_K)
        if ALLOW_TF32:  # fp32 operands only
            a = _round_to_tf32(a)
            b = _round_to_tf32(b)
        if UPCAST:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, allow_tf32=ALLOW_TF32)
        else:
            acc = tl.dot(a, b, acc, allow_tf32=ALLOW_TF32)
        a_ptrs += step_k * stride_ak
        b_ptrs += step_k * stride_bk
    return acc


@triton.jit
def _accumulate_fp32_in_groups(a_ptrs, b_ptrs, stride_ak, stride_bk, K, offs_k, row_in, col_in,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               EVEN_K: tl.constexpr):  # fmt: skip
    """A @ B for one tile of full-precision fp32, summed in two levels.

    fp32 without TF32 runs on FMAs: in one accumulator each output is a chain of K roundings,
    3-6x cuBLAS' error at K ~ 4096 (seen on the H100). A fresh partial per FP32_SUM_GROUP slices,
    added to the total, brings it under cuBLAS'; the extra adds cost nothing beside the FMAs.
    """
    step_k = tl.full((), BLOCK_K, tl.int64)
    n_k = tl.cdiv(K, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_group in range(0, n_k, FP32_SUM_GROUP):
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(k_group, tl.minimum(k_group + FP32_SUM_GROUP, n_k)):
            a, b = _load_k_tiles(a_ptrs, b_ptrs, k, K, offs_k, row_in, col_in, BLOCK_K, EVEN_K)
            part += tl.dot(a, b, allow_tf32=False)
            a_ptrs += step_k * stride_ak
            b_ptrs += step_k * stride_bk
        acc += part
    return acc


# The autotuner holds the candidate configs and their prune rule. ops.launch times the candidates
# itself (ops.tuning: interleaved rounds, robust to the GPU's clock drift) and launches the JIT
# function directly; the autotuner times them only where this kernel is called through it.
@triton.autotune(
    configs=portable_configs(),
    key=PORTABLE_KEY,
    prune_configs_by={"early_config_prune": prune_portable_configs},
    **AUTOTUNE_TIMING,
)
@triton.heuristics({"EVEN_K": EVEN_K_HEURISTIC})
@triton.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    z_ptr,
    bias_ptr,
    stride_a_batch,
    stride_am,
    stride_ak,
    stride_b_batch,
    stride_bk,
    stride_bn,
    stride_c_batch,
    stride_cm,
    stride_cn,
    stride_bias,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    STORE_Z: tl.constexpr,
    ALLOW_TF32: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles_per_batch = num_pid_m * num_pid_n
    batch = (pid // tiles_per_batch).to(tl.int64)
    pid_m, pid_n = _grouped_tile(pid % tiles_per_batch, num_pid_m, num_pid_n, GROUP_M)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in = rows < M
    col_in = cols < N
    rows64 = rows.to(tl.int64)
    cols64 = cols.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + batch * stride_a_batch + rows64[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + batch * stride_b_batch + offs_k[:, None] * stride_bk + cols64[None, :] * stride_bn

    if a_ptr.dtype.element_ty == tl.float32:
        if ALLOW_TF32:
            acc = _accumulate(a_ptrs, b_ptrs, stride_ak, stride_bk, K, offs_k, row_in, col_in, True, UPCAST,
                              BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)  # fmt: skip
        else:
            acc = _accumulate_fp32_in_groups(a_ptrs, b_ptrs, stride_ak, stride_bk, K, offs_k, row_in, col_in,
                                             BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)  # fmt: skip
    else:
        acc = _accumulate(a_ptrs, b_ptrs, stride_ak, stride_bk, K, offs_k, row_in, col_in, False, UPCAST,
                          BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)  # fmt: skip

    z = _add_bias(acc, bias_ptr, stride_bias, cols, N, HAS_BIAS)
    y = _activation(z, ACTIVATION, UPCAST, c_ptr.dtype.element_ty == tl.float32)
    mask = row_in[:, None] & col_in[None, :]
    c_offs = batch * stride_c_batch + rows64[:, None] * stride_cm + cols64[None, :] * stride_cn
    tl.store(c_ptr + c_offs, _cast(y, c_ptr.dtype.element_ty, UPCAST), mask=mask)
    if STORE_Z:
        tl.store(z_ptr + c_offs, _cast(z, z_ptr.dtype.element_ty, UPCAST), mask=mask)
