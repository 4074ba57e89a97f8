"""Helpers for the fused-gemm suites (fixtures: importlib mode gives test files no sibling imports).

Pinned configs: compiled on a GPU, every autotuned kernel of the correctness tests runs with ONE
config, its last (the smallest; it fits every dtype and variant), instead of autotuning each
test's shape: compiling and timing every candidate for every new (M, N, K) was most of the GPU
test time (~10 s a test). Every other config still runs: test_gemm_gpu.py::test_every_config
pins each in turn, the AOT pass compiles them all, and the benchmarks autotune over them. Under
the interpreter the kernels carry one config anyway. (The shared test kit has no such fixture.)
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, interpreting, poisoned_allocations

from fused_gemm.kernels.matmul import _matmul_kernel
from fused_gemm.kernels.matmul_tma import _matmul_tma_kernel

AUTOTUNED_KERNELS = (_matmul_kernel, _matmul_tma_kernel)
# Each kernel's own list, before any test pins one.
ALL_CONFIGS = {kernel: list(kernel.configs) for kernel in AUTOTUNED_KERNELS}


def pin_config(monkeypatch, kernel, index: int) -> None:
    """`kernel` runs with its `index`-th config only (a one-config autotuner neither prunes nor times)."""
    monkeypatch.setattr(kernel, "configs", [ALL_CONFIGS[kernel][index]])


@pytest.fixture(autouse=True)
def _pinned_configs(request, monkeypatch):
    """Compiled kernel tests run each autotuned kernel with its last config (see the module docstring)."""
    marked = request.node.get_closest_marker("kernels") or request.node.get_closest_marker("gpu")
    if marked and not interpreting() and not request.node.get_closest_marker("aot"):
        for kernel in AUTOTUNED_KERNELS:
            pin_config(monkeypatch, kernel, -1)


def _leaves(tensors, dtype=None):
    """Fresh leaves of the same values (and strides, unless cast), requiring grad where the originals do."""
    out = []
    for t in tensors:
        if t is None:
            out.append(None)
            continue
        leaf = t.detach() if dtype is None else t.detach().to(dtype)
        out.append(leaf.requires_grad_(t.requires_grad))
    return out


def _forward_backward(fn: Callable, tensors, dy: Optional[torch.Tensor], poison: bool):
    leaves = _leaves(tensors)
    if poison:
        with poisoned_allocations():
            y = fn(*leaves)
    else:
        y = fn(*leaves)
    if dy is None:
        dy = torch.randn_like(y)
    wanted = [t for t in leaves if t is not None and t.requires_grad]
    if not wanted:
        return y, [], dy
    if poison:
        with poisoned_allocations():
            grads = torch.autograd.grad(y, wanted, dy)
    else:
        grads = torch.autograd.grad(y, wanted, dy)
    return y, list(grads), dy


def check_against_reference(
    ours: Callable,
    reference: Callable,
    tensors: Sequence[Optional[torch.Tensor]],
    names: Sequence[str],
    dy: Optional[torch.Tensor] = None,
):
    """Run `ours` forward and backward (outputs poisoned), and compare the output and the gradient of
    every input that requires grad with `reference` in float64, by the project's rule: error at most
    2x that of `reference` run by PyTorch in the inputs' low precision. Returns our output and grads."""
    y, grads, dy = _forward_backward(ours, tensors, dy, poison=True)
    y_ref, grads_ref, _ = _forward_backward(reference, _leaves(tensors, torch.float64), dy.double(), poison=False)
    y_low, grads_low, _ = _forward_backward(reference, tensors, dy, poison=False)
    lowp = next(t.dtype for t in tensors if t is not None)
    assert y.dtype == lowp and y.shape == y_ref.shape, (y.dtype, y.shape, y_ref.shape)
    assert_close_to_reference(y, y_ref, y_low, name="y")
    differentiable = [(n, t) for n, t in zip(names, tensors) if t is not None and t.requires_grad]
    for (name, t), g, g_ref, g_low in zip(differentiable, grads, grads_ref, grads_low):
        assert g.shape == t.shape and g.dtype == t.dtype, (name, g.shape, t.shape, g.dtype)
        assert_close_to_reference(g, g_ref, g_low, name=f"d{name}")
    return y, grads


@pytest.fixture
def check():
    """check(ours, reference, tensors, names, dy=None): see check_against_reference."""
    return check_against_reference


@pytest.fixture
def pin():
    """pin(monkeypatch, kernel, index): run `kernel` with its index-th config only (see pin_config)."""
    return pin_config
