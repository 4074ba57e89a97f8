"""bmm against the float64 reference, forward and every gradient (interpreter-sized; GPU sizes in test_gemm_gpu.py)."""

import pytest
import torch
from tritonformer_testkit import dtype_params

from fused_gemm import bmm
from fused_gemm.reference import bmm_reference

pytestmark = pytest.mark.kernels

NAMES = ("a", "b", "bias")


def _ours(activation):
    return lambda a, b, bias: bmm(a, b, bias, activation)


def _reference(activation):
    return lambda a, b, bias: bmm_reference(a, b, bias, activation)


@pytest.mark.parametrize("shape", [(2, 33, 40, 24), (2, 19, 17, 21), (1, 7, 16, 33)], ids=["aligned", "odd", "batch1"])
@pytest.mark.parametrize("activation, with_bias", [(None, False), ("gelu", True), ("relu", False)])
@pytest.mark.parametrize("dtype", dtype_params())
def test_epilogues_dtypes_and_shapes(shape, activation, with_bias, dtype, device, check):
    batch, m, n, k = shape
    a = torch.randn(batch, m, n, device=device, dtype=dtype, requires_grad=True)
    b = (torch.randn(batch, n, k, device=device) / n**0.5).to(dtype).requires_grad_()  # O(1) outputs
    bias = torch.randn(k, device=device, dtype=dtype, requires_grad=True) if with_bias else None
    y, _ = check(_ours(activation), _reference(activation), (a, b, bias), NAMES)
    assert y.shape == (batch, m, k)


@pytest.mark.parametrize("dtype", dtype_params((torch.float32, torch.bfloat16)))
def test_transposed_operands(dtype, device, check):
    """Attention-style operands: b = k.transpose(1, 2), a = p.transpose(1, 2), no copies."""
    a = torch.randn(4, 32, 24, device=device, dtype=dtype).transpose(1, 2).requires_grad_()  # (4, 24, 32)
    b = (torch.randn(4, 40, 32, device=device) / 32**0.5).to(dtype).transpose(1, 2).requires_grad_()  # (4, 32, 40)
    bias = torch.randn(40, device=device, dtype=dtype, requires_grad=True)
    check(_ours("gelu_tanh"), _reference("gelu_tanh"), (a, b, bias), NAMES)


def test_broadcast_weight_and_strided_batches(device, check):
    """b shared by every batch (an expanded view, batch stride 0) and a batch-strided a: any strides."""
    a = torch.randn(6, 16, 32, device=device, dtype=torch.bfloat16)[::2].requires_grad_()  # (3, 16, 32)
    b = (torch.randn(1, 32, 24, device=device) / 32**0.5).to(torch.bfloat16).expand(3, 32, 24).requires_grad_()
    check(
        lambda a, b, bias: bmm(a, b, bias, "relu"),
        lambda a, b, bias: bmm_reference(a, b, bias, "relu"),
        (a, b, None),
        NAMES,
    )
