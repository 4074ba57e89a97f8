"""The check of gradients under torch.autocast, shared by the kernel suites."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from .tolerance import assert_close_to_reference


def assert_autocast_close_to_reference(
    y: torch.Tensor,
    y_torch: torch.Tensor,
    inputs: Sequence[Optional[torch.Tensor]],
    torch_inputs: Sequence[Optional[torch.Tensor]],
    reference: Callable,
    dy: torch.Tensor,
    names: Sequence[str],
) -> None:
    """Our output `y`, computed under autocast from the fp32 leaves `inputs`, and torch's own
    autocast computation `y_torch` from `torch_inputs` (leaves of the same values: the same
    tensors or copies). y and the gradient of every input (None ones skipped) are compared with
    `reference` run in float64 on the inputs: every gradient comes back in fp32, and each is as
    close to the reference as torch's (assert_close_to_reference's rule)."""
    assert y.dtype == y_torch.dtype, (y.dtype, y_torch.dtype)
    present = [i for i, t in enumerate(inputs) if t is not None]
    grads = torch.autograd.grad(y, [inputs[i] for i in present], dy)
    torch_grads = torch.autograd.grad(y_torch, [torch_inputs[i] for i in present], dy)
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in inputs]
    y_ref = reference(*leaves)
    ref_grads = torch.autograd.grad(y_ref, [leaves[i] for i in present], dy.double())
    assert_close_to_reference(y, y_ref, y_torch, name="y")
    for i, grad, grad_ref, grad_torch in zip(present, grads, ref_grads, torch_grads):
        assert grad.dtype == grad_torch.dtype == torch.float32, f"d{names[i]}: {grad.dtype}"
        assert_close_to_reference(grad, grad_ref, grad_torch, name=f"d{names[i]}")
