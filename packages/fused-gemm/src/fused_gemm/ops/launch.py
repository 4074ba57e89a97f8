"""The launchers: every matmul of this package (forward and both backward products), and the
backward's elementwise pass.

    c[b] = act(a[b] @ b[b] + bias)    a (batch, M, K), b (batch, K, N), c (batch, M, N)

All matmul operands are 3-D views with any strides (a transpose is a view, never a copy). The
launcher picks the kernel:
- the persistent TMA kernel (kernels.matmul_tma) on a Hopper GPU with Triton >= 3.4 when every
  operand is fp16/bf16, 16-byte aligned, and has a unit stride in one of its two matrix dims
  (row-major, or the transpose of row-major);
- the portable kernel (kernels.matmul) otherwise: any GPU, any Triton, any strides, fp32; and
  under the interpreter, where it runs with small tiles (the emulated TMA kernel is several
  times slower there; tests force it with path="tma").

Host path: what depends only on shapes, strides and dtypes (kernel choice, layouts, descriptor
shapes, grids, the elementwise pass's row split) is computed once per distinct problem
(functools.lru_cache); a call then checks alignment, builds the tensor descriptors and launches.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from .._compat import INTERPRETING, TensorDescriptor, multiprocessor_count, supports_tma
from ..kernels.configs import GRAD_TILE, grad_rows
from ..kernels.grad import _activation_grad_kernel
from ..kernels.matmul import _matmul_kernel
from ..kernels.matmul_tma import _matmul_tma_kernel

TMA_DTYPES = (torch.float16, torch.bfloat16)
PATHS = ("tma", "portable")


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


@functools.lru_cache(maxsize=1024)
def _tma_plan(a_shape, a_stride, b_shape, b_stride, c_stride, z_stride, element_size: int):
    """Descriptor geometries and kernel flags for the TMA kernel, or None where it cannot run.

    c (and z, laid out like it) has the shape (batch, M, N) of a @ b. A tensor with a zero-sized
    dim has no descriptor (callers skip empty outputs; K = 0 goes to the portable kernel).
    """
    batch, m, k = a_shape
    n = b_shape[2]
    c_shape = (batch, m, n)
    if k == 0:
        return None
    layouts = [_matrix_layout(s, st, element_size) for s, st in ((a_shape, a_stride), (b_shape, b_stride),
                                                                  (c_shape, c_stride))]  # fmt: skip
    if None in layouts or (z_stride is not None and z_stride != c_stride):
        return None
    a_trans, b_trans, c_trans = layouts
    batched = batch > 1
    return (
        _descriptor_geometry(a_shape, a_stride, a_trans, batched),
        _descriptor_geometry(b_shape, b_stride, b_trans, batched),
        _descriptor_geometry(c_shape, c_stride, c_trans, batched),
        (a_trans, b_trans, c_trans, batched),
    )


def _descriptor(t: torch.Tensor, geometry) -> TensorDescriptor:
    # The autotuner's pre-hook sets the block shape of the config being run; this one has the rank.
    shape, strides = geometry
    return TensorDescriptor(t, shape, strides, [1] * len(shape))


def tma_plan(a, b, c, z=None):
    """The TMA kernel's plan for these operands (see _tma_plan), or None where it cannot run."""
    if a.dtype not in TMA_DTYPES or not supports_tma(a.device):
        return None
    if a.data_ptr() % 16 or b.data_ptr() % 16 or c.data_ptr() % 16 or (z is not None and z.data_ptr() % 16):
        return None
    return _tma_plan(
        a.shape, a.stride(), b.shape, b.stride(), c.stride(), z.stride() if z is not None else None, a.element_size()
    )


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
) -> str:
    """Compute c (written in place) from a and b; returns the kernel that ran: "tma", "portable", or
    "none" when c is empty.

    a (batch, M, K), b (batch, K, N), c (batch, M, N): same dtype, any strides.
    bias: (N,); activation: kernels.common ACTIVATION code; z: laid out like c, receives the
    pre-activation acc + bias. path: None picks; "tma" / "portable" force one (tests), "tma"
    raising where it cannot run.
    """
    batch, m, k = a.shape
    n = b.shape[2]
    if batch * m * n == 0:
        return "none"
    plan = None
    if path == "tma" or (path is None and not INTERPRETING):
        plan = tma_plan(a, b, c, z)
        if plan is None and path == "tma":
            raise ValueError("the TMA kernel cannot run these operands (dtype, device, Triton or layout)")
    has_bias = bias is not None
    if plan is not None:
        a_geometry, b_geometry, c_geometry, layout_flags = plan
        num_sms = multiprocessor_count(a.device)

        def grid(meta):
            tiles = batch * -(-m // meta["BLOCK_M"]) * -(-n // meta["BLOCK_N"])
            return (min(tiles, num_sms * meta["PROGRAMS_PER_SM"]),)

        _matmul_tma_kernel[grid](
            _descriptor(a, a_geometry),
            _descriptor(b, b_geometry),
            _descriptor(c, c_geometry),
            _descriptor(z, c_geometry) if z is not None else None,
            bias if has_bias else c,
            bias.stride(0) if has_bias else 0,
            m, n, k, batch,
            has_bias, activation, z is not None, *layout_flags, INTERPRETING, num_sms,
        )  # fmt: skip
        return "tma"

    def grid(meta):
        return (batch * -(-m // meta["BLOCK_M"]) * -(-n // meta["BLOCK_N"]),)

    _matmul_kernel[grid](
        a, b, c,
        z if z is not None else c,
        bias if has_bias else c,
        *a.stride(), *b.stride(), *c.stride(),
        bias.stride(0) if has_bias else 0,
        m, n, k,
        has_bias, activation, z is not None, allow_tf32, INTERPRETING,
    )  # fmt: skip
    return "portable"


@functools.lru_cache(maxsize=1024)
def _grad_plan(batch: int, m: int, n: int, programs: int):
    """(rows per program, grid, partial rows) of the elementwise pass."""
    rows = grad_rows(batch, m, n, programs)
    row_programs = batch * -(-m // rows)
    return rows, (row_programs, -(-n // GRAD_TILE["BLOCK_N"])), row_programs


def launch_activation_grad(
    dy: torch.Tensor, saved: Optional[torch.Tensor], activation: int, write_dz: bool, column_sum: bool
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(dz, d(bias)) for dy (batch, M, N), any strides: dz = dy * act'(z) contiguous (batch, M, N) in
    dy's dtype when write_dz (else dy itself), and, when column_sum, dz summed over every batch
    and row (N,) in dy's dtype (else None). saved: contiguous (batch, M, N): z for the GELUs, the
    output for ReLU, None without activation."""
    batch, m, n = dy.shape
    dz = torch.empty((batch, m, n), dtype=dy.dtype, device=dy.device) if write_dz else dy
    rows, grid, partial_rows = _grad_plan(batch, m, n, multiprocessor_count(dy.device))
    partial = torch.empty((partial_rows, n), dtype=torch.float32, device=dy.device) if column_sum else None
    if batch * m * n:
        _activation_grad_kernel[grid](
            dy, saved if saved is not None else dy, dz, partial if column_sum else dy,
            *dy.stride(), m, n, rows,
            activation, write_dz, column_sum, INTERPRETING,
            **GRAD_TILE,
        )  # fmt: skip
    dbias = None
    if column_sum:
        dbias = partial.sum(0).to(dy.dtype) if partial_rows else torch.zeros(n, dtype=dy.dtype, device=dy.device)
    return dz, dbias
