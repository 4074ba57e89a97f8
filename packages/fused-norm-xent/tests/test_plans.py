"""The launch plans of the norms and softmax: one cached lookup per call, and concurrent calls from
several threads (each building and sharing plans) all get correct results."""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import assert_close_to_reference, run_in_threads

import fused_norm_xent as nx
from fused_norm_xent.ops import norm as norm_ops
from fused_norm_xent.ops import softmax as softmax_ops

pytestmark = pytest.mark.kernels


def _lookups(*plan_fns):
    return [fn.cache_info().hits + fn.cache_info().misses for fn in plan_fns]


@pytest.mark.parametrize(
    "call",
    [
        lambda x, w: nx.rms_norm(x, x.shape[-1], w),
        lambda x, w: nx.layer_norm(x, [x.shape[-1]], w, w),
        lambda x, w: nx.add_dropout_norm(x, x, w, None, 0.5, seed=3)[1],
    ],
    ids=["rms_norm", "layer_norm", "add_dropout_norm"],
)
def test_norms_look_up_one_plan_per_forward_and_per_backward(call, device):
    x = torch.randn(6, 24, device=device, requires_grad=True)
    w = torch.randn(24, device=device, requires_grad=True)
    call(x, w).sum().backward()  # builds the plans
    before = _lookups(norm_ops._forward_plan, norm_ops._backward_plan)
    y = call(x, w)
    assert _lookups(norm_ops._forward_plan, norm_ops._backward_plan) == [before[0] + 1, before[1]]
    y.sum().backward()
    assert _lookups(norm_ops._forward_plan, norm_ops._backward_plan) == [before[0] + 1, before[1] + 1]


def test_softmax_looks_up_one_plan_per_forward_and_per_backward(device):
    x = torch.randn(5, 7, 3, device=device, requires_grad=True)
    nx.softmax(x, 1).sum().backward()
    before = _lookups(softmax_ops._forward_plan, softmax_ops._backward_plan)
    y = nx.softmax(x, 1)
    assert _lookups(softmax_ops._forward_plan, softmax_ops._backward_plan) == [before[0] + 1, before[1]]
    y.backward(torch.randn_like(y))
    assert _lookups(softmax_ops._forward_plan, softmax_ops._backward_plan) == [before[0] + 1, before[1] + 1]


def _norm_case(n_rows, n_cols, device):
    x = torch.randn(n_rows, n_cols, device=device, requires_grad=True)
    w = torch.randn(n_cols, device=device, requires_grad=True)
    b = torch.randn(n_cols, device=device, requires_grad=True)
    dy = torch.randn(n_rows, n_cols, device=device)

    def ours():
        y = nx.layer_norm(x, n_cols, w, b)
        return (y, *torch.autograd.grad(y, (x, w, b), dy))

    def expected():
        x64, w64, b64 = (t.detach().double().requires_grad_(True) for t in (x, w, b))
        y = F.layer_norm(x64, (n_cols,), w64, b64)
        return (y, *torch.autograd.grad(y, (x64, w64, b64), dy.double()))

    return ours, expected


def _softmax_case(n_rows, n_cols, device):
    x = torch.randn(n_cols, n_rows, device=device, requires_grad=True)
    dy = torch.randn(n_cols, n_rows, device=device)

    def ours():
        y = nx.log_softmax(x, 0)
        return (y, *torch.autograd.grad(y, x, dy))

    def expected():
        x64 = x.detach().double().requires_grad_(True)
        y = torch.log_softmax(x64, 0)
        return (y, *torch.autograd.grad(y, x64, dy.double()))

    return ours, expected


@pytest.mark.usefixtures("one_interpreted_kernel_at_a_time")
def test_concurrent_calls_with_different_shapes_are_correct(device):
    """Threads start together on empty plan caches, each with its own shapes (distinct plans and
    kernel specializations, some shared between threads), forward and backward, several times."""
    norm_ops._forward_plan.cache_clear()
    norm_ops._backward_plan.cache_clear()
    softmax_ops._forward_plan.cache_clear()
    softmax_ops._backward_plan.cache_clear()
    cases = [_norm_case(3, 40, device), _norm_case(9, 40, device), _norm_case(1, 130, device),
             _softmax_case(4, 33, device), _softmax_case(7, 33, device), _softmax_case(2, 5, device)]  # fmt: skip
    results = {}

    def work(index):
        results[index] = [cases[index][0]() for _ in range(3)]

    errors = run_in_threads(work, len(cases))
    assert errors == [None] * len(cases), errors
    for index, (_, expected) in enumerate(cases):
        reference = expected()
        for run in results[index]:
            for name, actual, ref in zip(("y", "dx", "dw", "db"), run, reference):
                assert_close_to_reference(actual, ref, None, name=f"case {index} {name}")
