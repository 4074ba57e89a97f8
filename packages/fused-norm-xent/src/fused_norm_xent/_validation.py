"""Checks specific to this package; the shared ones come from the runtime."""

from __future__ import annotations

import math
from typing import Sequence, Tuple, Union

import torch

from ._runtime.cache import cached_plan  # noqa: F401 - re-exported for the package's modules
from ._runtime.validation import (  # noqa: F401 - re-exported for the package's modules
    FLOAT_DTYPES,
    INDEX_DTYPES,
    check_bool,
    check_choice,
    check_device,
    check_float,
    check_int,
    check_optional_tensor,
    check_shape,
    check_tensor,
    dtype_names,
)

# Class-index targets: torch takes int64; int32 saves memory and is read the same way.
TARGET_DTYPES = (torch.int64, torch.int32)


def check_target(name: str, value) -> torch.Tensor:
    """Class indices: an integer tensor (class probabilities are not supported)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        raise TypeError(
            f"{name} has dtype {value.dtype}: class probabilities are not supported, pass class indices "
            f"({dtype_names(TARGET_DTYPES)})"
        )
    return check_tensor(name, value, TARGET_DTYPES)


def check_dim(name: str, dim: int, ndim: int) -> int:
    """Normalize `dim` for a tensor of `ndim` dims, raising if it is out of range."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    if ndim == 0 or not -ndim <= dim < ndim:
        raise ValueError(f"{name}={dim} is out of range for a tensor with {ndim} dims")
    return dim % ndim


def normalized_shape_tuple(normalized_shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    """torch.nn.LayerNorm's `normalized_shape` (an int or a sequence of ints) as a tuple."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
        raise ValueError(
            f"normalized_shape={normalized_shape!r} must be a positive int or a non-empty sequence of them"
        )
    return shape


def check_normalized(x_shape: Sequence[int], normalized_shape: Tuple[int, ...]) -> int:
    """x's shape must end with normalized_shape; returns the number of elements normalized together."""
    k = len(normalized_shape)
    if len(x_shape) < k or tuple(x_shape[-k:]) != normalized_shape:
        raise ValueError(f"x has shape {tuple(x_shape)}, which does not end with normalized_shape {normalized_shape}")
    return math.prod(normalized_shape)


def stand_in(shape, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor of `shape` and `dtype`, for the shared checks where a plan has a tensor's
    properties, not the tensor."""
    return torch.empty(tuple(shape), dtype=dtype, device="meta")
