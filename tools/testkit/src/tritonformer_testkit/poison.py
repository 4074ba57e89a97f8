"""Poisoned allocations: an output a kernel forgot to write cannot look right."""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

_EMPTY_FACTORIES = ("empty", "empty_like", "empty_strided")


def _poison_(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.is_floating_point() or tensor.is_complex():
        tensor.fill_(float("nan"))
    elif tensor.dtype == torch.bool:
        tensor.fill_(True)
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).max)
    return tensor


@contextlib.contextmanager
def poisoned_allocations():
    """Inside this context every torch.empty / empty_like / empty_strided returns poisoned memory.

    Floating tensors are filled with NaN and integer tensors with their largest value, so an
    element a kernel does not write shows up as NaN (or as garbage) in the comparison.
    """
    originals = {name: getattr(torch, name) for name in _EMPTY_FACTORIES}

    def poisoning(factory):
        def allocate(*args, **kwargs):
            return _poison_(factory(*args, **kwargs))

        return allocate

    with contextlib.ExitStack() as stack:
        for name, factory in originals.items():
            stack.enter_context(mock.patch.object(torch, name, poisoning(factory)))
        yield
