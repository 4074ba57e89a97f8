"""matmul against the float64 reference, forward and every gradient, under the project's tolerance rule.

Interpreter-sized here: tiles are 16 wide when interpreting, so sizes 1, 7, 17, 48 and 65 play
the roles of 1, 7, 127, 1000 and 4097 (one element, under a tile, one past a tile, a multiple,
a multiple plus one). 16-bit operands with 8-aligned dims take the TMA kernel (emulated by the
Triton 3.x interpreter), the others the portable kernel; test_gemm_gpu.py runs the real sizes.
"""

import pytest
import torch
from tritonformer_testkit import (
    assert_autocast_close_to_reference,
    assert_close_to_reference,
    dtype_params,
    poisoned_allocations,
)

from fused_gemm import matmul
from fused_gemm.reference import matmul_reference

pytestmark = pytest.mark.kernels

ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh"]
NAMES = ("x", "w", "bias")


def _weight(*shape, fan_in, device, dtype):
    """Scaled like an nn.Linear weight (std 1/sqrt(fan_in)), so outputs and gradients are O(1)."""
    return (torch.randn(*shape, device=device) / max(fan_in, 1) ** 0.5).to(dtype)


def _operands(m, k, n, dtype, device, bias=True):
    """x (m, k), w (k, n) as nn.Linear's weight.t(), bias (n,), all requiring grad."""
    x = torch.randn(m, k, device=device, dtype=dtype).requires_grad_()
    w = _weight(n, k, fan_in=k, device=device, dtype=dtype).t().requires_grad_()
    b = torch.randn(n, device=device, dtype=dtype).requires_grad_() if bias else None
    return x, w, b


def _ours(activation):
    return lambda x, w, b: matmul(x, w, b, activation)


def _reference(activation):
    return lambda x, w, b: matmul_reference(x, w, b, activation)


@pytest.mark.parametrize("shape", [(37, 40, 24), (29, 17, 21)], ids=["aligned", "odd"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", dtype_params())
def test_every_epilogue_and_dtype(shape, bias, activation, dtype, device, check):
    x, w, b = _operands(*shape, dtype, device, bias)
    check(_ours(activation), _reference(activation), (x, w, b), NAMES)


SIZES = [1, 7, 17, 48, 65]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dim", ["m", "k", "n"])
@pytest.mark.parametrize("dtype", dtype_params((torch.float32, torch.bfloat16)))
def test_sizes_in_every_dim(dim, size, dtype, device, check):
    dims = {"m": 24, "k": 32, "n": 40}
    dims[dim] = size
    x, w, b = _operands(dims["m"], dims["k"], dims["n"], dtype, device)
    check(_ours("gelu"), _reference("gelu"), (x, w, b), NAMES)


@pytest.mark.parametrize("leading", [(), (3,), (2, 9), (2, 3, 4)], ids=["1d", "2d", "3d", "4d"])
@pytest.mark.parametrize("dtype", dtype_params((torch.float32, torch.float16)))
def test_leading_dims_flatten_into_tokens(leading, dtype, device, check):
    """x (..., n) of 1-4 dims; dW and d(bias) reduce over every leading dim inside one launch."""
    x = torch.randn(*leading, 24, device=device, dtype=dtype).requires_grad_()
    _, w, b = _operands(1, 24, 16, dtype, device)
    y, _ = check(_ours("relu"), _reference("relu"), (x, w, b), NAMES)
    assert y.shape == (*leading, 16)


@pytest.mark.parametrize("dtype", dtype_params())
def test_non_contiguous_and_transposed_inputs(dtype, device, check):
    transposed_x = torch.randn(2, 24, 19, device=device, dtype=dtype).transpose(1, 2)  # (2, 19, 24): unit stride on m
    strided_x = torch.randn(19, 48, device=device, dtype=dtype)[:, ::2]  # (19, 24), column stride 2
    contiguous_w = _weight(24, 40, fan_in=24, device=device, dtype=dtype)  # (k, n) row-major
    strided_w = _weight(24, 80, fan_in=24, device=device, dtype=dtype)[:, 1::2]  # (24, 40), odd offset, stride 2
    strided_b = torch.randn(80, device=device, dtype=dtype)[::2]
    for x, w in [(transposed_x, contiguous_w), (strided_x, strided_w), (transposed_x, strided_w)]:
        tensors = (x.requires_grad_(), w.requires_grad_(), strided_b.requires_grad_())
        check(_ours("gelu_tanh"), _reference("gelu_tanh"), tensors, NAMES)


@pytest.mark.parametrize("dtype", dtype_params((torch.float32, torch.bfloat16)))
def test_non_contiguous_upstream_gradients(dtype, device, check):
    x, w, b = _operands(20, 32, 24, dtype, device)
    transposed_dy = torch.randn(24, 20, device=device, dtype=dtype).t()
    check(_ours("gelu"), _reference("gelu"), (x, w, b), NAMES, dy=transposed_dy)
    expanded_dy = torch.randn(1, 24, device=device, dtype=dtype).expand(20, 24)  # as from y.sum(0)
    check(_ours("relu"), _reference("relu"), (x, w, b), NAMES, dy=expanded_dy)


@pytest.mark.parametrize("requires", ["x", "w", "bias", "x,bias", "w,bias"])
def test_gradients_for_any_subset_of_inputs(requires, device, check):
    x, w, b = _operands(21, 24, 32, torch.bfloat16, device)
    for name, t in zip(NAMES, (x, w, b)):
        t.requires_grad_(name in requires.split(","))
    check(_ours("gelu"), _reference("gelu"), (x, w, b), NAMES)


def test_weight_gradient_keeps_the_nn_linear_layout(device):
    """w = weight.t() gets a gradient laid out as weight.t() (weight.grad contiguous, no copy)."""
    weight = _weight(24, 32, fan_in=32, device=device, dtype=torch.bfloat16).requires_grad_()
    x = torch.randn(16, 32, device=device, dtype=torch.bfloat16)
    matmul(x, weight.t(), activation="gelu").sum().backward()
    assert weight.grad.is_contiguous()
    w = _weight(32, 24, fan_in=32, device=device, dtype=torch.bfloat16).requires_grad_()
    matmul(x, w).sum().backward()
    assert w.grad.is_contiguous()


def test_inference_stores_no_derivative(device, monkeypatch):
    """Under no_grad (parameters requiring grad, as in model evaluation) the forward skips the saved
    derivative; the output is the same as in training."""
    from fused_gemm.ops import matmul as ops

    calls = []

    def recording(*args):
        calls.append(args[4])  # save_z
        return forward_op(*args)

    forward_op = ops.gemm_forward_op
    monkeypatch.setattr(ops, "gemm_forward_op", recording)
    x, w, b = _operands(33, 40, 24, torch.bfloat16, device)
    with torch.no_grad():
        y_inference = matmul(x, w, b, "gelu")
    y_training = matmul(x, w, b, "gelu")
    assert calls == [False, True]
    assert torch.equal(y_inference, y_training.detach())
    assert y_training.grad_fn is not None and y_inference.grad_fn is None


@pytest.mark.parametrize("m, k, n", [(0, 8, 16), (8, 0, 16), (8, 16, 0)])
def test_empty_dims(m, k, n, device):
    """No tokens, no inner dim (y = act(bias)), no outputs: the shapes and gradients torch gives."""
    x, w, b = _operands(m, k, n, torch.float32, device)
    y = matmul(x, w, b, "gelu")
    expected = matmul_reference(x, w, b, "gelu")
    assert y.shape == (m, n)
    assert_close_to_reference(y, expected.double(), expected, name="y")
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    expected_grads = torch.autograd.grad(expected, (x, w, b), dy)
    for name, g, e in zip(NAMES, grads, expected_grads):
        assert_close_to_reference(g, e.double(), e, name=f"d{name}")


def test_nan_propagates_like_torch(device):
    """A NaN in x makes its row of y NaN, as in torch (and through ReLU, which keeps NaN)."""
    x, w, b = (t.detach() for t in _operands(19, 24, 16, torch.float32, device))
    x[3, 5] = float("nan")
    with poisoned_allocations():
        y = matmul(x, w, b, "relu")
    expected = matmul_reference(x.double(), w.double(), b.double(), "relu")
    assert bool(y[3].isnan().all())
    assert_close_to_reference(y, expected, matmul_reference(x, w, b, "relu"), name="y")


def _autograd_node_names(tensor):
    """Names of every autograd node that produced `tensor`."""
    names, stack, seen = [], [tensor.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_autograd_records_one_node(device):
    """The views between matmul's operands (x (..., n), w (n, k)) and the kernels' 3-D ones are
    taken inside GemmFunction: its node and the leaves' are the whole graph (each view node would
    add host time to the forward and the backward)."""
    x = torch.randn(2, 5, 32, device=device, requires_grad=True)
    w = torch.randn(32, 24, device=device, requires_grad=True)
    b = torch.randn(24, device=device, requires_grad=True)
    y = matmul(x, w, b, "gelu")
    assert sorted(_autograd_node_names(y)) == ["AccumulateGrad"] * 3 + ["GemmFunctionBackward"]
    dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.ones_like(y))
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == b.shape


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_autocast_multiplies_like_f_linear_with_fp32_gradients(activation, device):
    """Under autocast, fp32 operands are multiplied in its dtype, and the gradients of x, w and
    bias come back in fp32, as close to the float64 reference as F.linear's under autocast."""
    x = torch.randn(20, 32, device=device, requires_grad=True)
    w = _weight(24, 32, fan_in=32, device=device, dtype=torch.float32).requires_grad_()
    b = torch.randn(24, device=device, requires_grad=True)
    act = torch.nn.functional.gelu if activation else (lambda t: t)
    with torch.autocast(device, dtype=torch.bfloat16):
        y = matmul(x, w.t(), b, activation)
        expected = act(torch.nn.functional.linear(x, w, b))
    assert y.dtype == torch.bfloat16
    reference = lambda x, w, b: matmul_reference(x, w.t(), b, activation)  # noqa: E731
    operands = (x, w, b)
    dy = torch.randn(20, 24, device=device)
    assert_autocast_close_to_reference(y, expected, operands, operands, reference, dy, NAMES)


def test_autocast_gradients_need_no_cast_back(device):
    """The fp32 parameters' gradients come from the kernels in fp32: no ToCopy (cast) node lies
    between the matmul and the parameters, where F.linear under autocast has one per operand."""
    x = torch.randn(20, 32, device=device)
    w = torch.randn(24, 32, device=device, requires_grad=True)
    b = torch.randn(24, device=device, requires_grad=True)
    with torch.autocast(device, dtype=torch.bfloat16):
        ours = _autograd_node_names(matmul(x, w.t(), b, "gelu"))
        theirs = _autograd_node_names(torch.nn.functional.linear(x, w, b))
    assert "ToCopyBackward0" in theirs  # the check below can see a cast node
    assert "ToCopyBackward0" not in ours and ours.count("AccumulateGrad") == 2
