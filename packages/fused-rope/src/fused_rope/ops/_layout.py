"""Small tensor-layout helpers shared by the launchers."""

import torch


def unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dim is contiguous (what the kernels index), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def output_like(x: torch.Tensor) -> torch.Tensor:
    """An uninitialized tensor for the result of transforming x (also the fake implementation).

    x's own strides when x is dense with a contiguous last dim (a (B, H, S, D) view of
    (B, S, H, D) memory stays one), else contiguous: the layout the launcher's input has after
    unit_last_stride, so the real and the fake implementations agree.
    """
    if x.stride(-1) == 1:
        return torch.empty_like(x)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
