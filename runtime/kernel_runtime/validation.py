"""Argument checks that run before any launch and raise one line naming the argument."""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

import torch

from .compat import INTERPRETING, KERNEL_DEVICE_TYPE

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)

# Where the kernels run, for device errors; without a GPU the interpreter is the way to run them.
_WHERE = (
    "the CPU (TRITON_INTERPRET=1 is set)"
    if INTERPRETING
    else "a CUDA device (on a machine without one, set TRITON_INTERPRET=1 before importing to run them in "
    "Triton's interpreter on CPU tensors)"
)


def dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(name: str, value, dtypes: Iterable[torch.dtype] = FLOAT_DTYPES) -> torch.Tensor:
    """`value` must be a tensor of one of `dtypes` (its device is checked by check_device)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        dtypes = tuple(dtypes)
        hint = ""
        if value.dtype == torch.float32 and torch.float32 not in dtypes and any(d.is_floating_point for d in dtypes):
            hint = " (cast to fp16/bf16, or call under torch.autocast)"
        raise TypeError(f"{name} has dtype {value.dtype}; supported: {dtype_names(dtypes)}{hint}")
    return value


def check_optional_tensor(name: str, value, dtypes: Iterable[torch.dtype] = FLOAT_DTYPES) -> Optional[torch.Tensor]:
    return None if value is None else check_tensor(name, value, dtypes)


def check_same_dtype(reference_name: str, reference: torch.Tensor, **tensors: Optional[torch.Tensor]) -> None:
    """Every given tensor (None skipped) has `reference`'s dtype."""
    for name, value in tensors.items():
        if value is not None and value.dtype != reference.dtype:
            raise TypeError(
                f"{name} has dtype {value.dtype} but {reference_name} has {reference.dtype}: they must match "
                "(cast them, or run under torch.autocast)"
            )


def check_device(**tensors) -> None:
    """Each tensor (or torch.device, for checks made from a plan's key; None skipped) is on the
    device the kernels run on, all on the same one.

    Called after the dtype and shape checks, so those errors read the same on any machine.
    """
    first_name = first_device = None
    for name, value in tensors.items():
        if value is None:
            continue
        device = value if isinstance(value, torch.device) else value.device
        if device.type != KERNEL_DEVICE_TYPE:
            raise ValueError(f"{name} is on {device}; the kernels run on {_WHERE}")
        if first_name is None:
            first_name, first_device = name, device
        elif device != first_device:
            raise ValueError(f"{name} is on {device} but {first_name} is on {first_device}")


def check_ndim(name: str, value: torch.Tensor, ndims: Iterable[int], what: str) -> None:
    """`value` has one of `ndims` dims; `what` names the expected layout, e.g. "(batch, seq, dim)"."""
    ndims = tuple(ndims)
    if value.dim() not in ndims:
        expected = " or ".join(str(n) for n in ndims)
        raise ValueError(f"{name} must have {expected} dims, {what}; got shape {tuple(value.shape)}")


def check_shape(name: str, value: torch.Tensor, shape: Sequence[int], what: str) -> None:
    """`value` has exactly `shape`; `what` says where the expected shape comes from."""
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(value.shape)} but must have shape {tuple(shape)} ({what})")


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_int(name: str, value, low: Optional[int] = None, high: Optional[int] = None) -> int:
    """An int (not a bool) in [low, high] where those are given."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if low is not None and value < low:
        raise ValueError(f"{name}={value} must be >= {low}")
    if high is not None and value > high:
        raise ValueError(f"{name}={value} must be <= {high}")
    return value


def check_float(
    name: str, value, low: float = -math.inf, high: float = math.inf, *, include_low: bool = True,
    include_high: bool = True,
) -> float:  # fmt: skip
    """A finite real number in the range [low, high] (open at an end where include_* is False)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    above = value >= low if include_low else value > low
    below = value <= high if include_high else value < high
    if not (math.isfinite(value) and above and below):
        opening, closing = "[" if include_low else "(", "]" if include_high else ")"
        raise ValueError(f"{name}={value} must be a finite number in {opening}{low}, {high}{closing}")
    return value


def check_choice(name: str, value, choices: Sequence) -> object:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(repr(c) for c in choices)}")
    return value
