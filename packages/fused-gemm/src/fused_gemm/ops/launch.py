"""One launcher for every matmul this package runs: the forward and both backward products.

    c[b] = act(prologue(a[b]) @ b[b] + bias)    a (batch, M, K), b (batch, K, N), c (batch, M, N)

All operands are 3-D views with any strides (a transpose is a view, never a copy). The launcher
picks the kernel:
- the persistent TMA kernel (kernels.matmul_tma) on a Hopper GPU with Triton >= 3.4 (and under
  the Triton 3.x interpreter) when every operand is fp16/bf16, 16-byte aligned, and has a unit
  stride in one of its two matrix dims (row-major, or the transpose of row-major);
- the portable kernel (kernels.matmul) otherwise: any GPU, any Triton, any strides, fp32.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton

from .._compat import INTERPRETING, TensorDescriptor, multiprocessor_count, supports_tma
from ..kernels.matmul import _matmul_kernel
from ..kernels.matmul_tma import _matmul_tma_kernel

TMA_DTYPES = (torch.float16, torch.bfloat16)
PATHS = ("tma", "portable")


def _tma_layout(t: torch.Tensor) -> Optional[bool]:
    """For a (batch, rows, cols) view: False if its matrices are row-major, True if they are the
    transpose of row-major, None if a tensor descriptor cannot address it (TMA needs a 16-byte
    aligned base, a unit stride and 16-byte aligned, non-zero other strides: a broadcast
    (expanded) operand takes the portable kernel)."""
    size = t.element_size()
    if t.data_ptr() % 16 or (t.shape[0] > 1 and (t.stride(0) <= 0 or (t.stride(0) * size) % 16)):
        return None
    if t.stride(2) == 1 and t.stride(1) > 0 and (t.stride(1) * size) % 16 == 0:
        return False
    if t.stride(1) == 1 and t.stride(2) > 0 and (t.stride(2) * size) % 16 == 0:
        return True
    return None


def _descriptor(t: torch.Tensor, transposed: bool, batched: bool):
    """A tensor descriptor over t's memory (its transpose when `transposed`); block shape set per config."""
    if transposed:
        t = t.transpose(1, 2)
    if not batched:
        t = t[0]
    # The pre-hook sets the block shape of the config being run; this one only has the right rank.
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1] * t.dim())


def tma_layouts(a, b, c, s=None, aux=None) -> Optional[Tuple[bool, bool, bool]]:
    """(A_TRANS, B_TRANS, C_TRANS) when the TMA kernel can run these operands, else None."""
    if a.dtype not in TMA_DTYPES or a.shape[2] == 0 or not supports_tma(a.device):
        return None
    layouts = [_tma_layout(t) for t in (a, b, c)]
    if None in layouts:
        return None
    a_trans, b_trans, c_trans = layouts
    if s is not None and _tma_layout(s) != a_trans:
        return None
    if aux is not None and _tma_layout(aux) != c_trans:
        return None
    return a_trans, b_trans, c_trans


def launch_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    *,
    s: Optional[torch.Tensor] = None,
    prologue: int = 0,
    row_sum: Optional[torch.Tensor] = None,
    bias: Optional[torch.Tensor] = None,
    activation: int = 0,
    aux: Optional[torch.Tensor] = None,
    allow_tf32: bool = False,
    path: Optional[str] = None,
) -> str:
    """Compute c (written in place) from a and b; returns the kernel that ran: "tma", "portable", or
    "none" when c is empty.

    a (batch, M, K), b (batch, K, N), c (batch, M, N): same dtype, any strides.
    s: like a, the prologue's operand (prologue != 0): act'(Z), or relu(Z) for the mask.
    row_sum: (batch, M), written with the row sums of the scaled a (its dtype: the sum's output dtype).
    bias: (N,); activation: kernels.common ACTIVATION code; aux: like c, receives act'(acc + bias).
    path: None picks; "tma" / "portable" force one (tests), "tma" raising where it cannot run.
    """
    batch, m, k = a.shape
    n = b.shape[2]
    if c.numel() == 0:
        return "none"
    layouts = tma_layouts(a, b, c, s, aux) if path != "portable" else None
    if path == "tma" and layouts is None:
        raise ValueError("the TMA kernel cannot run these operands (dtype, device, Triton or layout)")
    row_sum_stride = row_sum.stride(0) if row_sum is not None else 0
    bias_stride = bias.stride(0) if bias is not None else 0
    flags = dict(
        PROLOGUE=prologue,
        ROW_SUM=row_sum is not None,
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        STORE_AUX=aux is not None,
    )
    if layouts is not None:
        a_trans, b_trans, c_trans = layouts
        batched = batch > 1
        num_sms = multiprocessor_count(a.device)

        def persistent_grid(meta):
            tiles = batch * triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"])
            return (min(num_sms * meta["PROGRAMS_PER_SM"], tiles),)

        _matmul_tma_kernel[persistent_grid](
            _descriptor(a, a_trans, batched),
            _descriptor(b, b_trans, batched),
            _descriptor(c, c_trans, batched),
            _descriptor(s, a_trans, batched) if s is not None else None,
            _descriptor(aux, c_trans, batched) if aux is not None else None,
            bias if bias is not None else c,
            row_sum if row_sum is not None else c,
            bias_stride,
            row_sum_stride,
            m, n, k, batch,
            *flags.values(), a_trans, b_trans, c_trans, batched, INTERPRETING, num_sms,
        )  # fmt: skip
        return "tma"

    def grid(meta):
        return (batch * triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    s_ = s if s is not None else a
    _matmul_kernel[grid](
        a, b, c, s_,
        aux if aux is not None else c,
        bias if bias is not None else c,
        row_sum if row_sum is not None else c,
        a.stride(0), a.stride(1), a.stride(2),
        b.stride(0), b.stride(1), b.stride(2),
        c.stride(0), c.stride(1), c.stride(2),
        s_.stride(0), s_.stride(1), s_.stride(2),
        bias_stride,
        row_sum_stride,
        m, n, k,
        *flags.values(), allow_tf32, INTERPRETING,
    )  # fmt: skip
    return "portable"
