"""mlp and the MLP module against the float64 reference, forward and every gradient; the fused
activation-gradient launcher (the TMA kernel's GRAD_Z epilogue) against its unfused contract.

Interpreter-sized here (see test_matmul.py); under the interpreter mlp takes the unfused path
and the fused epilogue is forced with path="tma" (emulated tensor descriptors, Triton 3.x).
"""

import pytest
import torch
from tritonformer_testkit import (
    assert_autocast_close_to_reference,
    assert_close_to_reference,
    dtype_params,
    poisoned_allocations,
)

from fused_gemm import MLP, mlp
from fused_gemm._compat import supports_tma
from fused_gemm.kernels.common import ACTIVATION_CODES
from fused_gemm.ops.launch import launch_matmul_activation_grad
from fused_gemm.reference import activation_reference, matmul_reference

pytestmark = pytest.mark.kernels

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh"]
NAMES = ("x", "w1", "b1", "w2", "b2")


def _mlp_reference(activation):
    return lambda x, w1, b1, w2, b2: matmul_reference(matmul_reference(x, w1, b1, activation), w2, b2)


def _operands(shape, dims, dtype, device, bias):
    """x (*shape, d_in), w1 (d_in, d_hidden) and w2 (d_hidden, d_out) as nn.Linear weights' .t(), biases."""
    d_in, d_hidden, d_out = dims
    x = torch.randn(*shape, d_in, device=device).to(dtype).requires_grad_()
    w1 = (torch.randn(d_hidden, d_in, device=device) * d_in**-0.5).to(dtype).t().requires_grad_()
    w2 = (torch.randn(d_out, d_hidden, device=device) * d_hidden**-0.5).to(dtype).t().requires_grad_()
    b1 = torch.randn(d_hidden, device=device).to(dtype).requires_grad_() if bias else None
    b2 = torch.randn(d_out, device=device).to(dtype).requires_grad_() if bias else None
    return x, w1, b1, w2, b2


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", dtype_params())
def test_every_activation_and_dtype(activation, bias, dtype, device, check):
    operands = _operands((2, 19), (24, 40, 17), dtype, device, bias)
    check(lambda *t: mlp(*t, activation), _mlp_reference(activation), operands, NAMES)


def test_no_grad_matches_the_training_forward(device):
    """Under torch.no_grad (no autograd node, nothing saved) mlp gives the training forward's output."""
    operands = _operands((3, 7), (24, 40, 17), torch.bfloat16, device, True)
    y = mlp(*operands, "gelu")
    with torch.no_grad():
        y_no_grad = mlp(*operands, "gelu")
    assert y_no_grad.grad_fn is None and y_no_grad.shape == (3, 7, 17)
    assert torch.equal(y_no_grad, y.detach())


def test_autograd_records_one_node(device):
    """x's (1, M, d_in) view and the output's view back are taken inside MLPFunction: its node and
    the leaves' are the whole graph."""
    x, w1, b1, w2, b2 = _operands((2, 3), (8, 16, 4), torch.float32, device, True)
    y = mlp(x, w1, b1, w2, b2)
    names = []
    stack = [y.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None:
            names.append(type(node).__name__)
            stack.extend(next_node for next_node, _ in node.next_functions)
    assert sorted(names) == ["AccumulateGrad"] * 5 + ["MLPFunctionBackward"]


def test_module_matches_two_linears(device):
    """MLP (one mlp call) gives the values of fc2(fc1(x)) through matmul, with the same parameters."""
    torch.manual_seed(0)
    module = MLP(24, 48, activation="gelu", device=device)
    x = torch.randn(3, 7, 24, device=device, requires_grad=True)
    y = module(x)
    y.sum().backward()
    grads = [x.grad] + [p.grad for p in module.parameters()]
    x2 = x.detach().clone().requires_grad_()
    for p in module.parameters():
        p.grad = None
    expected = module.fc2(module.fc1(x2))
    expected.sum().backward()
    expected_grads = [x2.grad] + [p.grad for p in module.parameters()]
    torch.testing.assert_close(y, expected)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)


def test_autocast_gives_fp32_gradients(device):
    """Under autocast, fp32 parameters get fp32 gradients (ops.matmul's rule) as close to the float64
    reference as torch's own autocast MLP's."""
    x, w1, b1, w2, b2 = _operands((20,), (32, 48, 24), torch.float32, device, True)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = mlp(x, w1, b1, w2, b2, "gelu")
        hidden = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1.t(), b1))
        expected = torch.nn.functional.linear(hidden, w2.t(), b2)
    assert y.dtype == torch.bfloat16
    dy = torch.randn(20, 24, device=device)
    operands = (x, w1, b1, w2, b2)
    assert_autocast_close_to_reference(y, expected, operands, operands, _mlp_reference("gelu"), dy, NAMES)


def test_bad_arguments_name_themselves(device):
    x, w1, b1, w2, b2 = _operands((5,), (8, 16, 4), torch.float32, device, True)
    with pytest.raises(ValueError, match="hidden dimensions do not match"):
        mlp(x, w1, b1, w2[1:], b2)
    with pytest.raises(ValueError, match="inner dimensions do not match"):
        mlp(x[:, 1:], w1, b1, w2, b2)
    with pytest.raises(ValueError, match=r"^b1 must have shape \(16,\) \(w1.shape\[1\]\)"):
        mlp(x, w1, b2, w2, b2)
    with pytest.raises(TypeError, match="b2"):
        mlp(x, w1, b1, w2, b2.to(torch.int32))
    with pytest.raises(ValueError, match="activation"):
        mlp(x, w1, b1, w2, b2, "swish")


PATHS = ["unfused", "tma"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("column_sum", [False, True], ids=["no-sum", "sum"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_fused_activation_gradient(activation, column_sum, path, device):
    """dZ = (dY @ W2^T) * act'(saved) and its column sums, rows and columns that are not multiples of
    a tile, against the product and the elementwise pass computed by torch (float64 and bf16). The
    second call takes the config the first one chose (its partial sums in unzeroed memory): the same."""
    if path == "tma" and not supports_tma(torch.device(device)):
        pytest.skip("the TMA kernel needs Triton >= 3.4 and a Hopper GPU (or the Triton 3.x interpreter)")
    m, k, n, dtype = 75, 40, 56, torch.bfloat16
    dy = torch.randn(1, m, k, device=device).to(dtype)
    w2 = (torch.randn(1, n, k, device=device) * k**-0.5).to(dtype).transpose(1, 2)  # (d_hidden, d_out)^T view
    z = torch.randn(1, m, n, device=device).to(dtype)
    saved = activation_reference(z, "relu") if activation == "relu" else z
    with poisoned_allocations():
        dz, dbias = launch_matmul_activation_grad(dy, w2, saved, ACTIVATION_CODES[activation], column_sum, path=path)
        again = launch_matmul_activation_grad(dy, w2, saved, ACTIVATION_CODES[activation], column_sum, path=path)
    assert torch.equal(again[0], dz) and (dbias is None) == (again[1] is None)
    assert dbias is None or torch.equal(again[1], dbias)

    def contract(dtype):
        dh = torch.bmm(dy.to(dtype), w2.to(dtype))
        if activation == "relu":
            return dh.masked_fill(saved <= 0, 0)
        approximate = "tanh" if activation == "gelu_tanh" else "none"
        return torch.ops.aten.gelu_backward(dh, z.to(dtype), approximate=approximate)

    reference, low = contract(torch.float64), contract(dtype)
    assert dz.dtype == dtype and dz.shape == (1, m, n)
    assert_close_to_reference(dz, reference, low, name="dz")
    if column_sum:
        assert dbias.dtype == torch.float32
        assert_close_to_reference(dbias, reference.sum((0, 1)), low.float().sum((0, 1)), name="d(bias)")
    else:
        assert dbias is None
