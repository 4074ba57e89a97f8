"""Helpers of this package's tests: run a RoPE entry point, its float64 reference and PyTorch's
low-precision twin on the same inputs, and compare with the project's tolerance rule.

(The shared test kit has no RoPE-specific comparison; these build on its
`assert_close_to_reference` and `poisoned_allocations`.)
"""

from __future__ import annotations

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, poisoned_allocations

from fused_rope import apply_rotary_pos_emb, apply_rotary_qk
from fused_rope.reference import apply_rotary_pos_emb_reference, rotary_qk_reference


def make_freqs(n_positions: int, d2: int, device, dtype=torch.float32) -> torch.Tensor:
    """Angles (n_positions, 1, 1, d2): position * a per-column rate plus noise, so that the two
    members of a pair have different angles (TE allows it; the backward must use each one's
    own) and the angles grow to about n_positions radians (argument reduction is exercised)."""
    rates = torch.rand(d2, device=device)
    positions = torch.arange(n_positions, device=device, dtype=torch.float32)[:, None]
    angles = positions * rates + torch.randn(n_positions, d2, device=device)
    return angles.to(dtype).view(n_positions, 1, 1, d2)


def _grad(y: torch.Tensor, x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    (dx,) = torch.autograd.grad(y, x, dy)
    return dx


def check_rope(t, freqs, tensor_format="sbhd", interleaved=False, cu_seqlens=None, start_positions=None):
    """apply_rotary_pos_emb and its gradient against TE's unfused formula (float64), outputs poisoned."""
    x = t.detach().requires_grad_(True)
    with poisoned_allocations():
        y = apply_rotary_pos_emb(x, freqs, tensor_format, interleaved, cu_seqlens, start_positions)
    assert y.shape == t.shape and y.dtype == t.dtype
    dy = torch.randn_like(y)
    with poisoned_allocations():
        dx = _grad(y, x, dy)
    assert dx.shape == t.shape and dx.dtype == t.dtype

    def reference(x_in, freqs_in, dy_in):
        x_in = x_in.detach().requires_grad_(True)
        y_ref = apply_rotary_pos_emb_reference(x_in, freqs_in, tensor_format, interleaved, cu_seqlens, start_positions)
        return y_ref, _grad(y_ref, x_in, dy_in)

    y_ref, dx_ref = reference(t.double(), freqs.double(), dy.double())
    y_torch, dx_torch = reference(t, freqs, dy)
    assert_close_to_reference(y, y_ref, y_torch, name="y")
    assert_close_to_reference(dx, dx_ref, dx_torch, name="dx")
    return y, dx


def check_rope_qk(q, k, cos, sin, position_ids=None, inplace=False):
    """apply_rotary_qk and its gradients against HF's formula (float64), outputs poisoned.

    In place, q and k are overwritten: the function rotates clones of them (non-leaf tensors
    with q's and k's strides when those are dense), so autograd records the in-place update.
    """
    q_in, k_in = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    with poisoned_allocations():
        if inplace:
            q_run, k_run = q_in.clone(), k_in.clone()
            q_out, k_out = apply_rotary_qk(q_run, k_run, cos, sin, position_ids, inplace=True)
            assert q_out is q_run and k_out is k_run
        else:
            q_out, k_out = apply_rotary_qk(q_in, k_in, cos, sin, position_ids)
    assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == k_out.dtype == q.dtype
    dq_out, dk_out = torch.randn_like(q_out), torch.randn_like(k_out)
    with poisoned_allocations():
        dq, dk = torch.autograd.grad((q_out, k_out), (q_in, k_in), (dq_out, dk_out))

    def reference(q_ref, k_ref, cos_ref, sin_ref, dq_ref, dk_ref):
        q_ref, k_ref = q_ref.detach().requires_grad_(True), k_ref.detach().requires_grad_(True)
        qo, ko = rotary_qk_reference(q_ref, k_ref, cos_ref, sin_ref, position_ids)
        return (qo, ko, *torch.autograd.grad((qo, ko), (q_ref, k_ref), (dq_ref, dk_ref)))

    refs = reference(q.double(), k.double(), cos.double(), sin.double(), dq_out.double(), dk_out.double())
    twins = reference(q, k, cos, sin, dq_out, dk_out)
    for name, actual, ref, twin in zip(("q_out", "k_out", "dq", "dk"), (q_out, k_out, dq, dk), refs, twins):
        assert_close_to_reference(actual, ref, twin, name=name)
    return q_out, k_out, dq, dk


def require_free_gpu_memory(n_bytes: int, what: str) -> None:
    """Skip the calling test, saying what it needs and what the GPU has, unless n_bytes are free
    (the bytes this process's caching allocator holds unused count as free)."""
    free, total = torch.cuda.mem_get_info()
    free += torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    if free < n_bytes:
        pytest.skip(
            f"{what} needs {n_bytes / 2**30:.1f} GiB of GPU memory; {torch.cuda.get_device_name()} has "
            f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f}"
        )


@pytest.fixture
def rope_checks():
    """The helpers above, for the test modules (conftest modules are not importable by name)."""

    class Checks:
        check_rope = staticmethod(check_rope)
        check_rope_qk = staticmethod(check_rope_qk)
        make_freqs = staticmethod(make_freqs)
        require_free_gpu_memory = staticmethod(require_free_gpu_memory)

    return Checks
