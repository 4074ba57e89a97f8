"""The down projection of a skinny MLP call: y = h @ w_down (+ b_down) for a few rows.

A decode step multiplies one row of h (or a few) by w_down, so the weight's bytes are its time.
One program per (BLOCK_N columns, BLOCK_M rows) of y streams those columns of w_down over the
whole reduction: a 2048-wide output at 16 columns a program fills 128 SMs, each reading its
columns once. (cuBLAS splits the reduction of such products and sums the parts in a second
kernel.) 16-bit operands, fp32 accumulation, one rounding at the store.
"""

import triton
import triton.language as tl

from .._compat import AUTOTUNE_TIMING
from .configs import down_projection_configs
from .matmul import _accumulate_matmul, _store, _wrapped_offsets, _zeros

DOWN_PROJECTION_KEY = ["M", "N", "K", "HAS_BIAS"]


@triton.autotune(configs=down_projection_configs(), key=DOWN_PROJECTION_KEY, **AUTOTUNE_TIMING)
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M"])
def _down_projection_kernel(
    h_ptr,
    wd_ptr,
    bd_ptr,
    y_ptr,
    stride_hm,
    stride_hk,
    stride_wk,
    stride_wn,
    stride_ym,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    num_n = tl.cdiv(N, BLOCK_N)
    pid_n = tl.program_id(0) % num_n  # neighbouring programs share h's rows and stream w_down side by side
    pid_m = tl.program_id(0) // num_n
    acc = _accumulate_matmul(
        _zeros(BLOCK_M, BLOCK_N, False), h_ptr, wd_ptr,
        _wrapped_offsets(pid_m, M, BLOCK_M), _wrapped_offsets(pid_n, N, BLOCK_N),
        stride_hm, stride_hk, stride_wk, stride_wn, K, False, False, UPCAST, BLOCK_K, EVEN_K,
    )  # fmt: skip
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(bd_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    _store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + offs_n[None, :], acc, mask, UPCAST)
