"""This package's own input checks; the shared ones (check_tensor, check_device, ...) are in
`_runtime.validation`."""

from __future__ import annotations

import torch

from ._runtime.compat import INTERPRETING
from .ops._layout import overlaps_itself, share_memory


def check_rotary_dim(name: str, d2: int, head_dim: int, head_dim_name: str) -> None:
    """The rotated width d2 (the last dim of `name`) must be even, positive and <= head_dim."""
    if d2 == 0 or d2 % 2:
        raise ValueError(f"{name} has last dim {d2}: the rotary dim must be even and positive (it rotates pairs)")
    if d2 > head_dim:
        raise ValueError(f"{name} has last dim {d2}, more than the head dim {head_dim} of {head_dim_name}")


def on_kernel_device(value: torch.Tensor) -> bool:
    """value is on the device kernels run on (is_cuda / is_cpu: several times cheaper than .device);
    the public functions call the shared check_device, which names the argument, only when this fails."""
    return value.is_cpu if INTERPRETING else value.is_cuda


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
