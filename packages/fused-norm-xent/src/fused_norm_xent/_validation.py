"""Input checks that run before any launch and name the offending argument."""

from __future__ import annotations

from typing import Iterable

import torch

from ._compat import INTERPRETING, KERNEL_DEVICE_TYPE

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensor(name: str, value, dtypes: Iterable[torch.dtype] = FLOAT_DTYPES) -> torch.Tensor:
    """`value` must be a tensor of one of `dtypes` (its device is checked by check_device)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    dtypes = tuple(dtypes)
    if value.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {value.dtype}; supported: {names}")
    return value


def check_device(**tensors: torch.Tensor) -> None:
    """Each tensor must be on the device kernels run on, all on the same one.

    Called after the dtype and shape checks, so those errors read the same on any machine.
    """
    first = None
    for name, value in tensors.items():
        if value.device.type != KERNEL_DEVICE_TYPE:
            where = "the CPU (TRITON_INTERPRET=1 is set)" if INTERPRETING else "a CUDA device"
            raise ValueError(f"{name} is on {value.device}; the kernels run on {where}")
        if first is None:
            first = (name, value.device)
        elif value.device != first[1]:
            raise ValueError(f"{name} is on {value.device} but {first[0]} is on {first[1]}")


def check_dim(name: str, dim: int, ndim: int) -> int:
    """Normalize `dim` for a tensor of `ndim` dims, raising if it is out of range."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    if ndim == 0 or not -ndim <= dim < ndim:
        raise ValueError(f"{name}={dim} is out of range for a tensor with {ndim} dims")
    return dim % ndim
