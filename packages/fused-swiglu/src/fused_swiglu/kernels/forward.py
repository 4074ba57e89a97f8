"""SwiGLU forward: h = act(x @ w_gate + b_gate) * (x @ w_up + b_up) in one kernel, act the
ACTIVATION constexpr's (SiLU, or GELU-tanh for GeGLU; kernels/activation.py).

One program computes a (BLOCK_M, BLOCK_N) tile of h. Its main loop loads each (BLOCK_M,
BLOCK_K) tile of x once and multiplies it by the matching tiles of both weights into two
accumulators (fp32, or fp16 for FastAccumFusedSwiGLU); the epilogue adds the biases, applies
act(g) * u in fp32 and writes h. When a backward will follow (SAVE_GU) it also writes g and u,
rounded to the operand dtype: the backward needs nothing else, and re-deriving them would cost
a second pair of matmuls (see ops/swiglu.py for the trade-off).
"""

import triton
import triton.language as tl

from .._compat import AUTOTUNE_TIMING
from .activation import _swiglu
from .configs import forward_configs, forward_tma_configs, prune_forward
from .matmul import _dot, _grouped_tile, _shared_a_matmul, _store, _wrapped_offsets, _zeros

FORWARD_KEY = ["M", "N", "K", "SAVE_GU", "HAS_BIAS", "ACC_FP16", "ACTIVATION"]


@triton.jit
def _swiglu_fwd_epilogue(
    acc_g,
    acc_u,
    pid_m,
    pid_n,
    bg_ptr,
    bu_ptr,
    h_ptr,
    g_ptr,
    u_ptr,
    stride_hm,
    M,
    N,
    HAS_BIAS: tl.constexpr,
    SAVE_GU: tl.constexpr,
    UPCAST: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Biases, h = act(g) * u in fp32, and the stores of h (and of g, u when SAVE_GU)."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    g = acc_g.to(tl.float32)
    u = acc_u.to(tl.float32)
    if HAS_BIAS:
        g += tl.load(bg_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        u += tl.load(bu_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offs = offs_m.to(tl.int64)[:, None] * stride_hm + offs_n[None, :]
    _store(h_ptr + offs, _swiglu(g, u, ACTIVATION), mask, UPCAST)
    if SAVE_GU:
        _store(g_ptr + offs, g, mask, UPCAST)
        _store(u_ptr + offs, u, mask, UPCAST)


@triton.autotune(
    configs=forward_configs(),
    key=FORWARD_KEY,
    prune_configs_by={"early_config_prune": prune_forward},
    **AUTOTUNE_TIMING,
)
@triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M"])
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
    ACTIVATION: tl.constexpr,
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
        0, K, ACC_FP16, ALLOW_TF32, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
    )  # fmt: skip
    _swiglu_fwd_epilogue(
        acc_g, acc_u, pid_m, pid_n, bg_ptr, bu_ptr, h_ptr, g_ptr, u_ptr, stride_hm, M, N,
        HAS_BIAS, SAVE_GU, UPCAST, ACTIVATION, BLOCK_M, BLOCK_N,
    )  # fmt: skip


@triton.jit
def _swiglu_fwd_tma_epilogue(
    acc_g,
    acc_u,
    off_m,
    off_n,
    bg_ptr,
    bu_ptr,
    h_desc,
    g_desc,
    u_desc,
    N,
    HAS_BIAS: tl.constexpr,
    SAVE_GU: tl.constexpr,
    ACTIVATION: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The epilogue of `_swiglu_fwd_epilogue` with TMA stores: each tile goes from registers to
    shared memory and on to global memory as one asynchronous bulk copy (clipped at the edges),
    which drains while the program's next tile runs its main loop."""
    g = acc_g.to(tl.float32)
    u = acc_u.to(tl.float32)
    if HAS_BIAS:
        offs_n = off_n + tl.arange(0, BLOCK_N)
        g += tl.load(bg_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        u += tl.load(bu_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    h_desc.store([off_m, off_n], _swiglu(g, u, ACTIVATION).to(h_desc.dtype))
    if SAVE_GU:
        g_desc.store([off_m, off_n], g.to(g_desc.dtype))
        u_desc.store([off_m, off_n], u.to(u_desc.dtype))


@triton.autotune(
    configs=forward_tma_configs(),
    key=FORWARD_KEY,
    prune_configs_by={"early_config_prune": prune_forward},
    **AUTOTUNE_TIMING,
)
@triton.jit(do_not_specialize=["M"])
def _swiglu_fwd_tma_kernel(
    x_desc,
    wg_desc,
    wu_desc,
    h_desc,
    g_desc,
    u_desc,
    bg_ptr,
    bu_ptr,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    SAVE_GU: tl.constexpr,
    ACC_FP16: tl.constexpr,
    UPCAST: tl.constexpr,
    ACTIVATION: tl.constexpr,
    NUM_SMS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr,
    W_TRANSPOSED: tl.constexpr,
):
    """The Hopper variant (Triton >= 3.4, 16-bit operands and outputs with aligned, unit-stride
    rows), persistent: P = min(tiles, NUM_SMS * PROGRAMS_PER_SM) programs walk the tiles pid,
    pid + P, ... in grouped order. W_TRANSPOSED: the weights' descriptors read (N, K) rows (the
    storage of nn.Linear weights passed as transposed views), each (BLOCK_N, BLOCK_K) tile
    transposed in shared memory. Operand tiles arrive by TMA (zero-padded past the edges: no
    masks, no address registers in the main loop) and h, g, u leave by TMA stores, which drain
    behind the next tile's main loop. Measured at the headline (H100, 16384 x 2048 -> 5632):
    1.27 ms against 1.36 for the pointer kernel and 1.51 for this kernel with pointer stores and
    the (tile, k) loops flattened (Triton 3.6); cuBLAS takes 1.07 for the two matmuls alone."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS * PROGRAMS_PER_SM):
        pid_m, pid_n = _grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc_g = _zeros(BLOCK_M, BLOCK_N, ACC_FP16)
        acc_u = _zeros(BLOCK_M, BLOCK_N, ACC_FP16)
        for step in range(0, tl.cdiv(K, BLOCK_K)):
            off_k = step * BLOCK_K
            x = x_desc.load([off_m, off_k])
            if W_TRANSPOSED:
                w_g = wg_desc.load([off_n, off_k]).T
                w_u = wu_desc.load([off_n, off_k]).T
            else:
                w_g = wg_desc.load([off_k, off_n])
                w_u = wu_desc.load([off_k, off_n])
            acc_g = _dot(x, w_g, acc_g, ACC_FP16, False, UPCAST)
            acc_u = _dot(x, w_u, acc_u, ACC_FP16, False, UPCAST)
        _swiglu_fwd_tma_epilogue(
            acc_g, acc_u, off_m, off_n, bg_ptr, bu_ptr, h_desc, g_desc, u_desc, N, HAS_BIAS, SAVE_GU, ACTIVATION,
            BLOCK_N,
        )  # fmt: skip
