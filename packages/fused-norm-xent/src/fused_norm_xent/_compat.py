"""Every Triton- and torch-version difference this package meets, in one place."""

from __future__ import annotations

import functools
import os

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
    custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")
else:  # pragma: no cover - torch < 2.4
    custom_fwd = torch.cuda.amp.custom_fwd
    custom_bwd = torch.cuda.amp.custom_bwd
