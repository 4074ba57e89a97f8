"""What a call does on the host: one cached plan per layout, its outputs allocated, one launch.

The kernels read their inputs in any layout, so a gradient arrives at the backward as it is: the
stride-0 gradient of `.sum().backward()` is read in place, never copied (a copy would be a kernel
and an allocation the size of the gradient). Launches are recorded instead of run here: the
operators a call dispatches (allocations, copies) are what is counted.
"""

import pytest
import torch
from tritonformer_testkit.host import DispatchedOperators, is_allocation, record_launches

from fused_rope import apply_rotary_pos_emb, apply_rotary_qk
from fused_rope._runtime.launch import Launch
from fused_rope.ops import rope as rope_ops
from fused_rope.ops import rope_qk as rope_qk_ops

pytestmark = pytest.mark.kernels


@pytest.fixture
def launches(monkeypatch):
    """Launches recorded as (Launch, per-call arguments), not run."""
    return record_launches(monkeypatch, Launch)


def test_qk_backward_of_a_sum_is_one_launch_on_the_expanded_gradients(launches, device):
    q = torch.randn(2, 4, 8, 16, device=device, requires_grad=True)
    k = torch.randn(2, 2, 8, 16, device=device, requires_grad=True)
    cos, sin = torch.randn(1, 8, 16, device=device), torch.randn(1, 8, 16, device=device)
    q_out, k_out = apply_rotary_qk(q, k, cos, sin)
    one = torch.ones((), device=device)
    dq_out, dk_out = one.expand(q_out.shape), one.expand(k_out.shape)  # what (q_out.sum() + k_out.sum()) hands back
    torch.autograd.grad((q_out, k_out), (q, k), (dq_out, dk_out), retain_graph=True)  # builds the plan
    launches.clear()
    with DispatchedOperators() as operators:
        dq, dk = torch.autograd.grad((q_out, k_out), (q, k), (dq_out, dk_out))
    assert len(launches) == 1
    args = launches[0][1]
    assert args[0].stride() == args[1].stride() == (0, 0, 0, 0)  # the gradients themselves, not copies
    assert args[5] is dq and args[6] is dk
    assert [name for name in operators.names if not is_allocation(name)] == [], operators.names
    assert len(operators.names) == 2  # dq and dk
    assert dq.is_contiguous() and dk.is_contiguous()  # output_like of a stride-0 gradient


def test_te_backward_of_a_sum_is_one_launch_on_the_expanded_gradient(launches, device):
    t = torch.randn(8, 2, 3, 16, device=device, requires_grad=True)
    y = apply_rotary_pos_emb(t, torch.randn(8, 1, 1, 12, device=device), "sbhd", True)
    dy = torch.ones((), device=device).expand(y.shape)
    torch.autograd.grad(y, t, dy, retain_graph=True)  # builds the plan
    launches.clear()
    with DispatchedOperators() as operators:
        (dt,) = torch.autograd.grad(y, t, dy)
    assert len(launches) == 1 and launches[0][1][0].stride() == (0, 0, 0, 0) and launches[0][1][2] is dt
    assert len(operators.names) == 1 and is_allocation(operators.names[0]), operators.names


def test_calls_with_one_layout_share_one_plan_and_launch(launches, device):
    """The plan is keyed on the layouts: a second call with new tensors of the same shapes, strides
    and dtypes reuses it (and its Launch); other strides get their own."""
    rope_qk_ops._plan.cache_clear()
    cos, sin = torch.randn(6, 16, device=device), torch.randn(6, 16, device=device)
    for _ in range(2):
        apply_rotary_qk(torch.randn(1, 3, 6, 16, device=device), torch.randn(1, 1, 6, 16, device=device), cos, sin)
    assert rope_qk_ops._plan.cache_info().currsize == 1 and launches[0][0] is launches[1][0]
    q = torch.randn(1, 6, 3, 16, device=device).transpose(1, 2)
    apply_rotary_qk(q, torch.randn(1, 1, 6, 16, device=device), cos, sin)
    assert rope_qk_ops._plan.cache_info().currsize == 2 and launches[2][0] is not launches[0][0]


@pytest.mark.parametrize(
    "make_q",
    [
        lambda d: torch.randn(2, 5, 3, 16, device=d).transpose(1, 2),  # dense, transposed: output alike
        lambda d: torch.randn(2, 5, 9, 16, device=d)[:, :, :3].transpose(1, 2),  # a slice of a fused qkv
        lambda d: torch.randn(2, 3, 5, 32, device=d)[..., ::2],  # strided columns: a contiguous output
        lambda d: torch.randn(1, 3, 1, 16, device=d).expand(2, 3, 5, 16),  # expanded: a contiguous output
    ],
)  # fmt: skip
def test_inputs_are_read_in_their_layout(make_q, device, rope_checks):
    """Forward and backward of q in these layouts (the outputs' strides, fixed in the plan, are
    output_like's, as the custom operator's fake implementation says)."""
    q = make_q(device)
    k = torch.randn(2, 1, 5, 16, device=device)
    cos, sin = torch.randn(5, 16, device=device), torch.randn(5, 16, device=device)
    q_out, _, _, _ = rope_checks.check_rope_qk(q, k, cos, sin)
    assert q_out.stride() == rope_qk_ops.output_like(q).stride()


def test_te_plans_are_per_direction(launches, device):
    """The forward and the backward of one layout are two plans (the direction is fixed in each)."""
    rope_ops._plan.cache_clear()
    t = torch.randn(4, 2, 3, 16, device=device, requires_grad=True)
    y = apply_rotary_pos_emb(t, torch.randn(4, 1, 1, 16, device=device))
    torch.autograd.grad(y, t, torch.randn_like(y))
    assert rope_ops._plan.cache_info().currsize == 2 and launches[0][0] is not launches[1][0]
