"""Every Triton- and torch-version difference this package meets, in one place."""

from __future__ import annotations

import functools
import inspect
import os
from typing import Callable

import torch
import triton

TRITON_VERSION = tuple(int(part) for part in triton.__version__.split(".")[:2])

# Triton decides at decoration time whether @triton.jit kernels are interpreted; so do we.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Interpreted kernels take CPU tensors; compiled kernels take CUDA tensors.
KERNEL_DEVICE_TYPE = "cpu" if INTERPRETING else "cuda"

# autocast decorators for autograd Functions: torch.amp.custom_fwd (torch >= 2.4) or the older
# torch.cuda.amp one (torch 2.2, the pair of Triton 2.2).
if hasattr(torch.amp, "custom_fwd"):
    custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
    _torch_custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")
else:  # pragma: no cover - torch < 2.4
    custom_fwd = torch.cuda.amp.custom_fwd
    _torch_custom_bwd = torch.cuda.amp.custom_bwd


def custom_bwd(bwd: Callable) -> Callable:
    """torch's custom_bwd (the backward runs under the forward's autocast state), entered only when
    the forward ran under autocast.

    torch's decorator enters an autocast context on every call (a few microseconds of host time,
    as much as a small kernel's launch); with autocast off in the forward that context only keeps
    autocast off, which these backwards (allocations and Triton launches) do not need.
    """
    with_autocast = _torch_custom_bwd(bwd)

    @functools.wraps(bwd)
    def call(ctx, *grads):
        if ctx._fwd_used_autocast:
            return with_autocast(ctx, *grads)
        return bwd(ctx, *grads)

    return call


# Loops that load the next chunk while reducing the current one: Triton 2.2's TTGIR optimizer
# crashes (segfault) on a reduction of a loaded tensor carried across loop iterations, so there
# the loops load each chunk where they use it.
PREFETCH_CHUNKS = TRITON_VERSION >= (3, 0)

# torch.library.custom_op (torch >= 2.4): while torch.compile traces, the public functions call
# the launchers through custom ops (no graph break); in eager mode they call them directly.
HAS_CUSTOM_OP = hasattr(torch.library, "custom_op")
# Tags on custom ops (e.g. nondeterministic_seeded: never deduplicated or recomputed).
CUSTOM_OP_TAGS = HAS_CUSTOM_OP and "tags" in inspect.signature(torch.library.custom_op).parameters

if hasattr(torch.compiler, "is_compiling"):
    is_compiling = torch.compiler.is_compiling
else:  # pragma: no cover - torch < 2.3

    def is_compiling() -> bool:
        return False


def autocast_dtype(device_type: str):
    """The autocast dtype on `device_type`, or None when autocast is off there (or has no such device)."""
    if device_type not in ("cuda", "cpu"):
        return None
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if device_type == "cuda" and torch.is_autocast_enabled():  # pragma: no cover - torch < 2.4
        return torch.get_autocast_gpu_dtype()
    return None  # pragma: no cover


def mark_modified(tensor: torch.Tensor) -> None:
    """Bump the autograd version counter of a tensor written in place behind autograd's back, so
    that any backward which saved it raises instead of reading overwritten values."""
    if hasattr(torch.autograd.graph, "increment_version"):
        torch.autograd.graph.increment_version(tensor)


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


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of the device; a small fixed count when interpreting, so that
    persistent kernels still loop over several tiles per program in the CPU tests."""
    if INTERPRETING:
        return 3
    return torch.cuda.get_device_properties(device_index).multi_processor_count
