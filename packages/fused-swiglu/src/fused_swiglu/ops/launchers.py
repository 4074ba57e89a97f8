"""Kernel launchers on 2-D views, each one op: registered as a torch custom op where torch has
them (so torch.compile sees one opaque node per launch, with a fake implementation for
tracing), called directly otherwise and in eager mode (no dispatcher on the hot path).

Shapes: x (M, K) any strides; w_gate, w_up (K, N) any strides; biases (N,); g, u, h and the
gradients of g and u are contiguous (M, N); w_down (N, D) any strides; dy (M, D) any strides.
No typing-from-the-future import here: torch infers the op schemas from these annotations.
"""

import functools
from typing import Optional, Tuple

import torch
import triton

from .._compat import (
    HOPPER_TMA,
    INTERPRETING,
    TensorDescriptor,
    is_hopper,
    library_op,
    multiprocessor_count,
)
from ..kernels.backward import (
    _mlp_down_grad_kernel,
    _mlp_down_grad_tma_kernel,
    _swiglu_grad_kernel,
    _swiglu_input_grad_kernel,
    _swiglu_input_grad_tma_kernel,
    _swiglu_weight_grad_kernel,
    _swiglu_weight_grad_tma_kernel,
    _weight_grad_reduce_kernel,
)
from ..kernels.configs import weight_grad_split
from ..kernels.forward import _swiglu_fwd_kernel, _swiglu_fwd_tma_kernel
from .direct import TunedLaunches

Tensor = torch.Tensor

# Every autotuned kernel's launches (through the autotuner once per key, then directly).
FORWARD = TunedLaunches(_swiglu_fwd_kernel)
FORWARD_TMA = TunedLaunches(_swiglu_fwd_tma_kernel)
DOWN_GRAD = TunedLaunches(_mlp_down_grad_kernel)
DOWN_GRAD_TMA = TunedLaunches(_mlp_down_grad_tma_kernel)
INPUT_GRAD = TunedLaunches(_swiglu_input_grad_kernel)
INPUT_GRAD_TMA = TunedLaunches(_swiglu_input_grad_tma_kernel)
WEIGHT_GRAD = TunedLaunches(_swiglu_weight_grad_kernel)
WEIGHT_GRAD_TMA = TunedLaunches(_swiglu_weight_grad_tma_kernel)

# The elementwise gradient kernel: 64 x 128 tiles, 32 elements per thread over 8 warps.
GRAD_BLOCK_M = 64
GRAD_BLOCK_N = 128
GRAD_NUM_WARPS = 8
# The weight gradient's partial-sum reduction: row slices of 32 of a tile, 4 warps.
REDUCE_ROWS = 32
REDUCE_NUM_WARPS = 4


def _allow_tf32(dtype: torch.dtype) -> bool:
    """fp32 operands follow torch's own matmul setting; it does not matter for 16-bit ones."""
    return dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32


def _mark_overwritten(*tensors: Tensor) -> None:
    """Written through raw pointers: tell autograd, so that a second backward through the same
    graph (which would read d_gate/d_up as g/u) fails loudly instead of computing garbage."""
    for tensor in tensors:
        torch.autograd.graph.increment_version(tensor)


def tma_ready(t: Tensor) -> bool:
    """What a 2-D TMA descriptor needs of the tensor it reads: a unit stride along rows, a row
    stride that is positive and a multiple of 16 bytes, and a 16-byte aligned base address. The
    shape need not be aligned (the descriptor zero-fills reads past the edges)."""
    row_bytes = t.stride(0) * t.element_size()
    return t.stride(1) == 1 and row_bytes > 0 and row_bytes % 16 == 0 and t.data_ptr() % 16 == 0


def _tma_ready_on_hopper(*tensors: Tensor) -> bool:
    """Every tensor TMA-ready (see tma_ready), on an sm_90 device."""
    return all(tma_ready(t) for t in tensors) and is_hopper(tensors[0].device.index)


def use_tma_forward(x: Tensor, w_gate: Tensor, w_up: Tensor) -> bool:
    """The Hopper TMA forward (see _compat) applies: Triton >= 3.4, sm_90, TMA-ready 16-bit
    operands, and outputs (new, contiguous (M, N) tensors) whose rows are a multiple of 16 bytes."""
    return (
        HOPPER_TMA
        and x.dtype in (torch.float16, torch.bfloat16)
        and w_gate.shape[1] * x.element_size() % 16 == 0
        and _tma_ready_on_hopper(x, w_gate, w_up)
    )


def launch_forward(x, w_gate, w_up, b_gate, b_up, h, g, u, save_gu: bool, fp16_accumulate: bool, tma: bool) -> None:
    """One forward launch into h (and g, u when save_gu), by the TMA or the pointer kernel."""
    M, K = x.shape
    N = w_gate.shape[1]
    has_bias = b_gate is not None
    if has_bias:  # the kernel reads the biases as contiguous vectors
        b_gate, b_up = b_gate.contiguous(), b_up.contiguous()
    b_gate, b_up = (b_gate, b_up) if has_bias else (h, h)
    g, u = (g, u) if save_gu else (h, h)

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    if tma:
        sms = multiprocessor_count(x.device)

        def persistent_grid(meta):
            return (min(grid(meta)[0], sms * meta["PROGRAMS_PER_SM"]),)

        # Placeholder tiles: each autotune config's pre_hook sets its own block shapes.
        descriptors = [TensorDescriptor.from_tensor(t, [16, 16]) for t in (x, w_gate, w_up, h, g, u)]
        FORWARD_TMA(
            persistent_grid, *descriptors, b_gate, b_up, M, N, K,
            HAS_BIAS=has_bias, SAVE_GU=save_gu, ACC_FP16=fp16_accumulate, UPCAST=INTERPRETING, NUM_SMS=sms,
        )  # fmt: skip
        return
    FORWARD(
        grid, x, w_gate, w_up, b_gate, b_up, h, g, u,
        x.stride(0), x.stride(1), w_gate.stride(0), w_gate.stride(1), w_up.stride(0), w_up.stride(1), h.stride(0),
        M, N, K,
        HAS_BIAS=has_bias, SAVE_GU=save_gu, ACC_FP16=fp16_accumulate, ALLOW_TF32=_allow_tf32(x.dtype),
        UPCAST=INTERPRETING,
    )  # fmt: skip


@library_op("swiglu_fwd")
def swiglu_fwd(
    x: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    b_gate: Optional[Tensor],
    b_up: Optional[Tensor],
    save_gu: bool,
    fp16_accumulate: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """h = silu(x @ w_gate + b_gate) * (x @ w_up + b_up), and (g, u) when save_gu (else empty)."""
    M = x.shape[0]
    N = w_gate.shape[1]
    h = torch.empty((M, N), dtype=x.dtype, device=x.device)
    g = torch.empty((M, N) if save_gu else (0,), dtype=x.dtype, device=x.device)
    u = torch.empty((M, N) if save_gu else (0,), dtype=x.dtype, device=x.device)
    if M > 0:
        tma = use_tma_forward(x, w_gate, w_up)
        launch_forward(x, w_gate, w_up, b_gate, b_up, h, g, u, save_gu, fp16_accumulate, tma)
    return h, g, u


@swiglu_fwd.register_fake
def _(x, w_gate, w_up, b_gate, b_up, save_gu, fp16_accumulate):
    shape = (x.shape[0], w_gate.shape[1])
    saved = shape if save_gu else (0,)
    return x.new_empty(shape), x.new_empty(saved), x.new_empty(saved)


@library_op("swiglu_grad_", mutates_args=("g", "u"))
def swiglu_grad_(dh: Tensor, g: Tensor, u: Tensor) -> None:
    """Overwrites g with d_gate and u with d_up, given dh (any strides)."""
    M, N = g.shape
    if M > 0:
        _swiglu_grad_kernel[(triton.cdiv(M, GRAD_BLOCK_M), triton.cdiv(N, GRAD_BLOCK_N))](
            dh, g, u, dh.stride(0), dh.stride(1), g.stride(0), M, N,
            UPCAST=INTERPRETING, BLOCK_M=GRAD_BLOCK_M, BLOCK_N=GRAD_BLOCK_N, num_warps=GRAD_NUM_WARPS,
        )  # fmt: skip
    _mark_overwritten(g, u)


@library_op("mlp_down_grad_", mutates_args=("g", "u"))
def mlp_down_grad_(dy: Tensor, w_down: Tensor, g: Tensor, u: Tensor) -> Tensor:
    """dh = dy @ w_down^T, never stored: g becomes d_gate and u becomes d_up, in place.

    Returns h = silu(g) * u, recomputed for w_down's gradient (the forward does not keep it).
    """
    h = torch.empty_like(g)
    if g.shape[0] > 0:
        launch_down_grad(dy, w_down, g, u, h, use_tma_down_grad(dy, w_down))
    _mark_overwritten(g, u)
    return h


@mlp_down_grad_.register_fake
def _(dy, w_down, g, u):
    return torch.empty_like(g)


def use_tma_down_grad(dy: Tensor, w_down: Tensor) -> bool:
    """The Hopper TMA down-projection backward applies: Triton >= 3.4, sm_90, TMA-ready 16-bit dy
    (M, D) and w_down (N, D) (g, u and h are read and written through pointers)."""
    return HOPPER_TMA and dy.dtype in (torch.float16, torch.bfloat16) and _tma_ready_on_hopper(dy, w_down)


def launch_down_grad(dy: Tensor, w_down: Tensor, g: Tensor, u: Tensor, h: Tensor, tma: bool) -> None:
    """One down-projection backward launch (M > 0), by the TMA or the pointer kernel."""
    M, N = g.shape
    D = w_down.shape[1]

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

    if tma:
        # Placeholder tiles: each autotune config's pre_hook sets its own block shapes.
        descriptors = [TensorDescriptor.from_tensor(t, [16, 16]) for t in (dy, w_down)]
        DOWN_GRAD_TMA(grid, *descriptors, g, u, h, g.stride(0), M, N, D, UPCAST=INTERPRETING)
        return
    DOWN_GRAD(
        grid, dy, w_down, g, u, h,
        dy.stride(0), dy.stride(1), w_down.stride(0), w_down.stride(1), g.stride(0),
        M, N, D,
        ALLOW_TF32=_allow_tf32(g.dtype), UPCAST=INTERPRETING,
    )  # fmt: skip


def use_tma_input_grad(d_gate: Tensor, d_up: Tensor, w_gate: Tensor, w_up: Tensor) -> bool:
    """The Hopper TMA input gradient applies: as for the forward, with d_gate, d_up (contiguous
    (M, N), of one allocation each) and dx (new, contiguous (M, K)) in 16-byte rows."""
    return (
        HOPPER_TMA
        and d_gate.dtype in (torch.float16, torch.bfloat16)
        and w_gate.shape[0] * d_gate.element_size() % 16 == 0
        and _tma_ready_on_hopper(d_gate, d_up, w_gate, w_up)
    )


@library_op("swiglu_input_grad")
def swiglu_input_grad(d_gate: Tensor, d_up: Tensor, w_gate: Tensor, w_up: Tensor, fp16_accumulate: bool) -> Tensor:
    """dx = d_gate @ w_gate^T + d_up @ w_up^T, one matmul over the 2N reduction -> (M, K)."""
    M, N = d_gate.shape
    K = w_gate.shape[0]
    dx = torch.empty((M, K), dtype=d_gate.dtype, device=d_gate.device)
    if M == 0:
        return dx

    def grid(meta):
        return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(K, meta["BLOCK_K"]),)

    if use_tma_input_grad(d_gate, d_up, w_gate, w_up):
        # Placeholder tiles: each autotune config's pre_hook sets its own block shapes.
        descriptors = [TensorDescriptor.from_tensor(t, [16, 16]) for t in (d_gate, d_up, w_gate, w_up, dx)]
        INPUT_GRAD_TMA(grid, *descriptors, M, K, N, ACC_FP16=fp16_accumulate, UPCAST=INTERPRETING)
        return dx
    INPUT_GRAD(
        grid, d_gate, d_up, w_gate, w_up, dx,
        d_gate.stride(0), w_gate.stride(0), w_gate.stride(1), w_up.stride(0), w_up.stride(1), dx.stride(0),
        M, K, N,
        ACC_FP16=fp16_accumulate, ALLOW_TF32=_allow_tf32(dx.dtype), UPCAST=INTERPRETING,
    )  # fmt: skip
    return dx


@swiglu_input_grad.register_fake
def _(d_gate, d_up, w_gate, w_up, fp16_accumulate):
    return d_gate.new_empty((d_gate.shape[0], w_gate.shape[0]))


@functools.lru_cache(maxsize=256)
def _weight_grad_workspace_elements(M: int, N: int, K: int, sms: int, blocks: Tuple[Tuple[int, int, int], ...]) -> int:
    """fp32 elements of partial sums the weight gradient may write, the most over its configs."""
    most = 0
    for block_k, block_n, block_m in blocks:
        tiles = triton.cdiv(K, block_k) * triton.cdiv(N, block_n)
        split = weight_grad_split(tiles, sms, triton.cdiv(M, block_m))
        if split > 1:
            most = max(most, (tiles % sms) * split * 2 * block_k * block_n)
    return most


@library_op("swiglu_weight_grad")
def swiglu_weight_grad(x: Tensor, d_gate: Tensor, d_up: Tensor, dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """(dw_gate, dw_up) = (x^T @ d_gate, x^T @ d_up), reduced over all M rows -> (K, N) each, in
    `dtype`: x's, or fp32 for fp32 weights under autocast (the fp32 accumulator stored uncast).

    A last, partial wave of output tiles splits its reduction (configs.weight_grad_split): those
    programs write fp32 partial sums to a workspace, which a second kernel adds up in order.
    """
    M, K = x.shape
    N = d_gate.shape[1]
    dw_gate = torch.empty((K, N), dtype=dtype, device=x.device)
    dw_up = torch.empty((K, N), dtype=dtype, device=x.device)
    if M == 0:
        return dw_gate.zero_(), dw_up.zero_()
    launch_weight_grad(x, d_gate, d_up, dw_gate, dw_up, use_tma_weight_grad(x, d_gate, d_up))
    return dw_gate, dw_up


@swiglu_weight_grad.register_fake
def _(x, d_gate, d_up, dtype):
    shape = (x.shape[1], d_gate.shape[1])
    return x.new_empty(shape, dtype=dtype), x.new_empty(shape, dtype=dtype)


def use_tma_weight_grad(x: Tensor, d_gate: Tensor, d_up: Tensor) -> bool:
    """The Hopper TMA weight gradients apply: Triton >= 3.4, sm_90, TMA-ready 16-bit x (M, K),
    d_gate and d_up (M, N) (the gradients are stored through pointers, in any dtype)."""
    return HOPPER_TMA and x.dtype in (torch.float16, torch.bfloat16) and _tma_ready_on_hopper(x, d_gate, d_up)


def launch_weight_grad(x: Tensor, d_gate: Tensor, d_up: Tensor, dw_gate: Tensor, dw_up: Tensor, tma: bool) -> None:
    """(dw_gate, dw_up) = x^T @ (d_gate, d_up) (M > 0), by the TMA or the pointer kernel, and the
    reduction of the split last wave's partial sums when the chosen config splits it."""
    M, K = x.shape
    N = d_gate.shape[1]
    sms = multiprocessor_count(x.device)
    kernel = _swiglu_weight_grad_tma_kernel if tma else _swiglu_weight_grad_kernel
    blocks = tuple((c.kwargs["BLOCK_K"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_M"]) for c in kernel.configs)
    workspace = torch.empty(
        max(_weight_grad_workspace_elements(M, N, K, sms, blocks), 1), dtype=torch.float32, device=x.device
    )

    def grid(meta):
        tiles = triton.cdiv(K, meta["BLOCK_K"]) * triton.cdiv(N, meta["BLOCK_N"])
        return (tiles + (tiles % sms) * (meta["split"] - 1),)

    if tma:
        # Placeholder tiles: each autotune config's pre_hook sets its own block shapes.
        descriptors = [TensorDescriptor.from_tensor(t, [16, 16]) for t in (x, d_gate, d_up)]
        config = WEIGHT_GRAD_TMA(
            grid, *descriptors, dw_gate, dw_up, workspace, dw_gate.stride(0), M, N, K,
            UPCAST=INTERPRETING, NUM_SMS=sms,
        ).kwargs  # fmt: skip
    else:
        config = WEIGHT_GRAD(
            grid, x, d_gate, d_up, dw_gate, dw_up, workspace,
            x.stride(0), x.stride(1), d_gate.stride(0), dw_gate.stride(0),
            M, N, K,
            ALLOW_TF32=_allow_tf32(x.dtype), UPCAST=INTERPRETING, NUM_SMS=sms,
        ).kwargs  # fmt: skip
    tiles = triton.cdiv(K, config["BLOCK_K"]) * triton.cdiv(N, config["BLOCK_N"])
    split = weight_grad_split(tiles, sms, triton.cdiv(M, config["BLOCK_M"]))
    if split > 1:
        _weight_grad_reduce_kernel[(tiles % sms, 2)](
            workspace, dw_gate, dw_up, dw_gate.stride(0), N, K, split,
            UPCAST=INTERPRETING, NUM_SMS=sms, BLOCK_K=config["BLOCK_K"], BLOCK_N=config["BLOCK_N"],
            GROUP_K=config["GROUP_K"], ROWS=min(REDUCE_ROWS, config["BLOCK_K"]), num_warps=REDUCE_NUM_WARPS,
        )  # fmt: skip
