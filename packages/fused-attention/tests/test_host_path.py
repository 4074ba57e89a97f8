"""What a call does on the host: one cached plan per argument combination, the outputs (and what
the backward needs) allocated, one launch per kernel, nothing read back from the device.

Launches are recorded instead of run here: the operators a call dispatches (allocations, copies,
reads of device values) are what is counted.
"""

import pytest
import torch
from tritonformer_testkit.host import DispatchedOperators, is_allocation, record_launches

from fused_attention import flash_attention, flash_attention_qkvpacked, flash_attention_varlen
from fused_attention._runtime.launch import Launch
from fused_attention.ops import attention as attention_ops
from fused_attention.ops import launch as launch_ops

pytestmark = pytest.mark.kernels

BF16 = torch.bfloat16


@pytest.fixture
def launches(monkeypatch):
    """Launches recorded as (Launch, per-call arguments), not run."""
    return record_launches(monkeypatch, Launch)


def _allocations(names):
    return [name for name in names if is_allocation(name)]


def _work(names):
    """The operators other than detach (autograd's saved outputs; no data is touched)."""
    return [name for name in names if not name.startswith("detach")]


def _qkv(device, batch=2, seqlen=24, heads=4, kv_heads=2, head_dim=32):
    return [
        torch.randn(batch, seqlen, n, head_dim, device=device).to(BF16).requires_grad_(True)
        for n in (heads, kv_heads, kv_heads)
    ]


def test_forward_allocates_its_outputs_and_launches_once(launches, device):
    q, k, v = _qkv(device)
    flash_attention(q, k, v, causal=True)  # builds the plan
    launches.clear()
    with DispatchedOperators() as operators:
        out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert len(launches) == 1 and launches[0][1][:5] == (q, k, v, out, lse)
    work = _work(operators.names)
    assert work == _allocations(work) and len(work) == 2, operators.names
    assert out.is_contiguous() and out.requires_grad


def test_backward_of_a_sum_copies_the_expanded_gradient_allocates_and_launches(launches, device):
    """The stride-0 gradient of `.sum().backward()` is copied once (the kernels read dO with a
    unit-stride head dim); then dQ, dK, dV and delta are allocated and the three kernels launched."""
    q, k, v = _qkv(device)
    out = flash_attention(q, k, v, causal=True, deterministic=True)
    dout = torch.ones((), device=device, dtype=BF16).expand(out.shape)
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)  # builds the backward plan
    launches.clear()
    with DispatchedOperators() as operators:
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    assert len(launches) == 3
    work = _work(operators.names)
    copies = [name for name in work if name not in _allocations(work)]
    assert len(copies) == 1 and copies[0].startswith("clone"), operators.names
    assert len(_allocations(work)) == 4, operators.names  # dq, dk, dv, delta
    pre, dkdv, dq_kernel = (args for _, args in launches)
    assert pre[1].stride()[-1] == 1 and pre[1].is_contiguous() and dkdv[3] is pre[1]  # one copy of dO, read twice
    assert dkdv[4] is dk and dkdv[5] is dv and dq_kernel[4] is dq


def test_varlen_without_checked_offsets_reads_nothing_back(launches, device):
    """check_seqlens=False: no device value is read (the offsets are read back only when checked)."""
    q, k, v = (torch.randn(30, 2, 32, device=device).to(BF16) for _ in range(3))
    cu = torch.tensor([0, 11, 30], dtype=torch.int32, device=device)
    flash_attention_varlen(q, k, v, cu, cu, 19, 19, check_seqlens=False)
    launches.clear()
    with DispatchedOperators() as operators:
        flash_attention_varlen(q, k, v, cu, cu, 19, 19, check_seqlens=False)
    work = _work(operators.names)
    assert work == _allocations(work) and len(work) == 2, operators.names
    assert len(launches) == 1


def test_packed_forward_and_backward(launches, device):
    """The packed forward launches on views of qkv; its backward allocates one packed gradient
    (and delta) and the kernels write dQ, dK and dV into its views."""
    qkv = torch.randn(2, 24, 6, 32, device=device).to(BF16).requires_grad_(True)
    out = flash_attention_qkvpacked(qkv, causal=True, deterministic=True)
    dout = torch.randn(out.shape, device=device).to(BF16)
    torch.autograd.grad(out, qkv, dout, retain_graph=True)
    launches.clear()
    with DispatchedOperators() as operators:
        flash_attention_qkvpacked(qkv, causal=True, deterministic=True)
        (dqkv,) = torch.autograd.grad(out, qkv, dout)
    assert len(launches) == 4
    work = _work(operators.names)
    views = [name for name in work if name.startswith("split")]
    assert len(views) == 2 and len(_allocations(work)) == 4, operators.names  # out, lse; dqkv, delta
    assert len(work) == 6, operators.names
    dkdv, dq_kernel = launches[2][1], launches[3][1]
    assert dq_kernel[4].data_ptr() == dqkv.data_ptr()
    assert dkdv[4].data_ptr() == dqkv[:, :, 2].data_ptr() and dkdv[5].data_ptr() == dqkv[:, :, 4].data_ptr()


def test_calls_with_one_layout_share_one_plan(launches, device):
    """The plan is keyed on the layouts: new tensors of the same shapes, strides and dtypes reuse it
    (and its Launch); other strides get their own."""
    launch_ops.clear_plans()
    for _ in range(2):
        flash_attention(*_qkv(device), causal=True)
    assert len(attention_ops._DENSE_PLANS) == 1 and launches[0][0] is launches[1][0]
    q, k, v = (t.detach().transpose(1, 2) for t in _qkv(device))
    flash_attention(q, k, v, causal=True, layout="bhsd")  # the same memory seen as (B, H, S, D)
    assert len(attention_ops._DENSE_PLANS) == 2 and launches[2][0] is not launches[0][0]
