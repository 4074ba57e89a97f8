"""Input checks that run before any launch and name the offending argument."""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from ._compat import INTERPRETING, KERNEL_DEVICE_TYPE, autocast_dtype

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensor(name: str, value, dtypes: Iterable[torch.dtype] = FLOAT_DTYPES) -> torch.Tensor:
    """`value` must be a tensor of one of `dtypes` (its device is checked by check_device)."""
    check_is_tensor(name, value)
    dtypes = tuple(dtypes)
    if value.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {value.dtype}; supported: {names}")
    return value


def check_is_tensor(name: str, value) -> None:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


def check_same_dtype(reference_name: str, reference: torch.Tensor, **tensors: Optional[torch.Tensor]) -> None:
    for name, value in tensors.items():
        if value is not None and value.dtype != reference.dtype:
            raise TypeError(
                f"{name} has dtype {value.dtype} but {reference_name} has {reference.dtype}; they must match"
            )


def check_device(**tensors: Optional[torch.Tensor]) -> None:
    """Each tensor must be on the device kernels run on, all on the same one (None: skipped).

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


def autocast_inputs(*tensors: Optional[torch.Tensor]):
    """Under torch.autocast for the kernels' device type, floating tensors cast to its dtype (as
    F.linear's are). Tensors on another device are left for check_device to reject."""
    dtype = autocast_dtype(KERNEL_DEVICE_TYPE)
    if dtype is None:
        return tensors
    return tuple(None if t is None or not t.is_floating_point() else t.to(dtype) for t in tensors)


def check_matrix(name: str, value: torch.Tensor, rows: int, rows_name: str, cols: Optional[int] = None) -> None:
    """`value` must be 2-D with `rows` rows (and `cols` columns when given), none of them empty."""
    if value.dim() != 2:
        raise ValueError(f"{name} must be 2-D ({rows_name}, d_intermediate); got shape {tuple(value.shape)}")
    if value.shape[0] != rows or (cols is not None and value.shape[1] != cols) or value.shape[1] == 0:
        expected = f"({rows}, {cols if cols is not None else 'd_intermediate >= 1'})"
        raise ValueError(f"{name} has shape {tuple(value.shape)}; expected {expected} ({rows_name} = {rows})")


def check_bias_pair(b_gate: Optional[torch.Tensor], b_up: Optional[torch.Tensor], n: int) -> bool:
    """Both biases or neither; each a (d_intermediate,) vector. Returns whether there are biases."""
    if (b_gate is None) != (b_up is None):
        raise ValueError("b_gate and b_up must be given together (both or neither)")
    if b_gate is None:
        return False
    for name, bias in (("b_gate", b_gate), ("b_up", b_up)):
        check_vector(name, bias, n, "d_intermediate")
    return True


def check_vector(name: str, value: torch.Tensor, size: int, size_name: str) -> None:
    if value.dim() != 1 or value.shape[0] != size:
        raise ValueError(f"{name} has shape {tuple(value.shape)}; expected ({size},) ({size_name} = {size})")
