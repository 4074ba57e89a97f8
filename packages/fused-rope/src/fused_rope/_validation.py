"""Input checks that run before any launch and name the offending argument."""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from ._compat import INTERPRETING
from .ops._layout import overlaps_itself, share_memory

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(name: str, value, dtypes: Iterable[torch.dtype] = FLOAT_DTYPES) -> torch.Tensor:
    """`value` must be a tensor of one of `dtypes` (its device is checked by check_device)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    dtypes = tuple(dtypes)
    if value.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {value.dtype}; supported: {_dtype_names(dtypes)}")
    return value


def check_optional_index(name: str, value) -> Optional[torch.Tensor]:
    """None, or an int32/int64 tensor."""
    return None if value is None else check_tensor(name, value, INDEX_DTYPES)


def check_ndim(name: str, value: torch.Tensor, ndims: Iterable[int], what: str) -> None:
    ndims = tuple(ndims)
    if value.dim() not in ndims:
        expected = " or ".join(str(n) for n in ndims)
        raise ValueError(f"{name} must have {expected} dims, {what}; got shape {tuple(value.shape)}")


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_rotary_dim(name: str, d2: int, head_dim: int, head_dim_name: str) -> None:
    """The rotated width d2 (the last dim of `name`) must be even, positive and <= head_dim."""
    if d2 == 0 or d2 % 2:
        raise ValueError(f"{name} has last dim {d2}: the rotary dim must be even and positive (it rotates pairs)")
    if d2 > head_dim:
        raise ValueError(f"{name} has last dim {d2}, more than the head dim {head_dim} of {head_dim_name}")


def on_kernel_device(value: torch.Tensor) -> bool:
    """value is on the device kernels run on (is_cuda / is_cpu: several times cheaper than .device)."""
    return value.is_cpu if INTERPRETING else value.is_cuda


def check_device(**tensors: Optional[torch.Tensor]) -> None:
    """Each tensor (None skipped) must be on the device kernels run on, all on the same one.

    Called after the dtype and shape checks, so those errors read the same on any machine.
    """
    first = None
    for name, value in tensors.items():
        if value is None:
            continue
        if not on_kernel_device(value):
            where = "the CPU (TRITON_INTERPRET=1 is set)" if INTERPRETING else "a CUDA device"
            raise ValueError(f"{name} is on {value.device}; the kernels run on {where}")
        if first is None:
            first = (name, value.device)
        elif value.device != first[1]:
            raise ValueError(f"{name} is on {value.device} but {first[0]} is on {first[1]}")


def check_overwritable(a: torch.Tensor, b: torch.Tensor, names=("q", "k")) -> None:
    """The two tensors an in-place update writes: no two of their elements may share memory, in
    one tensor (an expanded view) or across them (the same tensor twice, overlapping views), as
    torch's in-place ops require; such an element would be updated more than once. Call it
    eagerly: it reads data pointers."""
    for name, x in zip(names, (a, b)):
        if overlaps_itself(x):
            raise ValueError(
                f"{name} has elements that share memory (an expanded or self-overlapping view): an in-place update "
                f"would write them more than once; clone it first, or use inplace=False"
            )
    if share_memory(a, b):
        what = "are the same tensor" if a is b else "share memory (overlapping views of one buffer)"
        raise ValueError(
            f"{names[0]} and {names[1]} {what}: an in-place update would write the shared elements twice; "
            f"pass separate tensors, or use inplace=False"
        )
