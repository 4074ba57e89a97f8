"""SwiGLU backward kernels.

- `_swiglu_grad_kernel`: elementwise, dh -> (d_gate, d_up) written over the saved g and u (the
  standalone Function, whose dh comes from outside).
- `_mlp_down_grad_kernel`: the MLP's dh = dy @ w_down^T with the same step as its epilogue:
  d_gate and d_up overwrite g and u, and h is rewritten for dw_down. The program parks its dh
  tile in h's own memory (the tile stays in L2) and reads it back with g and u in one coalesced
  layout: doing the step on the accumulator's MMA layout made Triton shuttle four fp32 tiles
  between layouts and spill (ptxas: 1 KB of spills per thread at 128x128). dh is rounded to the
  operand dtype there, as torch's own dh is.
- `_swiglu_input_grad_kernel`: dx = d_gate @ w_gate^T + d_up @ w_up^T as ONE matmul over a
  2 * d_intermediate reduction (one accumulator, one write of dx).
- `_swiglu_weight_grad_kernel`: dw_gate = x^T @ d_gate and dw_up = x^T @ d_up, reducing over all
  rows (every leading dim) inside the kernel; each x^T tile is loaded once for both.
"""

import triton
import triton.language as tl

from .activation import _swiglu_backward_tile
from .configs import down_grad_configs, input_grad_configs, weight_grad_configs
from .matmul import _grouped_tile, _shared_a_matmul, _store, _sum_of_products_matmul, _wrapped_offsets


@triton.jit
def _swiglu_grad_kernel(
    dh_ptr,
    g_ptr,
    u_ptr,
    stride_dhm,
    stride_dhn,
    stride_gm,
    M,
    N,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    _swiglu_backward_tile(
        dh_ptr, g_ptr, u_ptr, g_ptr, stride_dhm, stride_dhn, stride_gm, offs_m, offs_n, M, N, False, UPCAST
    )


@triton.autotune(configs=down_grad_configs(), key=["M", "N", "D"], restore_value=["g_ptr", "u_ptr"])
@triton.heuristics(
    {"EVEN_D": lambda args: args["D"] % args["BLOCK_D"] == 0, "EPILOGUE_M": lambda args: min(args["BLOCK_M"], 32)}
)
@triton.jit
def _mlp_down_grad_kernel(
    dy_ptr,
    wd_ptr,
    g_ptr,
    u_ptr,
    h_ptr,
    stride_dym,
    stride_dyd,
    stride_wdn,
    stride_wdd,
    stride_gm,
    M,
    N,
    D,
    ALLOW_TF32: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_D: tl.constexpr,
    EPILOGUE_M: tl.constexpr,
):
    pid_m, pid_n = _grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    # dh tile = dy (BLOCK_M, D) @ w_down^T (D, BLOCK_N); w_down is (N, D).
    dh = _sum_of_products_matmul(
        dy_ptr, dy_ptr, wd_ptr, wd_ptr,
        _wrapped_offsets(pid_m, M, BLOCK_M), _wrapped_offsets(pid_n, N, BLOCK_N),
        stride_dym, stride_dyd, stride_wdd, stride_wdn, stride_wdd, stride_wdn,
        D, 1, False, ALLOW_TF32, UPCAST, BLOCK_M, BLOCK_N, BLOCK_D, EVEN_D,
    )  # fmt: skip
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    dh_ptrs = h_ptr + offs_m.to(tl.int64)[:, None] * stride_gm + offs_n[None, :]
    _store(dh_ptrs, dh, mask, UPCAST)
    tl.debug_barrier()  # the whole tile is in memory before any thread reads it back
    # In row slices: three loaded tiles of BLOCK_M rows at once would not fit in registers.
    for start in tl.static_range(0, BLOCK_M, EPILOGUE_M):
        offs_slice = pid_m * BLOCK_M + start + tl.arange(0, EPILOGUE_M)
        _swiglu_backward_tile(
            h_ptr, g_ptr, u_ptr, h_ptr, stride_gm, 1, stride_gm, offs_slice, offs_n, M, N, True, UPCAST
        )


@triton.autotune(configs=input_grad_configs(), key=["M", "K", "N", "ACC_FP16"])
@triton.heuristics({"EVEN_N": lambda args: args["N"] % args["BLOCK_N"] == 0})
@triton.jit
def _swiglu_input_grad_kernel(
    dg_ptr,
    du_ptr,
    wg_ptr,
    wu_ptr,
    dx_ptr,
    stride_dm,
    stride_wgk,
    stride_wgn,
    stride_wuk,
    stride_wun,
    stride_dxm,
    M,
    K,
    N,
    ACC_FP16: tl.constexpr,
    ALLOW_TF32: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    pid_m, pid_k = _grouped_tile(tl.program_id(0), M, K, BLOCK_M, BLOCK_K, GROUP_M)
    # dx tile = d_gate (BLOCK_M, N) @ w_gate^T (N, BLOCK_K) + d_up @ w_up^T; the weights are (K, N).
    acc = _sum_of_products_matmul(
        dg_ptr, du_ptr, wg_ptr, wu_ptr,
        _wrapped_offsets(pid_m, M, BLOCK_M), _wrapped_offsets(pid_k, K, BLOCK_K),
        stride_dm, 1, stride_wgn, stride_wgk, stride_wun, stride_wuk,
        N, 2, ACC_FP16, ALLOW_TF32, UPCAST, BLOCK_M, BLOCK_K, BLOCK_N, EVEN_N,
    )  # fmt: skip
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (offs_m[:, None] < M) & (offs_k[None, :] < K)
    dx_ptrs = dx_ptr + offs_m.to(tl.int64)[:, None] * stride_dxm + offs_k[None, :]
    _store(dx_ptrs, acc.to(tl.float32), mask, UPCAST)


@triton.autotune(configs=weight_grad_configs(), key=["M", "N", "K"])
@triton.heuristics({"EVEN_M": lambda args: args["M"] % args["BLOCK_M"] == 0})
@triton.jit
def _swiglu_weight_grad_kernel(
    x_ptr,
    dg_ptr,
    du_ptr,
    dwg_ptr,
    dwu_ptr,
    stride_xm,
    stride_xk,
    stride_dm,
    stride_dwk,
    M,
    N,
    K,
    ALLOW_TF32: tl.constexpr,
    UPCAST: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    GROUP_K: tl.constexpr,
    EVEN_M: tl.constexpr,
):
    pid_k, pid_n = _grouped_tile(tl.program_id(0), K, N, BLOCK_K, BLOCK_N, GROUP_K)
    # (dw_gate, dw_up) tiles = x^T (BLOCK_K, M) @ (d_gate, d_up) (M, BLOCK_N), over every row.
    acc_g, acc_u = _shared_a_matmul(
        x_ptr, dg_ptr, du_ptr,
        _wrapped_offsets(pid_k, K, BLOCK_K), _wrapped_offsets(pid_n, N, BLOCK_N),
        stride_xk, stride_xm, stride_dm, 1, stride_dm, 1,
        M, False, ALLOW_TF32, UPCAST, BLOCK_K, BLOCK_N, BLOCK_M, EVEN_M,
    )  # fmt: skip
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    offs = offs_k.to(tl.int64)[:, None] * stride_dwk + offs_n[None, :]
    _store(dwg_ptr + offs, acc_g, mask, UPCAST)
    _store(dwu_ptr + offs, acc_u, mask, UPCAST)
