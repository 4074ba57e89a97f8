"""SwiGLU forward: h = silu(x @ w_gate + b_gate) * (x @ w_up + b_up) in one kernel.

One program computes a (BLOCK_M, BLOCK_N) tile of h. Its main loop loads each (BLOCK_M,
BLOCK_K) tile of x once and multiplies it by the matching tiles of both weights into two
accumulators (fp32, or fp16 for FastAccumFusedSwiGLU); the epilogue adds the biases, applies
silu(g) * u in fp32 and writes h. When a backward will follow (SAVE_GU) it also writes g and u,
rounded to the operand dtype: the backward needs nothing else, and re-deriving them would cost
a second pair of matmuls (see ops/swiglu.py for the trade-off).
"""

import triton
import triton.language as tl

from .activation import _swiglu
from .configs import forward_configs
from .matmul import _grouped_tile, _shared_a_matmul, _store, _wrapped_offsets


@triton.autotune(configs=forward_configs(), key=["M", "N", "K", "SAVE_GU", "HAS_BIAS", "ACC_FP16"])
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit
def _swiglu_fwd_kernel(
    x_ptr,
    wg_ptr,
    wu_ptr,
    bg_ptr,
    bu_ptr,
    h_ptr,
    g_ptr,
    u_ptr,
    stride_xm,
    stride_xk,
    stride_wgk,
    stride_wgn,
    stride_wuk,
    stride_wun,
    stride_hm,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    SAVE_GU: tl.constexpr,
    ACC_FP16: tl.constexpr,
    ALLOW_TF32: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc_g, acc_u = _shared_a_matmul(
        x_ptr, wg_ptr, wu_ptr,
        _wrapped_offsets(pid_m, M, BLOCK_M), _wrapped_offsets(pid_n, N, BLOCK_N),
        stride_xm, stride_xk, stride_wgk, stride_wgn, stride_wuk, stride_wun,
        K, ACC_FP16, ALLOW_TF32, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
    )  # fmt: skip
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    g = acc_g.to(tl.float32)
    u = acc_u.to(tl.float32)
    if HAS_BIAS:
        g += tl.load(bg_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        u += tl.load(bu_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m.to(tl.int64)[:, None] * stride_hm + offs_n[None, :]
    _store(h_ptr + offs, _swiglu(g, u), mask, UPCAST)
    if SAVE_GU:
        _store(g_ptr + offs, g, mask, UPCAST)
        _store(u_ptr + offs, u, mask, UPCAST)
