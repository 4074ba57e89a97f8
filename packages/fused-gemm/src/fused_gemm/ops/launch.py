"""The launchers: every matmul of this package (forward and both backward products), and the
backward's elementwise pass.

    c[b] = act(a[b] @ b[b] + bias)    a (batch, M, K), b (batch, K, N), c (batch, M, N)

All matmul operands are 3-D views with any strides (a transpose is a view, never a copy). The
launcher picks the kernel:
- the warp-specialized Gluon kernel (kernels.matmul_ws; Triton 3.6, Hopper) for large forward
  products with an activation and no z to store (not a training forward that saves it) whose
  operands it can address (one batch, a and c row-major, b the transpose of a row-major weight):
  its epilogue runs beside the next tile's MMAs;
- the persistent TMA kernel (kernels.matmul_tma) on a Hopper GPU with Triton >= 3.4 when every
  operand is fp16/bf16, 16-byte aligned, and has a unit stride in one of its two matrix dims
  (row-major, or the transpose of row-major);
- the portable kernel (kernels.matmul) otherwise: any GPU, any Triton, any strides, fp32; and
  under the interpreter (tests force the emulated TMA kernel with path="tma"), with a tile that
  follows the problem's size (configs.interpreter_config).

Host path: what depends only on shapes, strides, dtypes and options (kernel choice, layouts,
descriptor geometry) is computed once per distinct problem, a plan (functools.lru_cache). The
first launch of a plan times the kernel's candidate configs for it (its autotuner's list, pruned
by the autotuner's rule, timed by ops.tuning in interleaved rounds rather than by Triton's
autotuner); the plan then keeps the fastest (with its grid and descriptor block shapes), and
every launch calls the kernel with it directly: no autotuner key, pre-hook or grid callback per
call. A plan re-tunes when the kernel's config list is replaced (tests pin configs that way).
After a plan's first launch through Triton's JIT, the TMA kernel and the elementwise pass are
launched through the compiled kernel's launcher (_KernelLaunch; Triton 3.4 to 3.9): the plan's key
holds everything the JIT would specialize on (dtypes, strides, 16-byte alignment), so its per-call
argument binding and cache lookup are skipped.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from .._compat import (
    HAS_GLUON_WS,
    INTERPRETING,
    config_launch_kwargs,
    direct_launcher,
    multiprocessor_count,
    supports_tma,
    tensor_descriptor,
)
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
from ..kernels.grad import _activation_grad_kernel
from ..kernels.matmul import _matmul_kernel
from ..kernels.matmul_tma import _matmul_tma_kernel
from .tuning import fastest

TMA_DTYPES = (torch.float16, torch.bfloat16)
PATHS = ("tma", "portable")
# kernels.matmul_ws's tile, and when the launcher prefers it: K of at least WS_MIN_K and at least
# WS_MIN_WAVES tiles per SM (its epilogue hides behind the next tile's MMAs).
WS_BLOCK_M, WS_BLOCK_N, WS_MIN_K, WS_MIN_WAVES = 128, 256, 512, 2


def launch_matmul_ws(a, w, c, bias, activation: int, num_sms: int) -> None:
    """kernels.matmul_ws.launch_matmul_ws, imported on first use (Triton 3.6's Gluon only)."""
    from ..kernels.matmul_ws import launch_matmul_ws as launch

    launch(a, w, c, bias, activation, num_sms)


def _matrix_layout(shape, stride, element_size: int) -> Optional[bool]:
    """For a (batch, rows, cols) view: False if its matrices are row-major, True if they are the
    transpose of row-major, None if a tensor descriptor cannot address it (TMA needs a unit
    stride and 16-byte aligned, positive other strides: a broadcast (expanded) operand takes the
    portable kernel). The base address is checked per call."""
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


class _KernelLaunch:
    """One kernel's launch as a plan fixes it: the JIT function, the grid, the arguments after the
    per-call ones (constexprs included, in the signature's order) and the compile options.

    The first call goes through Triton's JIT (which compiles, and returns the compiled kernel);
    later calls use the compiled kernel's launcher directly where `_compat.direct_launcher` gives
    one, and go through the JIT while it declines (another device, or launch hooks installed).
    """

    __slots__ = ("kernel", "grid", "trailing", "options", "direct")

    def __init__(self, kernel, grid: tuple, n_per_call: int, args: tuple, meta: dict):
        """kernel: a JITFunction; n_per_call: how many leading arguments each call passes; args: the
        plain arguments after them; meta: the config's keywords (its constexprs and compile options)."""
        names = list(kernel.arg_names)
        self.kernel = kernel
        self.grid = (*grid, 1, 1)[:3]  # the direct launch takes all three dims
        self.trailing = (*args, *(meta[name] for name in names[n_per_call + len(args) :]))
        self.options = {key: value for key, value in meta.items() if key not in names}
        self.direct = None

    def __call__(self, *per_call) -> None:
        direct = self.direct
        if direct is not None and direct(self.grid, (*per_call, *self.trailing)):
            return
        compiled = self.kernel[self.grid](*per_call, *self.trailing, **self.options)
        if direct is None:
            self.direct = direct_launcher(compiled)


class _Plan:
    """What one distinct problem launches: `args` (the kernel's arguments after the tensors), and,
    once tuned, the config's launch keywords with the config list they came from, the grid,
    (TMA) the descriptors' block shapes and the kernel's _KernelLaunch."""

    __slots__ = ("geometry", "args", "configs", "meta", "grid", "blocks", "launch")

    def __init__(self, geometry, args):
        self.geometry = geometry
        self.args = args
        self.configs = None
        self.launch = None

    def tune(self, kernel, config, grid, blocks=None, n_per_call=None) -> None:
        """Keep `config`, one of `kernel`'s, for the next launches; with n_per_call (the arguments
        each call passes before `args`), also the launch of kernel.fn with it."""
        self.configs = kernel.configs
        self.meta = config_launch_kwargs(config)
        self.grid = grid(config.kwargs)
        self.blocks = blocks(config.kwargs) if blocks is not None else None
        if n_per_call is not None:
            self.launch = _KernelLaunch(kernel.fn, self.grid, n_per_call, self.args, self.meta)

    def tuned_for(self, kernel) -> bool:
        return self.configs is kernel.configs


@functools.lru_cache(maxsize=1024)
def _tma_plan(a_shape, a_stride, b_shape, b_stride, c_stride, c_size, z, dtype, bias, activation, num_sms,
              split=1, grad_z=False, column_sum=False):  # fmt: skip
    """The TMA kernel's plan, or None where it cannot run (c and z share c_stride; K = 0 goes to the
    portable kernel: a descriptor cannot have a zero-sized dim). The dtypes (the operands', and c's
    element size c_size: 4 for an fp32 output) are part of the key: the autotuner may choose
    differently per dtype. bias: None, or what the compiled kernel is specialized on (dtype,
    stride, 16-byte alignment). split > 1: c is the split-K workspace, fp32 (split x batch, M, N)
    row-major. grad_z: z is the activation's saved input of a fused activation gradient (c row-major,
    unbatched), column_sum its d(bias) partial sums."""
    element_size = dtype.itemsize
    batch, m, k = a_shape
    n = b_shape[2]
    c_shape = (batch * split, m, n)
    if k == 0:
        return None
    layouts = [
        _matrix_layout(shape, stride, size)
        for shape, stride, size in (
            (a_shape, a_stride, element_size),
            (b_shape, b_stride, element_size),
            (c_shape, c_stride, c_size),
        )
    ]
    if None in layouts:
        return None
    a_trans, b_trans, c_trans = layouts
    batched = batch > 1
    geometry = (
        _descriptor_geometry(a_shape, a_stride, a_trans, batched),
        _descriptor_geometry(b_shape, b_stride, b_trans, batched),
        _descriptor_geometry(c_shape, c_stride, c_trans, batched or split > 1),
    )
    if grad_z and (c_trans or batched):
        return None
    store_z = z and not grad_z
    has_bias = bias is not None
    flags = (has_bias, activation, store_z, grad_z, column_sum, a_trans, b_trans, c_trans, batched, split > 1)
    return _Plan(geometry, (m, n, k, batch, split, *flags, INTERPRETING, num_sms))


def tma_plan(
    a, b, c, z=None, bias=None, activation: int = 0, split: int = 1, grad_z: bool = False, column_sum: bool = False
) -> Optional[_Plan]:
    """The TMA kernel's plan for these operands (z laid out like c; with split > 1, c is the fp32
    split-K workspace; with grad_z, z is read for a fused activation gradient), or None where it
    cannot run."""
    if a.dtype not in TMA_DTYPES or not supports_tma(a.device):
        return None
    if a.data_ptr() % 16 or b.data_ptr() % 16 or c.data_ptr() % 16:
        return None
    if z is not None and (z.data_ptr() % 16 or z.stride() != c.stride()):
        return None
    bias_key = None if bias is None else (bias.dtype, bias.stride(0), bias.data_ptr() % 16 == 0)
    return _tma_plan(
        a.shape, a.stride(), b.shape, b.stride(), c.stride(), c.element_size(), z is not None, a.dtype,
        bias_key, activation, multiprocessor_count(a.device), split, grad_z, column_sum,
    )  # fmt: skip


def _launch_tma(plan: _Plan, a, b, c, z, bias, colsum=None) -> None:
    (a_shape, a_strides), (b_shape, b_strides), (c_shape, c_strides) = plan.geometry
    m, n, k, batch, split, *flags, _, num_sms = plan.args
    has_bias, activation, store_z, grad_z, _, a_trans, b_trans, c_trans, batched, split_out = flags
    uses_z = store_z or grad_z
    # The per-call arguments: four descriptors, then the bias (c where there is none), its stride
    # and the column sums (c where there are none).
    bias_args = ((bias, bias.stride(0)) if has_bias else (c, 0)) + (colsum if colsum is not None else c,)

    def descriptors(blocks):
        a_block, b_block, c_block = blocks
        return (
            tensor_descriptor(a, a_shape, a_strides, a_block),
            tensor_descriptor(b, b_shape, b_strides, b_block),
            tensor_descriptor(c, c_shape, c_strides, c_block),
            tensor_descriptor(z, c_shape, c_strides, c_block) if uses_z else None,
        )

    if not plan.tuned_for(_matmul_tma_kernel):

        def run(grid, blocks, meta) -> None:
            _matmul_tma_kernel.fn[grid](*descriptors(blocks), *bias_args, *plan.args, **meta)

        def grid(meta):
            work = batch * split * -(-m // meta["BLOCK_M"]) * -(-n // meta["BLOCK_N"])
            return (min(work, num_sms * meta["PROGRAMS_PER_SM"]),)

        def blocks(meta):
            halves = splits_epilogue(meta, activation, uses_z, c.element_size() == 4)
            return tma_block_shapes(meta, a_trans, b_trans, c_trans, batched, halves, split_out)

        candidates = tma_candidates(
            _matmul_tma_kernel.configs, m, n, batch * split, a.element_size(), activation, uses_z, c.element_size(),
            a.device,
        )  # fmt: skip
        config = _fastest(candidates, lambda cfg: functools.partial(run, grid(cfg.kwargs), blocks(cfg.kwargs),
                                                                    config_launch_kwargs(cfg)))  # fmt: skip
        plan.tune(_matmul_tma_kernel, config, grid, blocks, n_per_call=4 + len(bias_args))
        if colsum is not None and len(candidates) > 1:
            colsum.zero_()  # candidates with other BLOCK_M wrote partial sums into other rows
    plan.launch(*descriptors(plan.blocks), *bias_args)


def _fastest(candidates, launch_of):
    """The fastest of `candidates` (ops.tuning), each launched by launch_of(config)(); the only
    one without launching it."""
    if len(candidates) == 1:
        return candidates[0]
    return candidates[fastest([launch_of(config) for config in candidates])]


@functools.lru_cache(maxsize=1024)
def _portable_plan(a_stride, b_stride, c_stride, batch, m, n, k, dtype, has_bias, activation, z, allow_tf32):
    """The portable kernel's plan: its stride arguments, and the tuned config (whose shared memory
    depends on the dtype: fp32 doubles it)."""
    return _Plan(None, (*a_stride, *b_stride, *c_stride))


def _launch_portable(a, b, c, z, bias, activation: int, allow_tf32: bool) -> None:
    batch, m, k = a.shape
    n = b.shape[2]
    has_bias = bias is not None
    plan = _portable_plan(a.stride(), b.stride(), c.stride(), batch, m, n, k, a.dtype, has_bias, activation,
                          z is not None, allow_tf32)  # fmt: skip
    tensors = (a, b, c, z if z is not None else c, bias if has_bias else c)
    args = (*plan.args, bias.stride(0) if has_bias else 0, m, n, k, has_bias, activation, z is not None, allow_tf32,
            INTERPRETING)  # fmt: skip

    def run(grid, meta) -> None:
        # The kernel under the autotuner and the EVEN_K heuristic.
        _matmul_kernel.fn.fn[grid](*tensors, *args, EVEN_K=k % meta["BLOCK_K"] == 0, **meta)

    if not plan.tuned_for(_matmul_kernel):

        def grid(meta):
            return (batch * -(-m // meta["BLOCK_M"]) * -(-n // meta["BLOCK_N"]),)

        if INTERPRETING:  # nothing to time: the config follows the problem's size
            config = interpreter_config(_matmul_kernel.configs, m, n)
        else:
            candidates = portable_candidates(_matmul_kernel.configs, m, n, a.element_size(), a.device)
            config = _fastest(
                candidates, lambda cfg: functools.partial(run, grid(cfg.kwargs), config_launch_kwargs(cfg))
            )
        plan.tune(_matmul_kernel, config, grid)
    run(plan.grid, plan.meta)


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
    "tma", "portable", or "none" when c is empty.

    a (batch, M, K), b (batch, K, N): same dtype; c (batch, M, N): that dtype, or fp32 (the
    accumulator stored uncast); any strides.
    bias: (N,); activation: kernels.common ACTIVATION code; z: laid out like c, receives the
    pre-activation acc + bias. path: None picks; "ws" / "tma" / "portable" force one (tests), "ws"
    and "tma" raising where they cannot run. split: the TMA kernel's K slices for a plain product (None:
    configs.split_k decides; tests force one).
    """
    batch, m, k = a.shape
    n = b.shape[2]
    if batch * m * n == 0:
        return "none"
    if path == "ws" or (path is None and not INTERPRETING and _ws_worthwhile(a, b, bias, activation, z)):
        if _ws_runs(a, b, c, z, bias):
            launch_matmul_ws(a[0], b[0].t(), c[0], bias, activation, multiprocessor_count(a.device))
            return "ws"
        if path == "ws":
            raise ValueError("the warp-specialized kernel cannot run these operands (dtype, device, Triton or layout)")
    if path == "tma" or (path is None and not INTERPRETING):
        if bias is None and not activation and z is None:  # a plain product may split K
            if split is None:
                split = split_k(batch, m, n, k, multiprocessor_count(a.device))
            if split > 1 and _launch_split_tma(a, b, c, split):
                return "tma"
        plan = tma_plan(a, b, c, z, bias, activation)
        if plan is not None:
            _launch_tma(plan, a, b, c, z, bias)
            return "tma"
        if path == "tma":
            raise ValueError("the TMA kernel cannot run these operands (dtype, device, Triton or layout)")
    _launch_portable(a, b, c, z, bias, activation, allow_tf32)
    return "portable"


def _row_major_16(t: torch.Tensor) -> bool:
    """A 2-D view TMA can address as row-major: unit column stride, 16-byte aligned rows."""
    return t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def _ws_runs(a, b, c, z, bias) -> bool:
    """kernels.matmul_ws can compute c: Triton 3.6 on a Hopper GPU, one batch of 16-bit operands,
    a and c row-major, b the transpose of a row-major (N, K) weight (nn.Linear's), no z to store,
    a contiguous bias."""
    if not HAS_GLUON_WS or not a.is_cuda or not supports_tma(a.device):
        return False
    if a.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a.dtype or c.dtype != a.dtype:
        return False
    if a.shape[0] != 1 or z is not None or (bias is not None and bias.stride(0) != 1):
        return False
    return _row_major_16(a[0]) and _row_major_16(b[0].t()) and _row_major_16(c[0])


def _ws_worthwhile(a, b, bias, activation: int, z) -> bool:
    """The launcher's choice of kernels.matmul_ws: a forward with an activation to hide (with or
    without a bias; no z to store, so not a training forward that saves it), large enough that
    every SM gets several 128x256 tiles. Measured on an H100 (Triton 3.6): bias +
    GELU 1.08-1.33x torch's F.gelu(F.linear) against 1.02-1.18x for the TMA kernel. Plain and
    bias-only products stay with the TMA kernel (level with cuBLAS; the bias costs it 0-6 %)."""
    if not HAS_GLUON_WS or z is not None or not activation:
        return False
    batch, m, k = a.shape
    tiles = -(-m // WS_BLOCK_M) * -(-b.shape[2] // WS_BLOCK_N)
    return batch == 1 and k >= WS_MIN_K and tiles >= WS_MIN_WAVES * multiprocessor_count(a.device)


def _launch_split_tma(a, b, c, split: int) -> bool:
    """c = a @ b by the TMA kernel in `split` K slices: fp32 partial sums in a workspace, added up
    and cast into c; False where the TMA kernel cannot run these operands."""
    batch, m, _ = a.shape
    n = b.shape[2]
    workspace = torch.empty((split * batch, m, n), dtype=torch.float32, device=a.device)
    plan = tma_plan(a, b, workspace, split=split)
    if plan is None:
        return False
    _launch_tma(plan, a, b, workspace, None, None)
    partials = workspace.view(split, batch, m, n)
    if c.dtype == torch.float32 and c.is_contiguous():  # an fp32 weight's gradient: summed in place
        torch.sum(partials, 0, out=c)
    else:
        c.copy_(partials.sum(0))
    return True


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
    colsum = None
    if column_sum:
        # One partial row per row tile of the smallest BLOCK_M any config has; tiles write theirs.
        row_tiles = -(-m // min(config.kwargs["BLOCK_M"] for config in _matmul_tma_kernel.configs))
        colsum = torch.zeros((row_tiles, n), dtype=torch.float32, device=a.device)
    _launch_tma(plan, a, b, dz, saved, None, colsum)
    return dz, colsum.sum(0) if column_sum else None


@functools.lru_cache(maxsize=1024)
def _grad_plan(batch: int, m: int, n: int, programs: int):
    """(tile, rows per program, grid, partial rows) of the elementwise pass."""
    tile = grad_tile(m, n)
    rows = grad_rows(batch, m, n, programs, tile)
    row_programs = batch * -(-m // rows)
    return tile, rows, (row_programs, -(-n // tile["BLOCK_N"])), row_programs


@functools.lru_cache(maxsize=1024)
def _grad_launch(batch: int, m: int, n: int, programs: int, dy_stride: tuple, dtypes: tuple, aligned: tuple,
                 activation: int, write_dz: bool, column_sum: bool) -> _KernelLaunch:  # fmt: skip
    """The elementwise pass's launch; the key holds what its compiled kernel is specialized on
    (the four pointers' dtypes and 16-byte alignment, dy's strides, N) besides its plan's."""
    tile, rows, grid, _ = _grad_plan(batch, m, n, programs)
    args = (*dy_stride, m, n, rows, activation, write_dz, column_sum, INTERPRETING)
    return _KernelLaunch(_activation_grad_kernel, grid, 4, args, tile)


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
    dz = torch.empty((batch, m, n), dtype=dy.dtype, device=dy.device) if write_dz else dy
    # Column sums in fp64 for fp32 gradients (see kernels.grad), fp32 for 16-bit ones.
    partial_dtype = torch.float64 if dy.dtype == torch.float32 else torch.float32
    programs = multiprocessor_count(dy.device)
    partial_rows = _grad_plan(batch, m, n, programs)[3]
    partial = torch.empty((partial_rows, n), dtype=partial_dtype, device=dy.device) if column_sum else None
    if batch * m * n:
        pointers = (dy, saved if saved is not None else dy, dz, partial if column_sum else dy)
        launch = _grad_launch(
            batch, m, n, programs, dy.stride(), tuple(t.dtype for t in pointers),
            tuple(t.data_ptr() % 16 == 0 for t in pointers), activation, write_dz, column_sum,
        )  # fmt: skip
        launch(*pointers)
    if not column_sum:
        return dz, None
    sum_dtype = sum_dtype or dy.dtype
    dbias = partial.sum(0).to(sum_dtype) if partial_rows else torch.zeros(n, dtype=sum_dtype, device=dy.device)
    return dz, dbias
