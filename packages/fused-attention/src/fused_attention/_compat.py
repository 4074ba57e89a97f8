"""Every Triton- and torch-version difference this package meets, in one place.

Nothing here touches a GPU at import time: device properties are read (and cached) on the
first launch, through `device_capability`.
"""

from __future__ import annotations

import functools
import os

import torch

# Triton decides at decoration time whether @triton.jit kernels are interpreted; so do we.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") == "1"

# Interpreted kernels take CPU tensors; compiled kernels take CUDA tensors.
KERNEL_DEVICE_TYPE = "cpu" if INTERPRETING else "cuda"

# The interpreter computes bf16 arithmetic and bf16/fp16 tl.dot on raw bits: kernels upcast their
# dot operands to fp32 when interpreting (a constexpr, so compiled kernels never see the branch).
UPCAST_DOTS = INTERPRETING

# Host-side TMA tensor descriptors (Triton >= 3.4): on Hopper (sm_90+) the fully visible K/V tiles
# (Q/dO in the dK/dV kernel) are copied by the tensor memory accelerator into shared memory,
# multi-buffered with mbarriers, instead of per-thread pointer loads. Not used here: automatic warp
# specialization (`tl.range(..., warp_specialize=True)`): Triton 3.6 and 3.9 leave the attention
# loop unpartitioned on sm_90 at 8 warps and fail to compile it at 4 (checked ahead of time), so
# it cannot pay; and persistent scheduling, which without warp specialization only replaces the
# hardware block scheduler (the grids walk the longest causal rows first instead).
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - Triton < 3.4
    TensorDescriptor = None
HAS_TENSOR_DESCRIPTOR = TensorDescriptor is not None

# torch.library.custom_op (torch >= 2.4): the launchers become custom ops with fake
# implementations and registered autograd, so torch.compile(fullgraph=True) traces through.
HAS_CUSTOM_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")

# autocast decorators for autograd Functions: torch.amp.custom_fwd (torch >= 2.4) or the older
# torch.cuda.amp one (torch 2.2, the pair of Triton 2.2).
if hasattr(torch.amp, "custom_fwd"):
    custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
    custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")
else:  # pragma: no cover - torch < 2.4
    custom_fwd = torch.cuda.amp.custom_fwd
    custom_bwd = torch.cuda.amp.custom_bwd


def autocast_dtype(device_type: str):
    """The dtype autocast casts to on `device_type`, or None when autocast is off there (or the
    device is one the kernels never run on, such as meta)."""
    if device_type not in ("cuda", "cpu"):
        return None
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except TypeError:  # pragma: no cover - torch < 2.4 takes no device argument (CUDA only)
        if device_type != "cuda":
            return None
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return torch.get_autocast_dtype(device_type) if enabled else None


@functools.cache
def device_capability(index: int) -> tuple:
    """(major, minor) compute capability of CUDA device `index`; (0, 0) when interpreting."""
    if INTERPRETING:
        return (0, 0)
    return torch.cuda.get_device_capability(index)
