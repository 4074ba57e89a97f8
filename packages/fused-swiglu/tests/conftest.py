"""Helpers of this package's tests, handed to them as the `sw` fixture: run ours, the float64
reference and PyTorch's low-precision twin on the same inputs and upstream gradient, and
compare every output with the project's rule. (The shared test kit has no forward+backward
comparison of several inputs; these build on its assert_close_to_reference and
poisoned_allocations.)

Pinned configs: compiled on a GPU, every autotuned kernel of the correctness tests runs with
ONE config, its last (the smallest, which fits every dtype; `pin_configs`), instead of
autotuning each test's shape: compiling and timing every config for every new (M, N, K) would be
most of the GPU test time. Every other config still runs: `test_every_config.py::test_every_config`
pins each in turn (bf16, odd dims), the AOT pass compiles them all, and the
benchmarks autotune over them. Under the interpreter the kernels carry one config anyway.
"""

from __future__ import annotations

import types
from typing import Callable, Optional, Sequence

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import (
    assert_autocast_close_to_reference,
    assert_close_to_reference,
    assert_rms_close_to_reference,
    interpreting,
    poisoned_allocations,
)

from fused_swiglu.kernels.backward import (
    _mlp_down_grad_kernel,
    _mlp_down_grad_tma_kernel,
    _swiglu_input_grad_kernel,
    _swiglu_input_grad_tma_kernel,
    _swiglu_weight_grad_kernel,
    _swiglu_weight_grad_tma_kernel,
)
from fused_swiglu.kernels.forward import _swiglu_fwd_kernel, _swiglu_fwd_tma_kernel

AUTOTUNED_KERNELS = (
    _swiglu_fwd_kernel,
    _swiglu_fwd_tma_kernel,
    _mlp_down_grad_kernel,
    _mlp_down_grad_tma_kernel,
    _swiglu_input_grad_kernel,
    _swiglu_input_grad_tma_kernel,
    _swiglu_weight_grad_kernel,
    _swiglu_weight_grad_tma_kernel,
)
# Each kernel's own list, before any test pins one.
ALL_CONFIGS = {kernel: list(kernel.configs) for kernel in AUTOTUNED_KERNELS}

NAMES = ("x", "w_gate", "w_up", "w_down", "b_gate", "b_up", "b_down")


def linear_weight(fan_in: int, fan_out: int, device, dtype) -> torch.Tensor:
    """(fan_in, fan_out) weight with nn.Linear's scale, so that outputs stay O(1)."""
    bound = fan_in**-0.5
    return torch.empty(fan_in, fan_out, device=device, dtype=torch.float32).uniform_(-bound, bound).to(dtype)


def outputs_and_grads(fn: Callable, inputs: Sequence[Optional[torch.Tensor]], dy: Optional[torch.Tensor] = None):
    """fn(*inputs) and the gradients of every input that requires grad, for upstream gradient dy."""
    leaves = [t for t in inputs if t is not None and t.requires_grad]
    y = fn(*inputs)
    if dy is None:
        dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, leaves, dy) if leaves else ()
    return y, grads, dy


def detached(inputs, dtype=None):
    """Fresh leaves (optionally cast to dtype) with the same requires_grad as `inputs`."""
    out = []
    for t in inputs:
        if t is None:
            out.append(None)
        else:
            out.append(t.detach().to(dtype or t.dtype).requires_grad_(t.requires_grad))
    return out


def check_against_reference(ours: Callable, reference: Callable, inputs, names: Sequence[str] = NAMES):
    """ours(*inputs) (outputs poisoned) against reference in float64 and in the inputs' dtype.

    Every input that requires grad gets a gradient check; returns (y, grads) of ours. y and dx by
    their largest error; the weight and bias gradients, sums over every row of rounded d_gate,
    d_up and h, by their RMS error (the testkit's rule for such results): measured on an H100 in
    bf16 (lab/gpu/numerics_diag.py, 2 activations x 8 seeds), their RMS error was below
    PyTorch's in 31 of 32 draws, while the largest error of one draw reached 1.5x PyTorch's,
    and 2.45x in one fixed test draw.
    """
    with poisoned_allocations():
        y, grads, dy = outputs_and_grads(ours, inputs)
    y_ref, grads_ref, _ = outputs_and_grads(reference, detached(inputs, torch.float64), dy.double())
    y_low, grads_low, _ = outputs_and_grads(reference, detached(inputs), dy)
    assert y.dtype == inputs[0].dtype and y.shape == y_ref.shape
    assert_close_to_reference(y, y_ref, y_low, name="y")
    trained = [(name, t) for name, t in zip(names, inputs) if t is not None and t.requires_grad]
    assert len(grads) == len(trained)
    for (name, t), g, g_ref, g_low in zip(trained, grads, grads_ref, grads_low):
        assert g.shape == t.shape and g.dtype == t.dtype, f"d{name}: {g.shape} {g.dtype} for {t.shape} {t.dtype}"
        check = assert_close_to_reference if name == "x" else assert_rms_close_to_reference
        check(g, g_ref, g_low, name=f"d{name}")
    return y, grads


def make_inputs(leading, d_model, d_inter, dtype, device, bias=False):
    """[x, w_gate, w_up] (+ [b_gate, b_up] when bias), all requiring grad."""
    x = torch.randn(*leading, d_model, device=device, dtype=dtype).requires_grad_()
    w_gate = linear_weight(d_model, d_inter, device, dtype).requires_grad_()
    w_up = linear_weight(d_model, d_inter, device, dtype).requires_grad_()
    if not bias:
        return [x, w_gate, w_up]
    b_gate = (0.5 * torch.randn(d_inter, device=device)).to(dtype).requires_grad_()
    b_up = (0.5 * torch.randn(d_inter, device=device)).to(dtype).requires_grad_()
    return [x, w_gate, w_up, b_gate, b_up]


def with_activation(fn: Callable, activation: str, operands: int) -> Callable:
    """fn(*inputs) with the operands it was not given as None and `activation` after them, all
    positional (as an autograd Function's apply takes them): fn's first `operands` parameters are
    its tensors, the next one the activation."""

    def call(*inputs):
        return fn(*inputs, *(None,) * (operands - len(inputs)), activation)

    return call


def swiglu_linear(x, w_gate, w_up, b_gate=None, b_up=None):
    """swiglu_reference through F.linear, as a model of nn.Linear layers computes it: under
    autocast every operand, biases included, is cast to its dtype (`x @ w + b` would add an fp32
    bias in fp32, and run the activation and its gradient in fp32 after it)."""
    return F.silu(F.linear(x, w_gate.t(), b_gate)) * F.linear(x, w_up.t(), b_up)


def swiglu_mlp_linear(x, w_gate, w_up, w_down, b_gate=None, b_up=None, b_down=None):
    """swiglu_mlp_reference through F.linear (see swiglu_linear)."""
    return F.linear(swiglu_linear(x, w_gate, w_up, b_gate, b_up), w_down.t(), b_down)


def check_autocast_against_torch(ours: Callable, twin: Callable, reference: Callable, inputs, names=NAMES):
    """ours(*inputs) under bf16 autocast (inputs fp32, all requiring grad) against the float64
    reference, y and every gradient (fp32, checked) as close as torch's own autocast computation
    (`twin`, through F.linear, under autocast) is."""
    device = inputs[0].device.type
    twin_inputs = detached(inputs)
    with torch.autocast(device, dtype=torch.bfloat16):
        with poisoned_allocations():
            y = ours(*inputs)
        y_twin = twin(*twin_inputs)
    assert y.dtype == y_twin.dtype == torch.bfloat16
    assert_autocast_close_to_reference(y, y_twin, inputs, twin_inputs, reference, torch.randn_like(y), names)


def returned_grad_dtypes(monkeypatch, function) -> list:
    """Spies on `function`'s backward: the list gets, per call, the dtype (or None) of each gradient
    it returns, before autograd casts any to its input's dtype."""
    calls = []
    backward = function.backward

    def spy(ctx, *grads):
        out = backward(ctx, *grads)
        calls.append([None if g is None else g.dtype for g in out])
        return out

    monkeypatch.setattr(function, "backward", staticmethod(spy))
    return calls


def pin_configs(monkeypatch, index: int = -1) -> None:
    """Each autotuned kernel runs with its `index`-th config only (its last where it has fewer)."""
    for kernel, configs in ALL_CONFIGS.items():
        monkeypatch.setattr(kernel, "configs", [configs[min(index, len(configs) - 1) if index >= 0 else index]])


def unpin_configs(monkeypatch) -> None:
    """Every autotuned kernel offers its whole list again and has tuned nothing yet (a fresh list
    object also sends the launchers' direct launches back through the autotuner)."""
    for kernel, configs in ALL_CONFIGS.items():
        monkeypatch.setattr(kernel, "configs", list(configs))
        monkeypatch.setattr(kernel, "cache", {})


@pytest.fixture(autouse=True)
def _pinned_configs(request, monkeypatch):
    """Compiled kernel tests run each autotuned kernel with its last config (see the module docstring)."""
    marked = request.node.get_closest_marker("kernels") or request.node.get_closest_marker("gpu")
    if marked and not interpreting() and not request.node.get_closest_marker("aot"):
        pin_configs(monkeypatch)


@pytest.fixture
def sw():
    return types.SimpleNamespace(
        check_against_reference=check_against_reference,
        check_autocast_against_torch=check_autocast_against_torch,
        detached=detached,
        linear_weight=linear_weight,
        make_inputs=make_inputs,
        outputs_and_grads=outputs_and_grads,
        pin_configs=pin_configs,
        unpin_configs=unpin_configs,
        with_activation=with_activation,
        all_configs=ALL_CONFIGS,
        returned_grad_dtypes=returned_grad_dtypes,
        swiglu_linear=swiglu_linear,
        swiglu_mlp_linear=swiglu_mlp_linear,
    )
