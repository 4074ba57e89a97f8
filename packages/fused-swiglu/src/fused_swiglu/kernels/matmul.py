"""Matmul building blocks shared by the SwiGLU kernels: tile order, one dot step, the main loops.

Conventions: a program computes a (BLOCK_P, BLOCK_Q) output tile and reduces over R in BLOCK_R
steps. Row and column indices are wrapped modulo the sizes (`offs % P`), so the operand loads
need no row/column masks (the extra rows and columns repeat valid data and are masked at the
store); only the reduction tail is masked, and not at all when EVEN_R (R % BLOCK_R == 0).
Indices are int64 before they meet a stride, so tensors past 2^31 elements are addressed
correctly; the main loops then advance pointers, which are 64-bit.

Precision of the dot step (`_dot`): 16-bit operands accumulate in fp32 on the tensor cores
(acc += a @ b, one wgmma/mma chain); fp16 accumulation (FastAccumFusedSwiGLU) likewise in fp16.
fp32 operands run as IEEE fp32 (FMA, no tensor cores) unless torch's allow_tf32 opted in, and
each BLOCK_R-deep partial product is summed into a fresh accumulator before it is added to the
running one: a two-level sum whose rounding error grows with R / BLOCK_R + BLOCK_R instead of R
(a single FMA chain over R = 4096 rows made the fp32 weight gradients ~2x less accurate than
cuBLAS; modelled on the CPU, the chained sum errs 4x more than the chunked one).
"""

import triton
import triton.language as tl

from .._compat import HAS_INPUT_PRECISION

# Reduction steps per fp32 partial sum in _shared_a_matmul (8 x BLOCK_R products per partial).
FP32_STEPS_PER_PARTIAL = tl.constexpr(8)

if HAS_INPUT_PRECISION:

    @triton.jit
    def _fp32_dot(a, b, ALLOW_TF32: tl.constexpr):
        """a @ b of fp32 tiles into a fresh fp32 accumulator; the precision stated explicitly, so
        that no environment default (TRITON_F32_DEFAULT) can turn it into TF32 behind the user."""
        if ALLOW_TF32:
            product = tl.dot(a, b, input_precision="tf32")
        else:
            product = tl.dot(a, b, input_precision="ieee")
        return product

else:  # pragma: no cover - Triton < 3.0: allow_tf32 is the only switch (and nothing overrides it)

    @triton.jit
    def _fp32_dot(a, b, ALLOW_TF32: tl.constexpr):
        return tl.dot(a, b, allow_tf32=ALLOW_TF32)


@triton.jit
def _grouped_tile(pid, size_p, size_q, BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, GROUP: tl.constexpr):
    """Program id -> (pid_p, pid_q): GROUP row tiles sweep the column tiles together (L2 reuse)."""
    num_p = tl.cdiv(size_p, BLOCK_P)
    num_q = tl.cdiv(size_q, BLOCK_Q)
    per_group = GROUP * num_q
    first_p = (pid // per_group) * GROUP
    group_size = tl.minimum(num_p - first_p, GROUP)
    pid_p = first_p + (pid % per_group) % group_size
    pid_q = (pid % per_group) // group_size
    return pid_p, pid_q


@triton.jit
def _wrapped_offsets(pid, size, BLOCK: tl.constexpr):
    """int64 indices of a tile along one dim, wrapped into [0, size)."""
    return ((pid * BLOCK + tl.arange(0, BLOCK)) % size).to(tl.int64)


@triton.jit
def _dot(a, b, acc, ACC_FP16: tl.constexpr, ALLOW_TF32: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b, accumulated in acc's dtype (fp32, or fp16 when ACC_FP16).

    UPCAST (the interpreter): bf16/fp16 dots would run on raw bits there, so the product is taken
    in fp32 and rounded into the accumulator once per call. fp32 operands: a fresh partial sum
    per call, then one add (see the module docstring). ALLOW_TF32 only matters for fp32 operands
    (torch.backends.cuda.matmul.allow_tf32 decides it, as for torch's own matmuls).
    """
    if UPCAST:
        acc = (acc.to(tl.float32) + tl.dot(a.to(tl.float32), b.to(tl.float32))).to(acc.dtype)
    elif ACC_FP16:
        acc = tl.dot(a, b, acc, out_dtype=tl.float16)
    elif a.dtype == tl.float32:
        acc += _fp32_dot(a, b, ALLOW_TF32)
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _zeros(BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, ACC_FP16: tl.constexpr):
    if ACC_FP16:
        acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float16)
    else:
        acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float32)
    return acc


@triton.jit
def _shared_a_matmul(
    a_ptr,
    b1_ptr,
    b2_ptr,
    offs_p,
    offs_q,
    stride_a_p,
    stride_a_r,
    stride_b1_r,
    stride_b1_q,
    stride_b2_r,
    stride_b2_q,
    r_begin,
    r_end,
    ACC_FP16: tl.constexpr,
    ALLOW_TF32: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_R: tl.constexpr,
    EVEN_R: tl.constexpr,
):
    """(A @ B1, A @ B2) for one output tile over the reduction slice [r_begin, r_end): each A
    tile is loaded once and feeds both dots. r_begin is a multiple of BLOCK_R; EVEN_R: so is
    r_end - r_begin (no tail mask)."""
    offs_r = tl.arange(0, BLOCK_R)
    rows_r = (r_begin + offs_r).to(tl.int64)
    a_ptrs = a_ptr + offs_p[:, None] * stride_a_p + rows_r[None, :] * stride_a_r
    b1_ptrs = b1_ptr + rows_r[:, None] * stride_b1_r + offs_q[None, :] * stride_b1_q
    b2_ptrs = b2_ptr + rows_r[:, None] * stride_b2_r + offs_q[None, :] * stride_b2_q
    acc1 = _zeros(BLOCK_P, BLOCK_Q, ACC_FP16)
    acc2 = _zeros(BLOCK_P, BLOCK_Q, ACC_FP16)
    size_r = r_end - r_begin
    n_steps = tl.cdiv(size_r, BLOCK_R)
    if a_ptr.dtype.element_ty == tl.float32:
        if ALLOW_TF32:
            acc1, acc2, a_ptrs, b1_ptrs, b2_ptrs = _shared_a_steps(
                acc1, acc2, a_ptrs, b1_ptrs, b2_ptrs, stride_a_r, stride_b1_r, stride_b2_r, offs_r, size_r, 0,
                n_steps, ACC_FP16, ALLOW_TF32, UPCAST, BLOCK_R, EVEN_R,
            )  # fmt: skip
        else:
            # A third summation level for full-precision fp32: the weight gradients reduce over
            # every token (R = 4096+), where BLOCK_R partials alone left them 2.2-2.5x less
            # accurate than cuBLAS on the H100.
            for first in range(0, n_steps, FP32_STEPS_PER_PARTIAL):
                part1 = _zeros(BLOCK_P, BLOCK_Q, False)
                part2 = _zeros(BLOCK_P, BLOCK_Q, False)
                part1, part2, a_ptrs, b1_ptrs, b2_ptrs = _shared_a_steps(
                    part1, part2, a_ptrs, b1_ptrs, b2_ptrs, stride_a_r, stride_b1_r, stride_b2_r, offs_r, size_r,
                    first, tl.minimum(first + FP32_STEPS_PER_PARTIAL, n_steps), False, False, UPCAST, BLOCK_R,
                    EVEN_R,
                )  # fmt: skip
                acc1 += part1
                acc2 += part2
    else:
        acc1, acc2, a_ptrs, b1_ptrs, b2_ptrs = _shared_a_steps(
            acc1, acc2, a_ptrs, b1_ptrs, b2_ptrs, stride_a_r, stride_b1_r, stride_b2_r, offs_r, size_r, 0, n_steps,
            ACC_FP16, ALLOW_TF32, UPCAST, BLOCK_R, EVEN_R,
        )  # fmt: skip
    return acc1, acc2


@triton.jit
def _shared_a_steps(acc1, acc2, a_ptrs, b1_ptrs, b2_ptrs, stride_a_r, stride_b1_r, stride_b2_r, offs_r, size_r,
                    first, last, ACC_FP16: tl.constexpr, ALLOW_TF32: tl.constexpr, UPCAST: tl.constexpr,
                    BLOCK_R: tl.constexpr, EVEN_R: tl.constexpr):  # fmt: skip
    """Reduction steps [first, last) of _shared_a_matmul, added into (acc1, acc2); the pointers
    come back advanced past them."""
    for step in range(first, last):
        if EVEN_R:
            a = tl.load(a_ptrs)
            b1 = tl.load(b1_ptrs)
            b2 = tl.load(b2_ptrs)
        else:
            in_r = offs_r < size_r - step * BLOCK_R
            a = tl.load(a_ptrs, mask=in_r[None, :], other=0.0)
            b1 = tl.load(b1_ptrs, mask=in_r[:, None], other=0.0)
            b2 = tl.load(b2_ptrs, mask=in_r[:, None], other=0.0)
        acc1 = _dot(a, b1, acc1, ACC_FP16, ALLOW_TF32, UPCAST)
        acc2 = _dot(a, b2, acc2, ACC_FP16, ALLOW_TF32, UPCAST)
        a_ptrs += BLOCK_R * stride_a_r
        b1_ptrs += BLOCK_R * stride_b1_r
        b2_ptrs += BLOCK_R * stride_b2_r
    return acc1, acc2, a_ptrs, b1_ptrs, b2_ptrs


@triton.jit
def _accumulate_matmul(
    acc,
    a_ptr,
    b_ptr,
    offs_p,
    offs_q,
    stride_a_p,
    stride_a_r,
    stride_b_r,
    stride_b_q,
    size_r,
    ACC_FP16: tl.constexpr,
    ALLOW_TF32: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_R: tl.constexpr,
    EVEN_R: tl.constexpr,
):
    """acc + A @ B for one output tile: one dot per step, so the tensor-core pipeline keeps one
    step's MMAs in flight while the next step's tiles load."""
    offs_r = tl.arange(0, BLOCK_R)
    a_ptrs = a_ptr + offs_p[:, None] * stride_a_p + offs_r[None, :] * stride_a_r
    b_ptrs = b_ptr + offs_r[:, None] * stride_b_r + offs_q[None, :] * stride_b_q
    for step in range(0, tl.cdiv(size_r, BLOCK_R)):
        if EVEN_R:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            in_r = offs_r < size_r - step * BLOCK_R
            a = tl.load(a_ptrs, mask=in_r[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=in_r[:, None], other=0.0)
        acc = _dot(a, b, acc, ACC_FP16, ALLOW_TF32, UPCAST)
        a_ptrs += BLOCK_R * stride_a_r
        b_ptrs += BLOCK_R * stride_b_r
    return acc


@triton.jit
def _sum_of_products_matmul(
    a1_ptr,
    a2_ptr,
    b1_ptr,
    b2_ptr,
    offs_p,
    offs_q,
    stride_a_p,
    stride_a_r,
    stride_b1_r,
    stride_b1_q,
    stride_b2_r,
    stride_b2_q,
    size_r,
    PAIRS: tl.constexpr,
    ACC_FP16: tl.constexpr,
    ALLOW_TF32: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_R: tl.constexpr,
    EVEN_R: tl.constexpr,
):
    """A1 @ B1 (+ A2 @ B2 when PAIRS == 2) into one accumulator: one matmul over a 2R reduction.

    The pairs run as two loops one after the other, not as two dots in one loop: two dots into
    one accumulator per step made the compiler wait for the first step's MMAs before issuing the
    second's (`wgmma.wait_group 0` mid-loop, in the sm_90 PTX), draining the tensor-core pipeline
    twice per step. A1 and A2 share strides (two buffers of one shape); a2_ptr/b2_ptr are unused
    when PAIRS == 1.
    """
    acc = _zeros(BLOCK_P, BLOCK_Q, ACC_FP16)
    acc = _accumulate_matmul(
        acc, a1_ptr, b1_ptr, offs_p, offs_q, stride_a_p, stride_a_r, stride_b1_r, stride_b1_q, size_r,
        ACC_FP16, ALLOW_TF32, UPCAST, BLOCK_R, EVEN_R,
    )  # fmt: skip
    if PAIRS == 2:
        acc = _accumulate_matmul(
            acc, a2_ptr, b2_ptr, offs_p, offs_q, stride_a_p, stride_a_r, stride_b2_r, stride_b2_q, size_r,
            ACC_FP16, ALLOW_TF32, UPCAST, BLOCK_R, EVEN_R,
        )  # fmt: skip
    return acc


@triton.jit
def _store(ptrs, value, mask, UPCAST: tl.constexpr):
    """Store fp32 `value` in the pointee dtype, rounding to nearest even.

    The interpreter (UPCAST) truncates fp32 -> bf16 casts; there the rounding is done on the
    bits first (add half an ulp, ties to even, then drop the low 16 bits), so that stored
    intermediates (g, u, d_gate, d_up) carry no systematic bias into the next matmul.
    """
    dtype = ptrs.dtype.element_ty
    if UPCAST:
        if dtype == tl.bfloat16:
            bits = value.to(tl.int32, bitcast=True)
            bits += 0x7FFF + ((bits >> 16) & 1)
            value = (bits & -65536).to(tl.float32, bitcast=True)
    tl.store(ptrs, value.to(dtype), mask=mask)
