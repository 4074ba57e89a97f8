"""What this package's kernels need of the installed Triton, torch and GPU beyond the shared runtime
(`_runtime.compat`: versions, the interpreter, autocast, descriptors, device facts)."""

from __future__ import annotations

import torch

from ._runtime.compat import HAS_TENSOR_DESCRIPTORS, INTERPRETING, device_capability


def tf32_allowed_by_torch() -> bool:
    """torch's global opt-in to TF32 matmuls (torch.backends.cuda.matmul.allow_tf32)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


def supports_tma(device: torch.device) -> bool:
    """The persistent TMA kernel runs here: Triton has tensor descriptors and the GPU is a Hopper (sm_90).

    Its configs are sized for Hopper's 228 KB of shared memory per SM; other GPUs run the portable
    kernel. Under the interpreter (Triton >= 3.4) the descriptors are emulated, so it is tested too.
    """
    if not HAS_TENSOR_DESCRIPTORS:
        return False
    if INTERPRETING:
        return True
    return device_capability(device)[0] == 9
