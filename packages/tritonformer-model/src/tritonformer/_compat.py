"""Every torch-version difference this package meets, in one place.

The GPU matrix pairs Triton 2.2 with torch 2.2 and the newest Triton with the newest torch, so
the model runs on torch >= 2.2; the newer APIs it prefers are picked here.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Tuple

import torch
import torch.nn.functional as F

TORCH_VERSION = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])

# scaled_dot_product_attention(enable_gqa=True) shares key/value heads without copies (torch >= 2.5).
SDPA_HAS_GQA = TORCH_VERSION >= (2, 5)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch's RMSNorm (F.rms_norm, torch >= 2.4), or the same formula in torch ops before it."""
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # torch < 2.4: the formula nn.RMSNorm computes, in the input's dtype.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight  # pragma: no cover


def autocast_state(device_type: str) -> Tuple[bool, torch.dtype]:
    """(enabled, dtype) of autocast on `device_type`."""
    if TORCH_VERSION >= (2, 4):
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()  # pragma: no cover - the CUDA state only


def autocast_without_cache(device_type: str):
    """The current autocast state of `device_type` with its weight-cast cache off (what a CUDA-graph
    capture needs: a cached cast would be a tensor the graph reads but does not own); a no-op
    context when autocast is off."""
    enabled, dtype = autocast_state(device_type)
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=dtype, cache_enabled=False)


def grad_scaler(device_type: str, enabled: bool = True):
    """torch.amp.GradScaler (torch >= 2.3) or torch.cuda.amp.GradScaler before it."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device_type, enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)  # pragma: no cover - torch < 2.3


def fully_shard():
    """FSDP2's fully_shard: public from torch 2.6, under _composable from 2.4; None before."""
    try:
        from torch.distributed.fsdp import fully_shard as shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard as shard
        except ImportError:
            return None
    return shard


def autocast_dtype(device_type: str):
    """The dtype autocast computes matmuls in on `device_type`, or None where it is off."""
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    if device_type == "cuda":  # pragma: no cover - torch < 2.4
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None  # pragma: no cover


def is_compiling() -> bool:
    """Whether torch.compile is tracing this call (torch.compiler.is_compiling from torch 2.3)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and hasattr(compiler, "is_compiling"):
        return compiler.is_compiling()
    dynamo = sys.modules.get("torch._dynamo")  # pragma: no cover - torch < 2.3; never imported just to ask
    return dynamo is not None and dynamo.is_compiling()  # pragma: no cover
