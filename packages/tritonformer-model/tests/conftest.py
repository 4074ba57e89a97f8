"""Helpers of this package's tests: twin models and modules that share one state_dict.

(The shared test kit has no model-level comparison; these build on its
`assert_close_to_reference`.)
"""

from __future__ import annotations

import copy

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, assert_rms_close_to_reference

from tritonformer import TorchTransformer, Transformer, TransformerConfig
from tritonformer.model import check_kernel_apis


def require_kernel_apis(config: TransformerConfig) -> None:
    """Skip, with the exact missing kernel APIs as the reason, when Transformer cannot run the config."""
    try:
        check_kernel_apis(config)
    except NotImplementedError as error:
        pytest.skip(str(error))


@pytest.fixture
def twins(device):
    """make(config) -> (Transformer, TorchTransformer) on the kernel device, one state_dict."""

    def make(config: TransformerConfig):
        require_kernel_apis(config)
        ours = Transformer(config).to(device)
        reference = TorchTransformer(config).to(device)
        reference.load_state_dict(ours.state_dict())
        return ours, reference

    return make


def run_module(module: torch.nn.Module, inputs, dy, dtype: torch.dtype, autocast=None):
    """module(*inputs) with floating inputs cast to dtype (under torch.autocast to `autocast` if
    given), then backward of dy (None: no backward); (output, input grads, parameter grads)."""
    module.zero_grad(set_to_none=True)
    inputs = [x.detach().to(dtype).requires_grad_() if x.is_floating_point() else x for x in inputs]
    device_type = next(module.parameters()).device.type
    with torch.autocast(device_type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        out = module(*inputs)
    if dy is None:
        return out, None, None
    out.backward(dy.to(out.dtype))
    input_grads = [x.grad for x in inputs if x.is_floating_point()]
    return out, input_grads, {name: p.grad for name, p in module.named_parameters()}


def check_twin_modules(
    ours: torch.nn.Module, reference: torch.nn.Module, inputs, dtype: torch.dtype, autocast: bool = False
) -> None:
    """The project rule on two modules with one state_dict (the reference's is copied into ours).

    ours in `dtype` (with autocast: fp32 weights under torch.autocast to `dtype`) must be at most
    2x as far from the float64 result as PyTorch run the same way: the largest error for the
    output and every floating input's gradient, the RMS error for every parameter's gradient
    (the end of the longest kernel chains, often tiny tensors: see assert_rms_close_to_reference).
    """
    ours.load_state_dict(reference.state_dict())
    run_dtype, amp = (torch.float32, dtype) if autocast else (dtype, None)
    exact = copy.deepcopy(reference).double()
    lowp = copy.deepcopy(reference).to(run_dtype)
    ours = ours.to(run_dtype)
    floating = [x for x in inputs if x.is_floating_point()]
    out64 = run_module(exact, inputs, None, torch.float64)[0]
    dy = torch.randn(out64.shape, device=out64.device, dtype=torch.float64)
    out64, dx64, dw64 = run_module(exact, inputs, dy, torch.float64)
    out_lp, dx_lp, dw_lp = run_module(lowp, inputs, dy, run_dtype, amp)
    out, dx, dw = run_module(ours, inputs, dy, run_dtype, amp)
    assert out.dtype == out_lp.dtype, f"output dtype {out.dtype} != PyTorch's {out_lp.dtype}"
    assert_close_to_reference(out, out64, out_lp, name="output")
    assert len(dx) == len(floating)
    for i, (g, g64, g_lp) in enumerate(zip(dx, dx64, dx_lp)):
        assert_close_to_reference(g, g64, g_lp, name=f"input {i} grad")
    assert set(dw) == set(dw64)
    for name in dw64:
        assert_rms_close_to_reference(dw[name], dw64[name], dw_lp[name], name=f"{name} grad")


@pytest.fixture
def check_twins():
    """check_twin_modules, for the test modules (which cannot import this conftest)."""
    return check_twin_modules


@pytest.fixture
def require_kernels():
    """require_kernel_apis, for the test modules."""
    return require_kernel_apis
