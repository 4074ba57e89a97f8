"""Kernel launchers on 2-D views, each one op: registered as a torch custom op (so torch.compile
sees one opaque node per launch, with a fake implementation for tracing) and called directly in
eager mode.

Each launcher looks up a plan, an lru_cache'd function of what specializes its launches (sizes,
strides, dtypes, flags, device) that fixes every argument and grid and knows whether the Hopper
TMA kernel suits the layout; per call it checks the 16-byte alignment of the operands the TMA
kernel would read (only where it suits), allocates its outputs and launches. Autotuned kernels
launch through the runtime's tuning module: the autotuner chooses on a plan's first call, a Launch of its choice
runs the later ones.

The activation comes as its ACTIVATION code (kernels/activation.py: SILU or GELU_TANH), part of
the key of every plan whose kernel evaluates it (forward, elementwise gradient, down-projection
backward) and of those kernels' autotune keys.

Shapes: x (M, K) any strides; w_gate, w_up (K, N) any strides; biases (N,); g, u, h and the
gradients of g and u are contiguous (M, N); w_down (N, D) any strides; dy (M, D) any strides.
No typing-from-the-future import here: torch infers the op schemas from these annotations.
"""

import functools
from typing import NamedTuple, Optional, Tuple

import torch
import triton

from .._compat import HOPPER_TMA, INTERPRETING, is_hopper, multiprocessor_count
from .._runtime.launch import Launch
from .._runtime.registration import custom_op
from .._runtime.tuning import TunedKernel, TunedPlan, skinny_problem
from ..kernels.activation import SILU
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

Tensor = torch.Tensor

# Every autotuned kernel: the autotuner chooses once per plan, a Launch runs the rest.
FORWARD = TunedKernel(_swiglu_fwd_kernel)
FORWARD_TMA = TunedKernel(_swiglu_fwd_tma_kernel)
DOWN_GRAD = TunedKernel(_mlp_down_grad_kernel)
DOWN_GRAD_TMA = TunedKernel(_mlp_down_grad_tma_kernel)
INPUT_GRAD = TunedKernel(_swiglu_input_grad_kernel)
INPUT_GRAD_TMA = TunedKernel(_swiglu_input_grad_tma_kernel)
WEIGHT_GRAD = TunedKernel(_swiglu_weight_grad_kernel)
WEIGHT_GRAD_TMA = TunedKernel(_swiglu_weight_grad_tma_kernel)
TUNED_KERNELS = (FORWARD, FORWARD_TMA, DOWN_GRAD, DOWN_GRAD_TMA, INPUT_GRAD, INPUT_GRAD_TMA, WEIGHT_GRAD,
                 WEIGHT_GRAD_TMA)  # fmt: skip

# The elementwise gradient kernel: 64 x 128 tiles, 32 elements per thread over 8 warps.
GRAD_BLOCK_M = 64
GRAD_BLOCK_N = 128
GRAD_NUM_WARPS = 8
# The weight gradient's partial-sum reduction: row slices of 32 of a tile, 4 warps.
REDUCE_ROWS = 32
REDUCE_NUM_WARPS = 4

# Plans kept per launcher (a training run meets a handful of shapes).
PLANS = 256
HALF_DTYPES = (torch.float16, torch.bfloat16)


def _allow_tf32(dtype: torch.dtype) -> bool:
    """fp32 operands follow torch's own matmul setting; it does not matter for 16-bit ones."""
    return dtype is torch.float32 and torch.backends.cuda.matmul.allow_tf32


def _sms(device: int) -> int:
    """Multiprocessors of the CUDA device of index `device` (the interpreter's stand-in when < 0)."""
    return multiprocessor_count(torch.device("cuda", device) if device >= 0 else None)


def _tma_rows(strides: Tuple[int, ...], element_size: int) -> bool:
    """What a 2-D TMA descriptor needs of the layout it reads: a unit stride along rows and a row
    stride that is positive and a multiple of 16 bytes. The shape need not be aligned (the
    descriptor zero-fills reads past the edges)."""
    return strides[1] == 1 and strides[0] > 0 and strides[0] * element_size % 16 == 0


def _aligned(*tensors: Tensor) -> bool:
    """Every tensor's base address 16-byte aligned (a TMA descriptor's base must be)."""
    return not any(t.data_ptr() & 15 for t in tensors)


def tma_ready(t: Tensor) -> bool:
    """A 2-D tensor a TMA descriptor can read: TMA rows (_tma_rows) from a 16-byte aligned base."""
    return _tma_rows(t.stride(), t.element_size()) and _aligned(t)


def _tma_suits(dtype: torch.dtype, device: int, *strides: Tuple[int, ...]) -> bool:
    """A Hopper TMA kernel applies to 16-bit operands of these strides (Triton >= 3.4, sm_90)."""
    return (
        HOPPER_TMA and dtype in HALF_DTYPES and all(_tma_rows(s, dtype.itemsize) for s in strides) and is_hopper(device)
    )


def _tile_grid(size_p: str, size_q: str, block_p: str, block_q: str):
    """grid(meta): one program per (block_p, block_q) tile of a (size_p, size_q) output."""

    def grid(meta):
        return (triton.cdiv(meta[size_p], meta[block_p]) * triton.cdiv(meta[size_q], meta[block_q]),)

    return grid


# ---------------------------------------------------------------------------------------------
# Forward


def _weights_transposed(*strides: Tuple[int, int]) -> bool:
    """Weights (K, N) of strides (1, s >= K): transposed views of (N, K) rows, as nn.Linear keeps them."""
    return all(s[0] == 1 and s[1] != 1 for s in strides)


def forward_tma_suits(dtype, N: int, x_strides, wg_strides, wu_strides, device: int) -> bool:
    """The Hopper TMA forward (see _compat) applies to this layout: 16-bit operands in TMA rows (the
    weights' rows, or their columns for transposed views), and outputs (new, contiguous (M, N)
    tensors) whose rows are a multiple of 16 bytes."""
    if _weights_transposed(wg_strides, wu_strides):
        wg_strides, wu_strides = wg_strides[::-1], wu_strides[::-1]
    return N * dtype.itemsize % 16 == 0 and _tma_suits(dtype, device, x_strides, wg_strides, wu_strides)


def use_tma_forward(x: Tensor, w_gate: Tensor, w_up: Tensor) -> bool:
    """The TMA forward applies: its layout (forward_tma_suits) and the operands' base alignment."""
    suits = forward_tma_suits(x.dtype, w_gate.shape[1], x.stride(), w_gate.stride(), w_up.stride(), x.get_device())
    return suits and _aligned(x, w_gate, w_up)


_forward_grid = _tile_grid("M", "N", "BLOCK_M", "BLOCK_N")


def _persistent_forward_grid(meta):
    return (min(_forward_grid(meta)[0], meta["NUM_SMS"] * meta["PROGRAMS_PER_SM"]),)


@functools.lru_cache(maxsize=PLANS)
def _forward_launch(M, N, K, x_strides, wg_strides, wu_strides, dtype, has_bias, save_gu, acc_fp16, tf32, activation,
                    device, tma: bool) -> TunedPlan:  # fmt: skip
    """The forward's launch by the TMA or the pointer kernel. Per call: x, w_gate, w_up, h, g, u,
    b_gate, b_up (TMA) or x, w_gate, w_up, b_gate, b_up, h, g, u (pointer)."""
    flags = (("HAS_BIAS", has_bias), ("SAVE_GU", save_gu), ("ACC_FP16", acc_fp16), ("UPCAST", INTERPRETING),
             ("ACTIVATION", activation))  # fmt: skip
    if tma:
        out = ((M, N), (N, 1))
        transposed = _weights_transposed(wg_strides, wu_strides)
        if transposed:  # descriptors over the (N, K) rows the views transpose
            wg, wu = ((N, K), wg_strides[::-1]), ((N, K), wu_strides[::-1])
        else:
            wg, wu = ((K, N), wg_strides), ((K, N), wu_strides)
        return TunedPlan(
            FORWARD_TMA,
            fixed=(("M", M), ("N", N), ("K", K), ("NUM_SMS", _sms(device)), *flags, ("W_TRANSPOSED", transposed)),
            tensors=("x_desc", "wg_desc", "wu_desc", "h_desc", "g_desc", "u_desc", "bg_ptr", "bu_ptr"),
            grid=_persistent_forward_grid,
            descriptors=(((M, K), x_strides), wg, wu, out, out, out, None, None),
        )
    strides = (*x_strides, *wg_strides, *wu_strides, N)
    names = ("stride_xm", "stride_xk", "stride_wgk", "stride_wgn", "stride_wuk", "stride_wun", "stride_hm")
    return TunedPlan(
        FORWARD,
        fixed=(*zip(names, strides), ("M", M), ("N", N), ("K", K), ("ALLOW_TF32", tf32), *flags),
        tensors=("x_ptr", "wg_ptr", "wu_ptr", "bg_ptr", "bu_ptr", "h_ptr", "g_ptr", "u_ptr"),
        grid=_forward_grid,
    )


class KernelChoice(NamedTuple):
    """A launcher's two kernels for one plan key: the pointer kernel's launch, and the TMA
    kernel's where the layout suits it (None elsewhere; the alignment is checked per call)."""

    pointer: TunedPlan
    tma: Optional[TunedPlan]


@functools.lru_cache(maxsize=PLANS)
def _forward_plan(M, N, K, x_strides, wg_strides, wu_strides, dtype, has_bias, save_gu, acc_fp16, tf32, activation,
                  device) -> KernelChoice:  # fmt: skip
    key = (M, N, K, x_strides, wg_strides, wu_strides, dtype, has_bias, save_gu, acc_fp16, tf32, activation, device)
    # A skinny forward streams the weights through the pointer kernel's 16-row tiles.
    skinny = skinny_problem(M, dtype.itemsize)
    tma = forward_tma_suits(dtype, N, x_strides, wg_strides, wu_strides, device) and not skinny
    return KernelChoice(_forward_launch(*key, False), _forward_launch(*key, True) if tma else None)


def _run_forward(plan: TunedPlan, x, w_gate, w_up, b_gate, b_up, h, g, u) -> None:
    """One forward launch into h (and g, u when the plan saves them; else g, u are h, unwritten)."""
    if b_gate is None:
        b_gate = b_up = h
    else:  # the kernel reads the biases as contiguous vectors
        b_gate, b_up = b_gate.contiguous(), b_up.contiguous()
    if plan.descriptors is None:
        plan.kernel(plan, x, w_gate, w_up, b_gate, b_up, h, g, u)
    else:
        plan.kernel(plan, x, w_gate, w_up, h, g, u, b_gate, b_up)


def _forward_key(x: Tensor, w_gate: Tensor, w_up: Tensor, has_bias: bool, save_gu: bool, fp16_accumulate: bool,
                 activation: int):  # fmt: skip
    M, K = x.shape
    dtype = x.dtype
    return (M, w_gate.shape[1], K, x.stride(), w_gate.stride(), w_up.stride(), dtype, has_bias, save_gu,
            fp16_accumulate, _allow_tf32(dtype), activation, x.get_device())  # fmt: skip


def forward_outputs(
    x: Tensor, w_gate: Tensor, w_up: Tensor, b_gate: Optional[Tensor], b_up: Optional[Tensor], save_gu: bool,
    fp16_accumulate: bool, activation: int,
) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor]]:  # fmt: skip
    """h = act(x @ w_gate + b_gate) * (x @ w_up + b_up), and (g, u) when save_gu (else None)."""
    M = x.shape[0]
    N = w_gate.shape[1]
    h = torch.empty((M, N), dtype=x.dtype, device=x.device)
    g = u = None
    if save_gu:
        g = torch.empty((M, N), dtype=x.dtype, device=x.device)
        u = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M > 0:
        plan = _forward_plan(*_forward_key(x, w_gate, w_up, b_gate is not None, save_gu, fp16_accumulate, activation))
        chosen = plan.tma if plan.tma is not None and _aligned(x, w_gate, w_up) else plan.pointer
        _run_forward(chosen, x, w_gate, w_up, b_gate, b_up, h, g if save_gu else h, u if save_gu else h)
    return h, g, u


def launch_forward(x, w_gate, w_up, b_gate, b_up, h, g, u, save_gu: bool, fp16_accumulate: bool, tma: bool,
                   activation: int = SILU.value) -> None:  # fmt: skip
    """One forward launch (M > 0) into the given h (and g, u when save_gu) by the kernel named."""
    key = _forward_key(x, w_gate, w_up, b_gate is not None, save_gu, fp16_accumulate, activation)
    plan = _forward_launch(*key, tma)
    _run_forward(plan, x, w_gate, w_up, b_gate, b_up, h, g if save_gu else h, u if save_gu else h)


def _swiglu_fwd_fake(x, w_gate, w_up, b_gate, b_up, save_gu, fp16_accumulate, activation):
    shape = (x.shape[0], w_gate.shape[1])
    saved = shape if save_gu else (0,)
    return x.new_empty(shape), x.new_empty(saved), x.new_empty(saved)


@custom_op("fused_swiglu::swiglu_fwd", fake=_swiglu_fwd_fake)
def swiglu_fwd(
    x: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    b_gate: Optional[Tensor],
    b_up: Optional[Tensor],
    save_gu: bool,
    fp16_accumulate: bool,
    activation: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    """forward_outputs as an operator: g and u are empty when not saved."""
    h, g, u = forward_outputs(x, w_gate, w_up, b_gate, b_up, save_gu, fp16_accumulate, activation)
    if g is None:
        g, u = x.new_empty((0,)), x.new_empty((0,))
    return h, g, u


# ---------------------------------------------------------------------------------------------
# Backward: the elementwise SwiGLU gradient


@functools.lru_cache(maxsize=PLANS)
def _grad_launch(M: int, N: int, dh_strides: Tuple[int, int], stride_gm: int, activation: int) -> Launch:
    """The elementwise gradient over (M, N); per call: dh, g, u."""
    return Launch(
        _swiglu_grad_kernel, (triton.cdiv(M, GRAD_BLOCK_M), triton.cdiv(N, GRAD_BLOCK_N)),
        stride_dhm=dh_strides[0], stride_dhn=dh_strides[1], stride_gm=stride_gm, M=M, N=N, UPCAST=INTERPRETING,
        ACTIVATION=activation, BLOCK_M=GRAD_BLOCK_M, BLOCK_N=GRAD_BLOCK_N, num_warps=GRAD_NUM_WARPS,
    )  # fmt: skip


def _no_outputs(*args) -> None:
    return None


@custom_op("fused_swiglu::swiglu_grad_", fake=_no_outputs, mutates_args=("g", "u"))
def swiglu_grad_(dh: Tensor, g: Tensor, u: Tensor, activation: int) -> None:
    """Overwrites g with d_gate and u with d_up, given dh (any strides)."""
    M, N = g.shape
    if M > 0:
        _grad_launch(M, N, dh.stride(), g.stride(0), activation)(dh, g, u)


# ---------------------------------------------------------------------------------------------
# Backward: the down projection's, with the SwiGLU gradient as its epilogue


def down_grad_tma_suits(dtype, dy_strides, wd_strides, device: int) -> bool:
    """The Hopper TMA down-projection backward applies: 16-bit dy (M, D) and w_down (N, D) in TMA
    rows (g, u and h are read and written through pointers)."""
    return _tma_suits(dtype, device, dy_strides, wd_strides)


def use_tma_down_grad(dy: Tensor, w_down: Tensor) -> bool:
    """The TMA down-projection backward applies: layout (down_grad_tma_suits) and alignment."""
    return down_grad_tma_suits(dy.dtype, dy.stride(), w_down.stride(), dy.get_device()) and _aligned(dy, w_down)


@functools.lru_cache(maxsize=PLANS)
def _down_grad_launch(M, N, D, dy_strides, wd_strides, stride_gm, dtype, tf32, activation, device,
                      tma: bool) -> TunedPlan:  # fmt: skip
    """The down-projection backward's launch; per call: dy, w_down, g, u, h."""
    sizes = (("stride_gm", stride_gm), ("M", M), ("N", N), ("D", D), ("UPCAST", INTERPRETING),
             ("ACTIVATION", activation))  # fmt: skip
    if tma:
        return TunedPlan(
            DOWN_GRAD_TMA, fixed=sizes, tensors=("dy_desc", "wd_desc", "g_ptr", "u_ptr", "h_ptr"),
            grid=_forward_grid, descriptors=(((M, D), dy_strides), ((N, D), wd_strides), None, None, None),
        )  # fmt: skip
    names = ("stride_dym", "stride_dyd", "stride_wdn", "stride_wdd")
    return TunedPlan(
        DOWN_GRAD, fixed=(*zip(names, (*dy_strides, *wd_strides)), *sizes, ("ALLOW_TF32", tf32)),
        tensors=("dy_ptr", "wd_ptr", "g_ptr", "u_ptr", "h_ptr"), grid=_forward_grid,
    )  # fmt: skip


@functools.lru_cache(maxsize=PLANS)
def _down_grad_plan(M, N, D, dy_strides, wd_strides, stride_gm, dtype, tf32, activation, device) -> KernelChoice:
    key = (M, N, D, dy_strides, wd_strides, stride_gm, dtype, tf32, activation, device)
    tma = down_grad_tma_suits(dtype, dy_strides, wd_strides, device)
    return KernelChoice(_down_grad_launch(*key, False), _down_grad_launch(*key, True) if tma else None)


def _down_grad_key(dy: Tensor, w_down: Tensor, g: Tensor, activation: int):
    M, N = g.shape
    dtype = dy.dtype
    return (M, N, w_down.shape[1], dy.stride(), w_down.stride(), g.stride(0), dtype, _allow_tf32(dtype), activation,
            dy.get_device())  # fmt: skip


def launch_down_grad(dy: Tensor, w_down: Tensor, g: Tensor, u: Tensor, h: Tensor, tma: bool,
                     activation: int = SILU.value) -> None:  # fmt: skip
    """One down-projection backward launch (M > 0), by the TMA or the pointer kernel."""
    plan = _down_grad_launch(*_down_grad_key(dy, w_down, g, activation), tma)
    plan.kernel(plan, dy, w_down, g, u, h)


def _mlp_down_grad_fake(dy, w_down, g, u, activation):
    return torch.empty_like(g)


@custom_op("fused_swiglu::mlp_down_grad_", fake=_mlp_down_grad_fake, mutates_args=("g", "u"))
def mlp_down_grad_(dy: Tensor, w_down: Tensor, g: Tensor, u: Tensor, activation: int) -> Tensor:
    """dh = dy @ w_down^T, never stored: g becomes d_gate and u becomes d_up, in place.

    Returns h = act(g) * u, recomputed for w_down's gradient (the forward does not keep it).
    """
    h = torch.empty_like(g)
    if g.shape[0] > 0:
        plan = _down_grad_plan(*_down_grad_key(dy, w_down, g, activation))
        chosen = plan.tma if plan.tma is not None and _aligned(dy, w_down) else plan.pointer
        chosen.kernel(chosen, dy, w_down, g, u, h)
    return h


# ---------------------------------------------------------------------------------------------
# Backward: the input gradient


def input_grad_tma_suits(dtype, K: int, dg_strides, du_strides, wg_strides, wu_strides, device: int) -> bool:
    """The Hopper TMA input gradient applies: as for the forward, with d_gate, d_up (M, N) and
    the weights (K, N) in TMA rows and dx (new, contiguous (M, K)) in 16-byte rows."""
    return K * dtype.itemsize % 16 == 0 and _tma_suits(dtype, device, dg_strides, du_strides, wg_strides, wu_strides)


def use_tma_input_grad(d_gate: Tensor, d_up: Tensor, w_gate: Tensor, w_up: Tensor) -> bool:
    """The TMA input gradient applies: layout (input_grad_tma_suits) and alignment."""
    layout = (d_gate.stride(), d_up.stride(), w_gate.stride(), w_up.stride())
    suits = input_grad_tma_suits(d_gate.dtype, w_gate.shape[0], *layout, d_gate.get_device())
    return suits and _aligned(d_gate, d_up, w_gate, w_up)


_input_grad_grid = _tile_grid("M", "K", "BLOCK_M", "BLOCK_K")


@functools.lru_cache(maxsize=PLANS)
def _input_grad_launch(M, N, K, dg_strides, du_strides, wg_strides, wu_strides, dtype, acc_fp16, tf32, device,
                       tma: bool) -> TunedPlan:  # fmt: skip
    """The input gradient's launch; per call: d_gate, d_up, w_gate, w_up, dx."""
    sizes = (("M", M), ("K", K), ("N", N), ("ACC_FP16", acc_fp16), ("UPCAST", INTERPRETING))
    if tma:
        gate_up = ((M, N), dg_strides), ((M, N), du_strides)
        weights = ((K, N), wg_strides), ((K, N), wu_strides)
        return TunedPlan(
            INPUT_GRAD_TMA, fixed=sizes, tensors=("dg_desc", "du_desc", "wg_desc", "wu_desc", "dx_desc"),
            grid=_input_grad_grid, descriptors=(*gate_up, *weights, ((M, K), (K, 1))),
        )  # fmt: skip
    names = ("stride_dm", "stride_wgk", "stride_wgn", "stride_wuk", "stride_wun", "stride_dxm")
    strides = (dg_strides[0], *wg_strides, *wu_strides, K)
    return TunedPlan(
        INPUT_GRAD, fixed=(*zip(names, strides), *sizes, ("ALLOW_TF32", tf32)),
        tensors=("dg_ptr", "du_ptr", "wg_ptr", "wu_ptr", "dx_ptr"), grid=_input_grad_grid,
    )  # fmt: skip


@functools.lru_cache(maxsize=PLANS)
def _input_grad_plan(M, N, K, dg_strides, du_strides, wg_strides, wu_strides, dtype, acc_fp16, tf32,
                     device) -> KernelChoice:  # fmt: skip
    key = (M, N, K, dg_strides, du_strides, wg_strides, wu_strides, dtype, acc_fp16, tf32, device)
    tma = input_grad_tma_suits(dtype, K, dg_strides, du_strides, wg_strides, wu_strides, device)
    return KernelChoice(_input_grad_launch(*key, False), _input_grad_launch(*key, True) if tma else None)


def _swiglu_input_grad_fake(d_gate, d_up, w_gate, w_up, fp16_accumulate):
    return d_gate.new_empty((d_gate.shape[0], w_gate.shape[0]))


@custom_op("fused_swiglu::swiglu_input_grad", fake=_swiglu_input_grad_fake)
def swiglu_input_grad(d_gate: Tensor, d_up: Tensor, w_gate: Tensor, w_up: Tensor, fp16_accumulate: bool) -> Tensor:
    """dx = d_gate @ w_gate^T + d_up @ w_up^T, one matmul over the 2N reduction -> (M, K)."""
    M, N = d_gate.shape
    K = w_gate.shape[0]
    dtype = d_gate.dtype
    dx = torch.empty((M, K), dtype=dtype, device=d_gate.device)
    if M > 0:
        plan = _input_grad_plan(M, N, K, d_gate.stride(), d_up.stride(), w_gate.stride(), w_up.stride(), dtype,
                                fp16_accumulate, _allow_tf32(dtype), d_gate.get_device())  # fmt: skip
        chosen = plan.tma if plan.tma is not None and _aligned(d_gate, d_up, w_gate, w_up) else plan.pointer
        chosen.kernel(chosen, d_gate, d_up, w_gate, w_up, dx)
    return dx


# ---------------------------------------------------------------------------------------------
# Backward: the weight gradients


def weight_grad_tma_suits(dtype, x_strides, dg_strides, du_strides, device: int) -> bool:
    """The Hopper TMA weight gradients apply: 16-bit x (M, K), d_gate and d_up (M, N) in TMA rows
    (the gradients are stored through pointers, in any dtype)."""
    return _tma_suits(dtype, device, x_strides, dg_strides, du_strides)


def use_tma_weight_grad(x: Tensor, d_gate: Tensor, d_up: Tensor) -> bool:
    """The TMA weight gradients apply: layout (weight_grad_tma_suits) and alignment."""
    suits = weight_grad_tma_suits(x.dtype, x.stride(), d_gate.stride(), d_up.stride(), x.get_device())
    return suits and _aligned(x, d_gate, d_up)


class WeightGradTail(NamedTuple):
    """After the weight-gradient launch, for the chosen config: the fp32 workspace elements its
    split last wave writes, and the Launch that adds them up (None: no split)."""

    workspace: int
    reduce: Optional[Launch]


def _weight_grad_tail(meta: dict) -> WeightGradTail:
    split = meta["split"]  # the heuristic's value for the chosen config (configs.weight_grad_plan)
    if split == 1:
        return WeightGradTail(0, None)
    block_k, block_n, sms = meta["BLOCK_K"], meta["BLOCK_N"], meta["NUM_SMS"]
    remainder = (triton.cdiv(meta["K"], block_k) * triton.cdiv(meta["N"], block_n)) % sms
    reduce = Launch(
        _weight_grad_reduce_kernel, (remainder, 2), stride_dwk=meta["stride_dwk"], stride_dwn=meta["stride_dwn"],
        N=meta["N"], K=meta["K"],
        split=split, UPCAST=INTERPRETING, NUM_SMS=sms, BLOCK_K=block_k, BLOCK_N=block_n, GROUP_K=meta["GROUP_K"],
        ROWS=min(REDUCE_ROWS, block_k), num_warps=REDUCE_NUM_WARPS,
    )  # fmt: skip
    return WeightGradTail(remainder * split * 2 * block_k * block_n, reduce)


def _weight_grad_grid(meta):
    tiles = triton.cdiv(meta["K"], meta["BLOCK_K"]) * triton.cdiv(meta["N"], meta["BLOCK_N"])
    return (tiles + (tiles % meta["NUM_SMS"]) * (meta["split"] - 1),)


@functools.lru_cache(maxsize=PLANS)
def _weight_grad_launch(M, N, K, x_strides, dg_strides, du_strides, dw_strides, dtype, dw_dtype, tf32, device,
                        tma: bool) -> TunedPlan:  # fmt: skip
    """The weight gradients' launch; per call: x, d_gate, d_up, dw_gate, dw_up, workspace."""
    sizes = (("stride_dwk", dw_strides[0]), ("stride_dwn", dw_strides[1]), ("M", M), ("N", N), ("K", K),
             ("UPCAST", INTERPRETING), ("NUM_SMS", _sms(device)))  # fmt: skip
    outputs = ("dwg_ptr", "dwu_ptr", "ws_ptr")
    if tma:
        return TunedPlan(
            WEIGHT_GRAD_TMA, fixed=sizes, tensors=("x_desc", "dg_desc", "du_desc", *outputs), grid=_weight_grad_grid,
            descriptors=(((M, K), x_strides), ((M, N), dg_strides), ((M, N), du_strides), None, None, None),
            follow=_weight_grad_tail,
        )  # fmt: skip
    strides = (("stride_xm", x_strides[0]), ("stride_xk", x_strides[1]), ("stride_dm", dg_strides[0]))
    return TunedPlan(
        WEIGHT_GRAD, fixed=(*strides, *sizes, ("ALLOW_TF32", tf32)), tensors=("x_ptr", "dg_ptr", "du_ptr", *outputs),
        grid=_weight_grad_grid, follow=_weight_grad_tail,
    )  # fmt: skip


class WeightGradPlan(NamedTuple):
    """The weight gradients' kernels (KernelChoice) and the workspace passed when the chosen
    config does not split its last wave (one fp32 element, never read nor written)."""

    pointer: TunedPlan
    tma: Optional[TunedPlan]
    unused_workspace: Tensor


@functools.lru_cache(maxsize=PLANS)
def _weight_grad_plan(M, N, K, x_strides, dg_strides, du_strides, dw_strides, dtype, dw_dtype, tf32,
                      device) -> WeightGradPlan:  # fmt: skip
    key = (M, N, K, x_strides, dg_strides, du_strides, dw_strides, dtype, dw_dtype, tf32, device)
    tma = weight_grad_tma_suits(dtype, x_strides, dg_strides, du_strides, device)
    where = torch.device("cuda", device) if device >= 0 else torch.device("cpu")
    unused = torch.empty(1, dtype=torch.float32, device=where)
    return WeightGradPlan(_weight_grad_launch(*key, False), _weight_grad_launch(*key, True) if tma else None, unused)


@functools.lru_cache(maxsize=PLANS)
def _weight_grad_workspace_elements(M: int, N: int, K: int, sms: int, blocks: Tuple[Tuple[int, int, int], ...]) -> int:
    """fp32 elements of partial sums the weight gradient may write, the most over its configs."""
    most = 0
    for block_k, block_n, block_m in blocks:
        tiles = triton.cdiv(K, block_k) * triton.cdiv(N, block_n)
        split = weight_grad_split(tiles, sms, triton.cdiv(M, block_m))
        if split > 1:
            most = max(most, (tiles % sms) * split * 2 * block_k * block_n)
    return most


def _run_weight_grad(plan: TunedPlan, x, d_gate, d_up, dw_gate, dw_up, unused_workspace: Tensor) -> None:
    """(dw_gate, dw_up) = x^T @ (d_gate, d_up) (M > 0), and the reduction of the split last
    wave's partial sums where the chosen config splits it. A plan's first call (the autotuner's)
    gets a workspace large enough for any of the kernel's configs."""
    kernel = plan.kernel
    entry = kernel.entry(plan)
    if entry is None:
        M, K = x.shape
        blocks = tuple((c.kwargs["BLOCK_K"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_M"]) for c in kernel.tuner.configs)
        elements = _weight_grad_workspace_elements(M, d_gate.shape[1], K, dict(plan.fixed)["NUM_SMS"], blocks)
        workspace = torch.empty(max(elements, 1), dtype=torch.float32, device=x.device)
        entry = kernel.tune(plan, (x, d_gate, d_up, dw_gate, dw_up, workspace))
    else:
        tail = entry.extra
        workspace = unused_workspace
        if tail.reduce is not None:
            workspace = torch.empty(tail.workspace, dtype=torch.float32, device=x.device)
        kernel.run(entry, (x, d_gate, d_up, dw_gate, dw_up, workspace))
    if entry.extra.reduce is not None:
        entry.extra.reduce(workspace, dw_gate, dw_up)


def _weight_grad_key(x: Tensor, d_gate: Tensor, d_up: Tensor, dw_gate: Tensor):
    M, K = x.shape
    dtype = x.dtype
    return (M, d_gate.shape[1], K, x.stride(), d_gate.stride(), d_up.stride(), dw_gate.stride(), dtype, dw_gate.dtype,
            _allow_tf32(dtype), x.get_device())  # fmt: skip


def launch_weight_grad(x: Tensor, d_gate: Tensor, d_up: Tensor, dw_gate: Tensor, dw_up: Tensor, tma: bool) -> None:
    """(dw_gate, dw_up) = x^T @ (d_gate, d_up) (M > 0), by the TMA or the pointer kernel."""
    key = _weight_grad_key(x, d_gate, d_up, dw_gate)
    _run_weight_grad(_weight_grad_launch(*key, tma), x, d_gate, d_up, dw_gate, dw_up,
                     _weight_grad_plan(*key).unused_workspace)  # fmt: skip


def _weight_grads_empty(x: Tensor, d_gate: Tensor, dtype: torch.dtype, column_major: bool) -> Tuple[Tensor, Tensor]:
    K, N = x.shape[1], d_gate.shape[1]
    strides = (1, K) if column_major else (N, 1)
    return tuple(torch.empty_strided((K, N), strides, dtype=dtype, device=x.device) for _ in range(2))


def _swiglu_weight_grad_fake(x, d_gate, d_up, dtype, column_major=False):
    return _weight_grads_empty(x, d_gate, dtype, column_major)


@custom_op("fused_swiglu::swiglu_weight_grad", fake=_swiglu_weight_grad_fake)
def swiglu_weight_grad(
    x: Tensor, d_gate: Tensor, d_up: Tensor, dtype: torch.dtype, column_major: bool = False
) -> Tuple[Tensor, Tensor]:
    """(dw_gate, dw_up) = (x^T @ d_gate, x^T @ d_up), reduced over all M rows -> (K, N) each, in
    `dtype`: x's, or fp32 for fp32 weights under autocast (the fp32 accumulator stored uncast);
    column_major: with strides (1, K), the layout of an nn.Linear weight's transposed view.

    A last, partial wave of output tiles splits its reduction (configs.weight_grad_split): those
    programs write fp32 partial sums to a workspace, which a second kernel adds up in order.
    """
    M = x.shape[0]
    dw_gate, dw_up = _weight_grads_empty(x, d_gate, dtype, column_major)
    if M == 0:
        return dw_gate.zero_(), dw_up.zero_()
    plan = _weight_grad_plan(*_weight_grad_key(x, d_gate, d_up, dw_gate))
    chosen = plan.tma if plan.tma is not None and _aligned(x, d_gate, d_up) else plan.pointer
    _run_weight_grad(chosen, x, d_gate, d_up, dw_gate, dw_up, plan.unused_workspace)
    return dw_gate, dw_up


PLAN_BUILDERS = (_forward_launch, _forward_plan, _grad_launch, _down_grad_launch, _down_grad_plan, _input_grad_launch,
                 _input_grad_plan, _weight_grad_launch, _weight_grad_plan)  # fmt: skip


def clear_plans() -> None:
    """Forget every plan and tuned choice (after a test changes what the plans are built from)."""
    for builder in PLAN_BUILDERS:
        builder.cache_clear()
    for kernel in TUNED_KERNELS:
        kernel.clear()
