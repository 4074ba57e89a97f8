"""Helpers shared by this package's tests, as the `helpers` fixture (importlib mode gives test files
no sibling imports; the test kit has no forward+backward runner)."""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Dict, List, Optional, Sequence

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, poisoned_allocations


def leaves(*tensors: Optional[torch.Tensor]) -> List[Optional[torch.Tensor]]:
    """Fresh leaf copies that require grad (None stays None)."""
    return [None if t is None else t.detach().clone().requires_grad_(True) for t in tensors]


def as_float64(*tensors: Optional[torch.Tensor]) -> List[Optional[torch.Tensor]]:
    return [None if t is None else t.detach().double().requires_grad_(t.requires_grad) for t in tensors]


def forward_backward(
    fn: Callable, inputs: Sequence[Optional[torch.Tensor]], upstream: Sequence[torch.Tensor], *, poison: bool = False
):
    """(outputs, gradients of the inputs that require grad) of fn(*inputs) for the given upstream
    gradients; with poison, every torch.empty inside returns NaN-filled memory."""
    with poisoned_allocations() if poison else contextlib.nullcontext():
        outputs = fn(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    wrt = [t for t in inputs if t is not None and t.requires_grad]
    pairs = [(o, g) for o, g in zip(outputs, upstream) if g is not None]
    with poisoned_allocations() if poison else contextlib.nullcontext():
        grads = torch.autograd.grad([o for o, _ in pairs], wrt, [g.to(o.dtype) for o, g in pairs])
    return outputs, grads


def assert_all_close(results: Dict[str, tuple]) -> None:
    """name -> (ours, float64 reference, torch in the low precision or None)."""
    for name, (actual, reference, lowp) in results.items():
        assert actual.dtype == (lowp.dtype if lowp is not None else actual.dtype), name
        assert_close_to_reference(actual, reference, lowp, name=name)


@pytest.fixture
def helpers():
    """This module: leaves, as_float64, forward_backward, assert_all_close."""
    return sys.modules[__name__]
