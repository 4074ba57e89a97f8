"""Input checks that run before any launch and name the offending argument."""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._compat import INTERPRETING, KERNEL_DEVICE_TYPE

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh")


def check_tensor(name: str, value, dtypes: Tuple[torch.dtype, ...] = FLOAT_DTYPES) -> torch.Tensor:
    """`value` must be a tensor of one of `dtypes` (its device is checked by check_device)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {value.dtype}; supported: {names}")
    return value


def check_same_dtype(*named: Tuple[str, Optional[torch.Tensor]]) -> None:
    """All given (name, tensor) pairs (None tensors skipped) share the first one's dtype."""
    first = None
    for name, value in named:
        if value is None:
            continue
        if first is None:
            first = (name, value.dtype)
        elif value.dtype != first[1]:
            raise TypeError(
                f"{name} has dtype {value.dtype} but {first[0]} has dtype {first[1]}: the operands must share "
                "one dtype (cast them, or run under torch.autocast, which casts them for you)"
            )


def check_device(*named: Tuple[str, Optional[torch.Tensor]]) -> None:
    """Each (name, tensor) pair's tensor (None skipped) must be on the device kernels run on, all on
    the same one. Called after the dtype and shape checks, so those errors read the same on any machine.
    """
    first = None
    for name, value in named:
        if value is None:
            continue
        if value.device.type != KERNEL_DEVICE_TYPE:
            where = "the CPU (TRITON_INTERPRET=1 is set)" if INTERPRETING else "a CUDA device"
            raise ValueError(f"{name} is on {value.device}; the kernels run on {where}")
        if first is None:
            first = (name, value.device)
        elif value.device != first[1]:
            raise ValueError(f"{name} is on {value.device} but {first[0]} is on {first[1]}")


def check_activation(activation) -> Optional[str]:
    """`activation` is None or one of the epilogue names."""
    if activation is not None and not isinstance(activation, str):
        raise TypeError(f"activation must be None or a str, got {type(activation).__name__}")
    if activation not in ACTIVATIONS:
        choices = ", ".join(repr(a) for a in ACTIVATIONS)
        raise ValueError(f"activation={activation!r} is not supported; choose one of {choices}")
    return activation


def check_allow_tf32(allow_tf32) -> None:
    if allow_tf32 is not None and not isinstance(allow_tf32, bool):
        raise TypeError(f"allow_tf32 must be None, True or False, got {type(allow_tf32).__name__}")
