"""Version differences specific to this package's kernels; the shared ones come from the runtime."""

from __future__ import annotations

import torch

from ._runtime.compat import HAS_CUSTOM_OP, INTERPRETING, TRITON_VERSION  # noqa: F401 - re-exported for the tests

# Loops that load the next chunk while reducing the current one: Triton 2.2's TTGIR optimizer
# crashes (segfault) on a reduction of a loaded tensor carried across loop iterations, so there
# the loops load each chunk where they use it.
PREFETCH_CHUNKS = TRITON_VERSION >= (3, 0)

# cuBLAS matmul of low-precision operands into an fp32 accumulator (aten::addmm.dtype_out, CUDA,
# torch >= 2.8). Without it the operands are upcast first (CPU interpreter runs, older torch).
HAS_ADDMM_OUT_DTYPE = hasattr(torch.ops.aten.addmm, "dtype_out")


def addmm_into(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    """acc (+)= a @ b, accumulated in acc's dtype whatever the dtype of a and b."""
    beta = 1 if accumulate else 0
    if a.dtype == acc.dtype:
        torch.addmm(acc, a, b, beta=beta, out=acc)
    elif HAS_ADDMM_OUT_DTYPE and acc.is_cuda:
        torch.addmm(acc, a, b, beta=beta, out_dtype=acc.dtype, out=acc)
    else:
        torch.addmm(acc, a.to(acc.dtype), b.to(acc.dtype), beta=beta, out=acc)
