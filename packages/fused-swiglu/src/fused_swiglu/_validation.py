"""This package's own input checks; the shared ones (check_tensor, check_same_dtype,
check_device, ...) are in `_runtime.validation`."""

from __future__ import annotations

from typing import Optional

import torch

from ._runtime.compat import KERNEL_DEVICE_TYPE, autocast_dtype
from ._runtime.validation import check_choice
from .kernels.activation import ACTIVATION_CODES


def check_activation(activation) -> int:
    """`activation` is one of the gate's activations ("silu", "gelu_tanh"); returns its ACTIVATION code."""
    return ACTIVATION_CODES[check_choice("activation", activation, tuple(ACTIVATION_CODES))]


def autocast_inputs(*values):
    """Under torch.autocast for the kernels' device type, floating tensors cast to its dtype (as
    F.linear's are); the rest (None, non-tensors, tensors on another device) are left for the
    checks to judge."""
    dtype = autocast_dtype(KERNEL_DEVICE_TYPE)
    if dtype is None:
        return values
    return tuple(v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values)


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
