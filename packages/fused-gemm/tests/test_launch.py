"""The launcher's two kernels, forced one at a time, on every operand layout and fused option.

matmul/bmm pick the kernel themselves (TMA where it can run, else portable); here each path runs
the same cases, so the portable kernel is checked on aligned operands too, and the TMA kernel on
each transpose and on 3-D (batched) descriptors. Reference: the kernel contract in float64,
bound by the same computation in torch's low precision (the project's tolerance rule).
"""

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, poisoned_allocations

from fused_gemm._compat import HAS_TENSOR_DESCRIPTORS, supports_tma
from fused_gemm.kernels.common import ACTIVATION_CODES, SAVED_GRAD_SCALE
from fused_gemm.ops.launch import launch_matmul, tma_layouts
from fused_gemm.reference import activation_reference

pytestmark = pytest.mark.kernels

PROLOGUES = {"none": 0, "mul": 1, "relu_mask": 2}


def _matrix(batch, rows, cols, transposed, device, dtype, scale=1.0):
    """(batch, rows, cols) with row-major matrices, or the transpose of row-major ones."""
    if transposed:
        return (scale * torch.randn(batch, cols, rows, device=device)).to(dtype).transpose(1, 2)
    return (scale * torch.randn(batch, rows, cols, device=device)).to(dtype)


def _empty_matrix(batch, rows, cols, transposed, device, dtype):
    if transposed:
        return torch.empty(batch, cols, rows, device=device, dtype=dtype).transpose(1, 2)
    return torch.empty(batch, rows, cols, device=device, dtype=dtype)


def _contract(a, b, s, prologue, bias, activation):
    """What the kernel computes, with torch ops in a's dtype: (c, aux, row sums of the scaled a).

    The GELU derivative is stored (aux) and read back (prologue "mul") scaled by SAVED_GRAD_SCALE.
    """
    scale = SAVED_GRAD_SCALE.value
    if prologue == "mul":
        a = a * (s / scale)
    elif prologue == "relu_mask":
        a = a.masked_fill(s <= 0, 0)
    z = torch.bmm(a, b)
    if bias is not None:
        z = z + bias
    z = z.detach().requires_grad_()
    with torch.enable_grad():
        y = activation_reference(z, activation)
        (grad,) = torch.autograd.grad(y.sum(), z)
    return y.detach(), grad * (scale if activation in ("gelu", "gelu_tanh") else 1.0), a.float().sum(-1)


CASES = [
    # name: batch, a_t, b_t, c_t, prologue, row_sum, bias, activation, aux
    ("fwd-linear-weight", 1, False, True, False, "none", False, True, "gelu", True),
    ("fwd-row-major", 1, False, False, False, "none", False, True, "gelu_tanh", False),
    ("fwd-relu", 1, False, True, False, "none", False, False, "relu", False),
    ("dx-gelu", 1, False, False, False, "mul", False, False, None, False),
    ("dx-relu", 1, False, True, False, "relu_mask", False, False, None, False),
    ("dw-gelu-dbias", 1, True, False, False, "mul", True, False, None, False),
    ("dw-transposed-out", 1, True, False, True, "mul", True, False, None, False),
    ("dw-bias-only", 1, True, False, False, "none", True, False, None, False),
    ("bmm-fwd", 3, False, True, False, "none", False, True, "gelu", True),
    ("bmm-db", 3, True, False, True, "relu_mask", True, False, None, False),
]


@pytest.mark.parametrize("path", ["portable", "tma"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_both_kernels_on_every_layout_and_option(case, path, device):
    if path == "tma" and not supports_tma(torch.device(device)):
        pytest.skip("the TMA kernel needs Triton >= 3.4 and a Hopper GPU (or the Triton 3.x interpreter)")
    _, batch, a_t, b_t, c_t, prologue, row_sum, with_bias, activation, aux = case
    m, k, n, dtype = 40, 48, 24, torch.bfloat16
    a = _matrix(batch, m, k, a_t, device, dtype)
    s = _matrix(batch, m, k, a_t, device, dtype) if prologue != "none" else None
    b = _matrix(batch, k, n, b_t, device, dtype, scale=k**-0.5)
    bias = torch.randn(n, device=device, dtype=dtype) if with_bias else None
    with poisoned_allocations():
        c = _empty_matrix(batch, m, n, c_t, device, dtype)
        aux_out = torch.empty_like(c) if aux else None
        sums = torch.empty(batch, m, device=device, dtype=torch.float32) if row_sum else None
    ran = launch_matmul(
        a, b, c, s=s, prologue=PROLOGUES[prologue], row_sum=sums, bias=bias,
        activation=ACTIVATION_CODES[activation], aux=aux_out, path=path,
    )  # fmt: skip
    assert ran == path

    def operands(dtype):
        return [t.to(dtype) if t is not None else None for t in (a, b, s, bias)]

    ref = _contract(*operands(torch.float64)[:3], prologue, operands(torch.float64)[3], activation)
    low = _contract(*operands(dtype)[:3], prologue, operands(dtype)[3], activation)
    assert_close_to_reference(c, ref[0], low[0], name="c")
    if aux:
        assert_close_to_reference(aux_out, ref[1], low[1], name="aux")
    if row_sum:
        assert_close_to_reference(sums, ref[2], low[2], name="row_sum")


@pytest.mark.skipif(
    not HAS_TENSOR_DESCRIPTORS, reason="this Triton has no tensor descriptors: only the portable kernel"
)
def test_tma_layout_rules(device):
    """Which operands a tensor descriptor can address: 16-byte aligned base and strides, one unit stride."""
    if not supports_tma(torch.device(device)):
        pytest.skip("the TMA kernel needs a Hopper GPU (or the Triton 3.x interpreter)")
    x = torch.randn(1, 32, 48, device=device, dtype=torch.bfloat16)
    w = torch.randn(1, 24, 48, device=device, dtype=torch.bfloat16).transpose(1, 2)
    y = torch.empty(1, 32, 24, device=device, dtype=torch.bfloat16)
    assert tma_layouts(x, w, y) == (False, True, False)
    assert tma_layouts(x[:, :, 1:], w[:, 1:], y) is None  # base not 16-byte aligned
    assert tma_layouts(x[:, :, ::2], w[:, ::2], y) is None  # no unit stride
    assert tma_layouts(x.float(), w.float(), y.float()) is None  # fp32: the portable kernel
    shared = torch.randn(1, 48, 24, device=device, dtype=torch.bfloat16).expand(3, 48, 24)  # batch stride 0
    assert tma_layouts(x.expand(3, 32, 48).contiguous(), shared, y.expand(3, 32, 24).contiguous()) is None
    odd = torch.randn(1, 32, 47, device=device, dtype=torch.bfloat16)
    assert tma_layouts(odd, torch.randn(1, 47, 24, device=device, dtype=torch.bfloat16), y) is None  # 94-byte rows
