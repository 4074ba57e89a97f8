"""Input checks that run before any launch and name the offending argument."""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence, Tuple, Union

import torch

from ._compat import INTERPRETING, KERNEL_DEVICE_TYPE

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Class-index targets: torch takes int64; int32 saves memory and is read the same way.
TARGET_DTYPES = (torch.int64, torch.int32)


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


def check_optional_tensor(name: str, value, dtypes: Iterable[torch.dtype] = FLOAT_DTYPES) -> Optional[torch.Tensor]:
    return None if value is None else check_tensor(name, value, dtypes)


def check_target(name: str, value) -> torch.Tensor:
    """Class indices: an integer tensor (class probabilities are not supported)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        raise TypeError(
            f"{name} has dtype {value.dtype}: class probabilities are not supported, pass class indices "
            f"({_dtype_names(TARGET_DTYPES)})"
        )
    return check_tensor(name, value, TARGET_DTYPES)


def check_shape(name: str, value: torch.Tensor, shape: Sequence[int], what: str) -> None:
    """`value` must have exactly `shape`; `what` says where the expected shape comes from."""
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(value.shape)} but must have shape {tuple(shape)} ({what})")


def check_device(**tensors: Optional[torch.Tensor]) -> None:
    """Each tensor must be on the device kernels run on, all on the same one (None is skipped).

    Called after the dtype and shape checks, so those errors read the same on any machine.
    """
    first = None
    for name, value in tensors.items():
        if value is None:
            continue
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


def check_int(name: str, value, low: Optional[int] = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if low is not None and value < low:
        raise ValueError(f"{name}={value} must be >= {low}")
    return value


def check_float(name: str, value, low: float, high: float, *, include_high: bool = True) -> float:
    """A real number in [low, high] (or [low, high) when include_high is False)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    in_range = low <= value <= high if include_high else low <= value < high
    if not in_range:
        closing = "]" if include_high else ")"
        raise ValueError(f"{name}={value} is out of range [{low}, {high}{closing}")
    return value


def check_choice(name: str, value, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(repr(c) for c in choices)}")
    return value


def normalized_shape_tuple(normalized_shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    """torch.nn.LayerNorm's `normalized_shape` (an int or a sequence of ints) as a tuple."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
        raise ValueError(
            f"normalized_shape={normalized_shape!r} must be a positive int or a non-empty sequence of them"
        )
    return shape


def check_normalized(x: torch.Tensor, normalized_shape: Tuple[int, ...]) -> int:
    """x must end with normalized_shape; returns the number of elements normalized together."""
    k = len(normalized_shape)
    if x.dim() < k or tuple(x.shape[-k:]) != normalized_shape:
        raise ValueError(f"x has shape {tuple(x.shape)}, which does not end with normalized_shape {normalized_shape}")
    return math.prod(normalized_shape)
