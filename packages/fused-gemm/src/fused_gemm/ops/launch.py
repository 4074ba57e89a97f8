"""The launchers: every matmul of this package (forward and both backward products), and the
backward's elementwise pass.

    c[b] = act(a[b] @ b[b] + bias)    a (batch, M, K), b (batch, K, N), c (batch, M, N)

All matmul operands are 3-D views with any strides (a transpose is a view, never a copy). The
launcher picks the kernel:
- the warp-specialized Gluon kernel (kernels.matmul_ws; Triton 3.6, Hopper) for large forward
  products with an activation and no z to store (not a training forward that saves it) whose
  operands it can address (one batch, a and c row-major, b the transpose of a row-major weight):
  its epilogue runs beside the next tile's MMAs;
- the GEMV kernel (kernels.gemv) for one row of 16-bit operands times a weight whose rows are
  contiguous in K (b = W^T of an nn.Linear weight), any GPU and Triton, and the interpreter;
- the persistent TMA kernel (kernels.matmul_tma) on a Hopper GPU with Triton >= 3.4 when every
  operand is fp16/bf16, 16-byte aligned, and has a unit stride in one of its two matrix dims
  (row-major, or the transpose of row-major);
- the portable kernel (kernels.matmul) otherwise: any GPU, any Triton, any strides, fp32; small
  products, which it runs as fast and launches with less host time (SMALL_MACS); products of at
  most SKINNY_ROWS rows of 16-bit operands (decode steps), with tiles that stream the weight; and under the
  interpreter (tests force the emulated TMA kernel with path="tma"), with a tile that
  follows the problem's size (configs.interpreter_config).

Host path: what depends only on shapes, strides, dtypes, options and the device (the kernel
choice, layouts, split-K, descriptor geometry) is decided once per distinct problem, in an
immutable plan (functools.lru_cache). The first launch of a plan chooses its config: it times the
kernel's candidate configs for it (its autotuner's list, pruned by the autotuner's rule, timed by
ops.tuning in interleaved rounds rather than by Triton's autotuner), then publishes the chosen
one, whole, in a PublishedCache: its Launch (`_runtime.launch`: grid, fixed arguments, direct
calls of the compiled kernel after the first) and, for the TMA kernel, the descriptors' geometry
and block shapes. Threads that meet an unpublished plan each tune, and all use the first choice
published. A plan re-tunes when the kernel's config list is replaced (tests pin configs that
way). Per call: look up the plan and its choice, put the operands into the descriptors, launch.

kernels.matmul_ws's plan is its Launch (every argument but the operands fixed) and the Gluon
descriptor templates of a, w and c; a call puts its tensors into them (descriptor_like).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional, Tuple

import torch
import triton

from .._compat import supports_tma
from .._runtime.cache import PublishedCache
from .._runtime.compat import (
    HAS_GLUON_HOPPER,
    INTERPRETING,
    descriptor_like,
    gluon_descriptor_template,
    multiprocessor_count,
    tensor_descriptor,
)
from .._runtime.launch import Launch, launch_options
from .._runtime.tuning import skinny_problem
from ..kernels.configs import (
    grad_rows,
    grad_tile,
    interpreter_config,
    portable_candidates,
    split_k,
    splits_epilogue,
    tma_block_shapes,
    tma_candidates,
)
from ..kernels.gemv import _gemv_kernel
from ..kernels.grad import _activation_grad_kernel
from ..kernels.matmul import _matmul_kernel
from ..kernels.matmul_tma import _matmul_tma_kernel
from .tuning import fastest

TMA_DTYPES = (torch.float16, torch.bfloat16)
# kernels.matmul_ws's tile, and when the launcher prefers it: K of at least WS_MIN_K and at least
# WS_MIN_WAVES tiles per SM (its epilogue hides behind the next tile's MMAs).
WS_BLOCK_M, WS_BLOCK_N, WS_MIN_K, WS_MIN_WAVES = 128, 256, 512, 2
# Products the launcher leaves to the portable kernel even where the TMA kernel runs: under
# SMALL_MACS multiply-adds and at most SMALL_K deep (32 K steps of 64 on a program's path), a
# product is bound by launch latency on the GPU, and the TMA kernel's launch costs more host time:
# Triton encodes its tensor descriptors at every launch (H200, Triton 3.6, a 64x64x64 bf16 product:
# 31 us per launch_matmul against 18 us for the portable kernel).
SMALL_MACS, SMALL_K = 2**27, 2048

# Each plan's chosen config, by (id(plan), id(the kernel's config list)). An entry holds both
# objects, so neither id can name another object while the entry exists.
_TUNED = PublishedCache()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _device(index: int) -> torch.device:
    """The device of a tensor whose get_device() is `index` (-1: the CPU of interpreted kernels)."""
    return torch.device("cuda", index) if index >= 0 else torch.device("cpu")


def _is_contiguous(shape, stride) -> bool:
    """torch's is_contiguous, from the shape and strides: dims of size 1 may have any stride."""
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride)):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


class _WsPlan(NamedTuple):
    """kernels.matmul_ws's launch for one problem: a Launch of the kernel with every argument but the
    descriptors and the bias fixed, and the descriptor templates of a, w (b's transpose) and c."""

    launch: Launch
    templates: Tuple[object, object, object]


def _ws_plan(m: int, n: int, k: int, a_stride, b_stride, c_stride, dtype, activation: int, has_bias: bool,
             num_sms: int) -> _WsPlan:  # fmt: skip
    """kernels.matmul_ws (imported here: Triton 3.6's Gluon only), one persistent program per SM or tile."""
    from ..kernels import matmul_ws as ws

    templates = (
        gluon_descriptor_template((m, k), (a_stride[1], 1), (ws.BLOCK_M, ws.BLOCK_K), dtype),
        gluon_descriptor_template((n, k), (b_stride[2], 1), (ws.BLOCK_N, ws.BLOCK_K), dtype),
        gluon_descriptor_template((m, n), (c_stride[1], 1), (ws.BLOCK_M, ws.CHUNK_N), dtype),
    )
    tiles = _cdiv(m, ws.BLOCK_M) * _cdiv(n, ws.BLOCK_N)
    launch = Launch(
        ws._matmul_ws_kernel, (min(num_sms, tiles),), num_warps=ws.MMA_WARPS, M=m, N=n, K=k, NSTAGES=ws.STAGES,
        GROUP=ws.GROUP_M, ACTIVATION=activation, HAS_BIAS=has_bias, EPI_WARPS=ws.EPILOGUE_WARPS,
        EPI_REGISTERS=ws.EPILOGUE_REGISTERS,
    )  # fmt: skip
    return _WsPlan(launch, templates)


def run_matmul_ws(plan: _WsPlan, a, b, c, bias) -> None:
    """c[0] = act(a[0] @ b[0] + bias) by kernels.matmul_ws: the (1, ...) operands' data in the
    plan's descriptors (b[0] is the transpose of a row-major (N, K) weight: the same data)."""
    a_t, w_t, c_t = plan.templates
    plan.launch(descriptor_like(a_t, a), descriptor_like(w_t, b), descriptor_like(c_t, c), c if bias is None else bias)


class _Tuned(NamedTuple):
    """A plan's chosen config, ready to launch; `plan` and `configs` are the objects its key names."""

    plan: object
    configs: list
    launch: Launch
    descriptors: tuple = ()  # TMA: the a, b and c descriptors (z's is c's) with no data yet
    block_m: int = 0


def _tuned_key(plan, configs) -> Tuple[int, int]:
    return id(plan), id(configs)


def _config_launch(kernel, grid, config, **fixed) -> Launch:
    """A Launch of `kernel` (a JIT function) over `grid` with `config`'s meta-parameters and compile options."""
    return Launch(kernel, grid, **launch_options(config), **config.kwargs, **fixed)


def _fastest(choices: list, calls: Callable) -> object:
    """The fastest of `choices` (ops.tuning), each launched by calls(choice)(); the only one without launching it."""
    if len(choices) == 1:
        return choices[0]
    return choices[fastest([calls(choice) for choice in choices])]


def _matrix_layout(shape, stride, element_size: int) -> Optional[bool]:
    """For a (batch, rows, cols) view: False if its matrices are row-major, True if they are the
    transpose of row-major, None if a tensor descriptor cannot address it (TMA needs a unit
    stride and 16-byte aligned, positive other strides: a broadcast (expanded) operand takes the
    portable kernel). The base address is part of the caller's key."""
    if shape[0] > 1 and (stride[0] <= 0 or (stride[0] * element_size) % 16):
        return None
    if stride[2] == 1 and stride[1] > 0 and (stride[1] * element_size) % 16 == 0:
        return False
    if stride[1] == 1 and stride[2] > 0 and (stride[2] * element_size) % 16 == 0:
        return True
    return None


def _descriptor_geometry(shape, stride, transposed: bool, batched: bool):
    """(shape, strides) of the descriptor over a (batch, rows, cols) view: over its transpose when
    `transposed`, 2-D without a batch."""
    batch, rows, cols = shape
    stride_batch, stride_rows, stride_cols = stride
    if transposed:
        rows, cols, stride_rows, stride_cols = cols, rows, stride_cols, stride_rows
    if batched:
        return [batch, rows, cols], [stride_batch, stride_rows, stride_cols]
    return [rows, cols], [stride_rows, stride_cols]


class TmaPlan(NamedTuple):
    """What the TMA kernel computes for one problem, before its config is chosen."""

    geometry: tuple  # (shape, strides) of the a, b and c descriptors; z's are c's
    m: int
    n: int
    k: int
    batch: int
    split: int  # > 1: c is the fp32 split-K workspace (split x batch, M, N)
    stride_bias: int  # 0 without a bias
    has_bias: bool
    activation: int
    store_z: bool
    grad_z: bool
    column_sum: bool
    a_trans: bool
    b_trans: bool
    c_trans: bool
    batched: bool
    element_size: int
    c_size: int
    num_sms: int
    device: torch.device

    @property
    def uses_z(self) -> bool:
        return self.store_z or self.grad_z


@functools.lru_cache(maxsize=1024)
def _tma_plan(a_shape, a_stride, b_shape, b_stride, c_stride, dtype, c_dtype, bias_stride, activation: int,
              device_index: int, split: int, store_z: bool, grad_z: bool,
              column_sum: bool) -> Optional[TmaPlan]:  # fmt: skip
    """The TMA kernel's plan, or None where it cannot run (the caller checked that the bases are
    16-byte aligned and that z is laid out like c; K = 0 goes to the portable kernel: a descriptor
    cannot have a zero-sized dim). c_dtype: the operands' dtype, or fp32 (the accumulator uncast).
    split > 1: c is the split-K workspace, fp32 (split x batch, M, N) row-major. grad_z: z is the
    activation's saved input of a fused activation gradient (c row-major, unbatched), column_sum
    its d(bias) partial sums. Every call passes every argument, in order: lru_cache keys calls by
    how their arguments are passed, and each problem must have one plan (its tuned choice is keyed
    by the plan)."""
    device = _device(device_index)
    if dtype not in TMA_DTYPES or not supports_tma(device):
        return None
    element_size, c_size = dtype.itemsize, c_dtype.itemsize
    batch, m, k = a_shape
    n = b_shape[2]
    c_shape = (batch * split, m, n)
    if k == 0:
        return None
    layouts = [
        _matrix_layout(a_shape, a_stride, element_size),
        _matrix_layout(b_shape, b_stride, element_size),
        _matrix_layout(c_shape, c_stride, c_size),
    ]
    if None in layouts:
        return None
    a_trans, b_trans, c_trans = layouts
    batched = batch > 1
    if grad_z and (c_trans or batched):
        return None
    geometry = (
        _descriptor_geometry(a_shape, a_stride, a_trans, batched),
        _descriptor_geometry(b_shape, b_stride, b_trans, batched),
        _descriptor_geometry(c_shape, c_stride, c_trans, batched or split > 1),
    )
    return TmaPlan(
        geometry, m, n, k, batch, split, bias_stride or 0, bias_stride is not None, activation, store_z, grad_z,
        column_sum, a_trans, b_trans, c_trans, batched, element_size, c_size, multiprocessor_count(device), device,
    )  # fmt: skip


def tma_plan(
    a, b, c, z=None, bias=None, activation: int = 0, split: int = 1, grad_z: bool = False, column_sum: bool = False
) -> Optional[TmaPlan]:
    """The TMA kernel's plan for these operands (z laid out like c; with split > 1, c is the fp32
    split-K workspace; with grad_z, z is read for a fused activation gradient), or None where it
    cannot run."""
    pointers = a.data_ptr() | b.data_ptr() | c.data_ptr() | (0 if z is None else z.data_ptr())
    if pointers % 16 or (z is not None and z.stride() != c.stride()):
        return None
    return _tma_plan(
        a.shape, a.stride(), b.shape, b.stride(), c.stride(), a.dtype, c.dtype,
        None if bias is None else bias.stride(0), activation, a.get_device(), split, z is not None and not grad_z,
        grad_z, column_sum,
    )  # fmt: skip


def _tma_choice(plan: TmaPlan, configs: list, config) -> _Tuned:
    """The TMA kernel's launch of `config` for `plan`, with its descriptors' block shapes."""
    meta = config.kwargs
    work = plan.batch * plan.split * _cdiv(plan.m, meta["BLOCK_M"]) * _cdiv(plan.n, meta["BLOCK_N"])
    grid = (min(work, plan.num_sms * meta["PROGRAMS_PER_SM"]),)
    halves = splits_epilogue(meta, plan.activation, plan.uses_z, plan.c_size == 4)
    blocks = tma_block_shapes(meta, plan.a_trans, plan.b_trans, plan.c_trans, plan.batched, halves, plan.split > 1)
    descriptors = tuple(
        tensor_descriptor(None, shape, strides, block) for (shape, strides), block in zip(plan.geometry, blocks)
    )
    launch = _config_launch(
        _matmul_tma_kernel.fn, grid, config, stride_bias=plan.stride_bias, M=plan.m, N=plan.n, K=plan.k,
        BATCH=plan.batch, SPLIT_K=plan.split, HAS_BIAS=plan.has_bias, ACTIVATION=plan.activation,
        STORE_Z=plan.store_z, GRAD_Z=plan.grad_z, COLUMN_SUM=plan.column_sum, A_TRANS=plan.a_trans,
        B_TRANS=plan.b_trans, C_TRANS=plan.c_trans, BATCHED=plan.batched, SPLIT_OUT=plan.split > 1,
        UPCAST=INTERPRETING, NUM_SMS=plan.num_sms,
    )  # fmt: skip
    return _Tuned(plan, configs, launch, descriptors, meta["BLOCK_M"])


def _run_tma(tuned: _Tuned, a, b, c, z, bias, colsum) -> None:
    """The chosen launch on these operands: descriptors over a, b, c (and z), then the bias (c where
    there is none) and the column sums (c where there are none)."""
    a_desc, b_desc, c_desc = tuned.descriptors
    tuned.launch(
        descriptor_like(a_desc, a),
        descriptor_like(b_desc, b),
        descriptor_like(c_desc, c),
        None if z is None else descriptor_like(c_desc, z),
        c if bias is None else bias,
        c if colsum is None else colsum,
    )


def _tune_tma(plan: TmaPlan, configs: list, a, b, c, z, bias, colsum) -> _Tuned:
    """Choose `plan`'s config among `configs` on these operands and publish it."""
    candidates = tma_candidates(
        configs, plan.m, plan.n, plan.batch * plan.split, plan.element_size, plan.activation, plan.uses_z,
        plan.c_size, plan.device,
    )  # fmt: skip
    choices = [_tma_choice(plan, configs, config) for config in candidates]
    choice = _fastest(choices, lambda tuned: functools.partial(_run_tma, tuned, a, b, c, z, bias, colsum))
    if colsum is not None and len(choices) > 1:
        colsum.zero_()  # candidates with other BLOCK_M wrote partial sums into other rows
    return _TUNED.publish(_tuned_key(plan, configs), choice)


def _launch_tma(plan: TmaPlan, a, b, c, z, bias, colsum=None) -> None:
    configs = _matmul_tma_kernel.configs
    tuned = _TUNED.get(_tuned_key(plan, configs))
    if tuned is None:
        tuned = _tune_tma(plan, configs, a, b, c, z, bias, colsum)
    _run_tma(tuned, a, b, c, z, bias, colsum)


class PortablePlan(NamedTuple):
    """What the portable kernel computes for one problem, before its config is chosen."""

    m: int
    n: int
    k: int
    batch: int
    element_size: int
    device: torch.device
    fixed: tuple  # (name, value) of each kernel argument the plan fixes, but the config's


@functools.lru_cache(maxsize=1024)
def _portable_plan(a_stride, b_stride, c_stride, batch, m, n, k, dtype, c_dtype, bias_stride, activation: int,
                   store_z: bool, allow_tf32: bool, device_index: int) -> PortablePlan:  # fmt: skip
    """The portable kernel's plan; dtypes and the bias's stride (which the kernel specializes on) key
    the tuned config too (fp32 doubles the shared memory of a tile)."""
    names = ("stride_a_batch", "stride_am", "stride_ak", "stride_b_batch", "stride_bk", "stride_bn",
             "stride_c_batch", "stride_cm", "stride_cn")  # fmt: skip
    fixed = (
        *zip(names, (*a_stride, *b_stride, *c_stride)),
        ("stride_bias", bias_stride or 0), ("M", m), ("N", n), ("K", k), ("HAS_BIAS", bias_stride is not None),
        ("ACTIVATION", activation), ("STORE_Z", store_z), ("ALLOW_TF32", allow_tf32), ("UPCAST", INTERPRETING),
    )  # fmt: skip
    return PortablePlan(m, n, k, batch, dtype.itemsize, _device(device_index), fixed)


def _portable_choice(plan: PortablePlan, configs: list, config) -> _Tuned:
    meta = config.kwargs
    grid = (plan.batch * _cdiv(plan.m, meta["BLOCK_M"]) * _cdiv(plan.n, meta["BLOCK_N"]),)
    # The JIT function under the autotuner and the EVEN_K heuristic.
    launch = _config_launch(
        _matmul_kernel.fn.fn, grid, config, **dict(plan.fixed), EVEN_K=plan.k % meta["BLOCK_K"] == 0
    )
    return _Tuned(plan, configs, launch)


def _launch_portable(plan: PortablePlan, a, b, c, z, bias) -> None:
    configs = _matmul_kernel.configs
    tuned = _TUNED.get(_tuned_key(plan, configs))
    if tuned is None:
        if INTERPRETING:  # nothing to time: the config follows the problem's size
            candidates = [interpreter_config(configs, plan.m, plan.n)]
        else:
            candidates = portable_candidates(configs, plan.m, plan.n, plan.element_size, plan.device)
        choices = [_portable_choice(plan, configs, config) for config in candidates]
        args = (a, b, c, c if z is None else z, c if bias is None else bias)
        choice = _fastest(choices, lambda tuned: functools.partial(tuned.launch, *args))
        tuned = _TUNED.publish(_tuned_key(plan, configs), choice)
    tuned.launch(a, b, c, c if z is None else z, c if bias is None else bias)


class _SplitPlan(NamedTuple):
    """A plain product by the TMA kernel in K slices: fp32 partial sums in a workspace, then their sum."""

    workspace: TmaPlan
    sum_in_place: bool  # c is contiguous fp32 (an fp32 weight's gradient): the sum is written into it


def _launch_split(plan: _SplitPlan, a, b, c, z, bias) -> None:
    work = plan.workspace
    workspace = torch.empty((work.split * work.batch, work.m, work.n), dtype=torch.float32, device=a.device)
    _launch_tma(work, a, b, workspace, None, None)
    partials = workspace.view(work.split, work.batch, work.m, work.n)
    if plan.sum_in_place:
        torch.sum(partials, 0, out=c)
    else:
        c.copy_(partials.sum(0))


def _launch_ws(plan: _WsPlan, a, b, c, z, bias) -> None:
    run_matmul_ws(plan, a, b, c, bias)


def _launch_nothing(plan, a, b, c, z, bias) -> None:
    pass


# The most batches kernels.gemv's grid takes (its second dim: CUDA's limit).
GEMV_MAX_BATCH = 65535


def _gemv_suits(batch: int, m: int, b_stride, dtype: torch.dtype) -> bool:
    """kernels.gemv computes c: one row of 16-bit operands, b the transpose of a weight whose rows
    are contiguous in K (nn.Linear's weight, b = W^T), at most GEMV_MAX_BATCH batches."""
    return m == 1 and dtype.itemsize == 2 and b_stride[1] == 1 and batch <= GEMV_MAX_BATCH


def _gemv_plan(a_stride, b_stride, c_stride, batch, n, k, bias_stride, activation, has_z) -> Launch:
    """kernels.gemv's launch. The tile is a rule, not a tuned choice: measured with the weight read
    from HBM (as in a decode step), 4 rows of 512 columns per program up to 4096 rows and 8 beyond
    were within 3 % of the best of 32 tiles on llama-1.4B's products (H200), while timing
    candidates on a weight the L2 cache holds favours other tiles."""
    block_n = 4 if n <= 4096 else 8
    block_k = min(512, max(16, triton.next_power_of_2(k)))
    return Launch(
        _gemv_kernel, (_cdiv(n, block_n), batch), num_warps=4, num_stages=1,
        stride_a_batch=a_stride[0], stride_ak=a_stride[2], stride_w_batch=b_stride[0], stride_wn=b_stride[2],
        stride_c_batch=c_stride[0], stride_cn=c_stride[2], stride_bias=bias_stride or 0, N=n, K=k,
        HAS_BIAS=bias_stride is not None, ACTIVATION=activation, STORE_Z=has_z, UPCAST=INTERPRETING,
        BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k % block_k == 0,
    )  # fmt: skip


def _launch_gemv(launch: Launch, a, b, c, z, bias) -> None:
    launch(a, b, c, c if z is None else z, c if bias is None else bias)


class _MatmulPlan(NamedTuple):
    """launch_matmul's choice for one problem: run(kernel_plan, a, b, c, z, bias), and what it returns."""

    ran: str
    run: Callable
    kernel_plan: object


def _ws_worthwhile(batch, m, n, k, has_z: bool, activation: int, num_sms: int) -> bool:
    """The launcher's choice of kernels.matmul_ws: a forward with an activation to hide (with or
    without a bias; no z to store, so not a training forward that saves it), large enough that
    every SM gets several 128x256 tiles. Measured on an H100 (Triton 3.6): bias +
    GELU 1.08-1.33x torch's F.gelu(F.linear) against 1.02-1.18x for the TMA kernel. Plain and
    bias-only products stay with the TMA kernel (level with cuBLAS; the bias costs it 0-6 %)."""
    if not HAS_GLUON_HOPPER or has_z or not activation:
        return False
    tiles = _cdiv(m, WS_BLOCK_M) * _cdiv(n, WS_BLOCK_N)
    return batch == 1 and k >= WS_MIN_K and tiles >= WS_MIN_WAVES * num_sms


def _row_major_16(row_stride: int, col_stride: int, element_size: int) -> bool:
    """A 2-D view TMA can address as row-major: unit column stride, 16-byte aligned rows (and base,
    which the caller checks)."""
    return col_stride == 1 and (row_stride * element_size) % 16 == 0


def _ws_runs(a_shape, a_stride, b_stride, c_stride, dtype, c_dtype, has_z, bias_stride, aligned, device) -> bool:
    """kernels.matmul_ws can compute c: Triton 3.6 on a Hopper GPU, one batch of 16-bit operands
    with K > 0, a and c row-major, b the transpose of a row-major (N, K) weight (nn.Linear's), no z
    to store, a contiguous bias."""
    if not HAS_GLUON_HOPPER or device.type != "cuda" or not supports_tma(device):
        return False
    if dtype not in TMA_DTYPES or c_dtype != dtype or not aligned:
        return False
    if a_shape[0] != 1 or a_shape[2] == 0 or has_z or bias_stride not in (None, 1):
        return False
    size = dtype.itemsize
    return (
        _row_major_16(a_stride[1], a_stride[2], size)
        and _row_major_16(b_stride[2], b_stride[1], size)
        and _row_major_16(c_stride[1], c_stride[2], size)
    )


@functools.lru_cache(maxsize=1024)
def _matmul_plan(a_shape, a_stride, b_shape, b_stride, c_stride, dtype, c_dtype, z_stride, bias_stride,
                 ab_aligned: bool, cz_aligned: bool, activation: int, allow_tf32: bool, path: Optional[str],
                 split: Optional[int], device_index: int) -> _MatmulPlan:  # fmt: skip
    """launch_matmul's kernel choice (its docstring) for one problem; raises where a forced path cannot run."""
    batch, m, k = a_shape
    n = b_shape[2]
    if batch * m * n == 0:
        return _MatmulPlan("none", _launch_nothing, None)
    device = _device(device_index)
    has_z = z_stride is not None
    num_sms = multiprocessor_count(device)
    if path == "ws" or (
        path is None and not INTERPRETING and _ws_worthwhile(batch, m, n, k, has_z, activation, num_sms)
    ):
        aligned = ab_aligned and cz_aligned
        if _ws_runs(a_shape, a_stride, b_stride, c_stride, dtype, c_dtype, has_z, bias_stride, aligned, device):
            plan = _ws_plan(m, n, k, a_stride, b_stride, c_stride, dtype, activation, bias_stride is not None, num_sms)
            return _MatmulPlan("ws", _launch_ws, plan)
        if path == "ws":
            raise ValueError("the warp-specialized kernel cannot run these operands (dtype, device, Triton or layout)")
    gemv = _gemv_suits(batch, m, b_stride, dtype) and (not has_z or z_stride == c_stride)
    if path == "gemv" or (path is None and gemv):
        if not gemv:
            raise ValueError("the GEMV kernel needs one row of 16-bit a, b with K stride 1 and z laid out like c")
        plan = _gemv_plan(a_stride, b_stride, c_stride, batch, n, k, bias_stride, activation, has_z)
        return _MatmulPlan("gemv", _launch_gemv, plan)
    # Small products, and skinny ones (bound by the weight's bytes), go to the portable kernel.
    small = (batch * m * n * k < SMALL_MACS and k <= SMALL_K) or skinny_problem(m, dtype.itemsize)
    if path == "tma" or (path is None and not INTERPRETING and not small):
        tma_args = (a_shape, a_stride, b_shape, b_stride)
        if ab_aligned and bias_stride is None and not activation and not has_z:  # a plain product may split K
            if split is None:
                split = split_k(batch, m, n, k, num_sms)
            workspace = None
            if split > 1:
                workspace = _tma_plan(
                    *tma_args, (m * n, n, 1), dtype, torch.float32, None, 0, device_index, split, False, False, False
                )
            if workspace is not None:
                in_place = c_dtype == torch.float32 and _is_contiguous((batch, m, n), c_stride)
                return _MatmulPlan("tma", _launch_split, _SplitPlan(workspace, in_place))
        if ab_aligned and cz_aligned and (not has_z or z_stride == c_stride):
            plan = _tma_plan(
                *tma_args, c_stride, dtype, c_dtype, bias_stride, activation, device_index, 1, has_z, False, False
            )
            if plan is not None:
                return _MatmulPlan("tma", _launch_tma, plan)
        if path == "tma":
            raise ValueError("the TMA kernel cannot run these operands (dtype, device, Triton or layout)")
    plan = _portable_plan(a_stride, b_stride, c_stride, batch, m, n, k, dtype, c_dtype, bias_stride, activation, has_z,
                          allow_tf32, device_index)  # fmt: skip
    return _MatmulPlan("portable", _launch_portable, plan)


def launch_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    *,
    bias: Optional[torch.Tensor] = None,
    activation: int = 0,
    z: Optional[torch.Tensor] = None,
    allow_tf32: bool = False,
    path: Optional[str] = None,
    split: Optional[int] = None,
) -> str:
    """Compute c (written in place) from a and b; returns the kernel that ran: "ws" (kernels.matmul_ws),
    "gemv", "tma", "portable", or "none" when c is empty.

    a (batch, M, K), b (batch, K, N): same dtype; c (batch, M, N): that dtype, or fp32 (the
    accumulator stored uncast); any strides.
    bias: (N,); activation: kernels.common ACTIVATION code; z: laid out like c, receives the
    pre-activation acc + bias. path: None picks; "ws" / "gemv" / "tma" / "portable" force one
    (tests), all but "portable" raising where they cannot run. split: the TMA kernel's K slices for
    a plain product (None: configs.split_k decides; tests force one).
    """
    plan = _matmul_plan(
        a.shape, a.stride(), b.shape, b.stride(), c.stride(), a.dtype, c.dtype, None if z is None else z.stride(),
        None if bias is None else bias.stride(0), (a.data_ptr() | b.data_ptr()) % 16 == 0,
        (c.data_ptr() | (0 if z is None else z.data_ptr())) % 16 == 0, activation, allow_tf32, path, split,
        a.get_device(),
    )  # fmt: skip
    plan.run(plan.kernel_plan, a, b, c, z, bias)
    return plan.ran


def launch_matmul_activation_grad(
    a: torch.Tensor,
    b: torch.Tensor,
    saved: torch.Tensor,
    activation: int,
    column_sum: bool,
    path: Optional[str] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(dz, d(bias)): dz = (a @ b) * act'(saved), (1, M, N) contiguous in a's dtype, and, when
    column_sum, dz summed over its rows (N,) in fp32 (else None).

    a (1, M, K), b (1, K, N): the upstream gradient and the next layer's weight (dH = dY @ W2^T in
    an MLP); saved: contiguous (1, M, N), what kernels.grad's pass reads for act' (z for the GELUs,
    the output for ReLU). The TMA kernel forms dz in its epilogue (kernels.matmul_tma, GRAD_Z);
    where it cannot run, the plain product and then the elementwise pass. path: None picks,
    "tma" / "unfused" force one (tests; "tma" raising where it cannot run).
    """
    _, m, _ = a.shape
    n = b.shape[2]
    dz = torch.empty((1, m, n), dtype=a.dtype, device=a.device)
    plan = None
    if path == "tma" or (path is None and not INTERPRETING):
        if m * n and a.shape[2]:
            plan = tma_plan(a, b, dz, saved, activation=activation, grad_z=True, column_sum=column_sum)
        if plan is None and path == "tma":
            raise ValueError("the TMA kernel cannot run these operands (dtype, device, Triton or layout)")
    if plan is None:
        launch_matmul(a, b, dz, path=None if path is None else "portable")
        return launch_activation_grad(dz, saved, activation, True, column_sum, torch.float32)
    configs = _matmul_tma_kernel.configs
    tuned = _TUNED.get(_tuned_key(plan, configs))
    colsum = None
    if column_sum:
        # One partial row per row tile, each written by its tiles; until a config is chosen, one per
        # row tile of the smallest BLOCK_M any config has, zeros where a wider tile writes none.
        if tuned is None:
            rows = _cdiv(m, min(config.kwargs["BLOCK_M"] for config in configs))
            colsum = torch.zeros((rows, n), dtype=torch.float32, device=a.device)
        else:
            colsum = torch.empty((_cdiv(m, tuned.block_m), n), dtype=torch.float32, device=a.device)
    if tuned is None:
        tuned = _tune_tma(plan, configs, a, b, dz, saved, None, colsum)
    _run_tma(tuned, a, b, dz, saved, None, colsum)
    return dz, colsum.sum(0) if column_sum else None


class _GradPlan(NamedTuple):
    """The elementwise pass for one problem: its launch (None without elements) and partial sums."""

    launch: Optional[Launch]
    partial_rows: int
    partial_dtype: torch.dtype


@functools.lru_cache(maxsize=1024)
def _grad_plan(batch: int, m: int, n: int, dy_stride: tuple, dtype, activation: int, write_dz: bool,
               column_sum: bool, device_index: int) -> _GradPlan:  # fmt: skip
    tile = grad_tile(m, n)
    rows = grad_rows(batch, m, n, multiprocessor_count(_device(device_index)), tile)
    row_programs = batch * _cdiv(m, rows)
    # Column sums in fp64 for fp32 gradients (see kernels.grad), fp32 for 16-bit ones.
    partial_dtype = torch.float64 if dtype == torch.float32 else torch.float32
    launch = None
    if batch * m * n:
        stride_batch, stride_m, stride_n = dy_stride
        launch = Launch(
            _activation_grad_kernel, (row_programs, _cdiv(n, tile["BLOCK_N"])), num_warps=tile["num_warps"],
            stride_dy_batch=stride_batch, stride_dy_m=stride_m, stride_dy_n=stride_n, M=m, N=n, ROWS=rows,
            ACTIVATION=activation, WRITE_DZ=write_dz, COLUMN_SUM=column_sum, UPCAST=INTERPRETING,
            BLOCK_M=tile["BLOCK_M"], BLOCK_N=tile["BLOCK_N"],
        )  # fmt: skip
    return _GradPlan(launch, row_programs, partial_dtype)


def launch_activation_grad(
    dy: torch.Tensor,
    saved: Optional[torch.Tensor],
    activation: int,
    write_dz: bool,
    column_sum: bool,
    sum_dtype: Optional[torch.dtype] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(dz, d(bias)) for dy (batch, M, N), any strides: dz = dy * act'(z) contiguous (batch, M, N) in
    dy's dtype when write_dz (else dy itself), and, when column_sum, dz summed over every batch
    and row (N,) in sum_dtype (default dy's; else None). saved: contiguous (batch, M, N): z for the GELUs, the
    output for ReLU, None without activation."""
    batch, m, n = dy.shape
    plan = _grad_plan(batch, m, n, dy.stride(), dy.dtype, activation, write_dz, column_sum, dy.get_device())
    dz = torch.empty((batch, m, n), dtype=dy.dtype, device=dy.device) if write_dz else dy
    partial = torch.empty((plan.partial_rows, n), dtype=plan.partial_dtype, device=dy.device) if column_sum else None
    if plan.launch is not None:
        plan.launch(dy, dy if saved is None else saved, dz, dy if partial is None else partial)
    if not column_sum:
        return dz, None
    sum_dtype = sum_dtype or dy.dtype
    if plan.launch is None:
        return dz, torch.zeros(n, dtype=sum_dtype, device=dy.device)
    return dz, partial.sum(0).to(sum_dtype)
