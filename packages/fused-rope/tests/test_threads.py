"""Concurrent calls from several threads, each its own shape: plans are immutable values published
whole by functools.lru_cache (two threads that build the same plan each get a complete one), each
Launch keeps its compiled kernels by whole entries, so every call gets its own correct result.

Under the interpreter, Triton keeps the running program's id and its patched `triton.language` in
process-wide state, so two interpreted kernels cannot overlap: the test kit's fixture
`one_interpreted_kernel_at_a_time` runs kernel bodies one at a time while everything around them
(checks, plan building, allocation, launch assembly) runs concurrently.
"""

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, run_in_threads

from fused_rope import apply_rotary_pos_emb, apply_rotary_qk
from fused_rope.ops import rope as rope_ops
from fused_rope.ops import rope_qk as rope_qk_ops
from fused_rope.reference import apply_rotary_pos_emb_reference, rotary_qk_reference

pytestmark = pytest.mark.kernels


def _qk_call(batch, q_heads, k_heads, seq_len, head_dim, d2, inplace, device):
    """A call of apply_rotary_qk and its reference, as (run, reference): each returns the outputs
    and the gradients of q and k."""
    q = torch.randn(batch, seq_len, q_heads, head_dim, device=device).transpose(1, 2)
    k = torch.randn(batch, seq_len, k_heads, head_dim, device=device).transpose(1, 2)
    angles = torch.rand(1, seq_len, d2, device=device) * 20
    cos, sin = angles.cos(), angles.sin()
    dq, dk = torch.randn_like(q), torch.randn_like(k)

    def run(fn, dtype=torch.float32):
        q_in, k_in = q.to(dtype).requires_grad_(True), k.to(dtype).requires_grad_(True)
        if inplace and fn is apply_rotary_qk:
            q_out, k_out = fn(q_in * 1, k_in * 1, cos, sin, inplace=True)
        else:
            q_out, k_out = fn(q_in, k_in, cos.to(dtype), sin.to(dtype))
        grads = torch.autograd.grad((q_out, k_out), (q_in, k_in), (dq.to(dtype), dk.to(dtype)))
        return (q_out.detach(), k_out.detach(), *grads)

    return lambda: run(apply_rotary_qk), lambda: (run(rotary_qk_reference, torch.float64), run(rotary_qk_reference))


def _te_call(tensor_format, shape, d2, interleaved, device, cu=None):
    t = torch.randn(shape, device=device)
    freqs = torch.rand(shape[0] if tensor_format != "bshd" else shape[1], 1, 1, d2, device=device) * 20
    cu_seqlens = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)
    dy = torch.randn(shape, device=device)

    def run(fn, dtype=torch.float32):
        t_in = t.to(dtype).requires_grad_(True)
        y = fn(t_in, freqs.to(dtype), tensor_format, interleaved, cu_seqlens)
        return (y.detach(), *torch.autograd.grad(y, t_in, dy.to(dtype)))

    return lambda: run(apply_rotary_pos_emb), lambda: (
        run(apply_rotary_pos_emb_reference, torch.float64),
        run(apply_rotary_pos_emb_reference),
    )


@pytest.mark.usefixtures("one_interpreted_kernel_at_a_time")
def test_threads_with_different_shapes_all_get_their_results(device):
    """Five threads released together, each its own op and shape (new plans, built concurrently),
    forward and backward twice (the second call reuses the plans the first published)."""
    rope_ops._plan.cache_clear()
    rope_qk_ops._plan.cache_clear()
    calls = [
        _qk_call(2, 4, 2, 5, 16, 16, False, device),
        _qk_call(1, 3, 1, 7, 24, 16, False, device),
        _qk_call(2, 2, 2, 3, 16, 8, True, device),
        _te_call("sbhd", (6, 2, 3, 16), 12, True, device),
        _te_call("thd", (7, 2, 16), 16, False, device, cu=[0, 3, 7]),
    ]
    results = [None] * len(calls)

    def work(i):
        run = calls[i][0]
        first = run()
        results[i] = (first, run())

    assert run_in_threads(work, len(calls)) == [None] * len(calls)
    for (_, reference), (first, second) in zip(calls, results):
        refs, twins = reference()
        for index, (got, again, ref, twin) in enumerate(zip(first, second, refs, twins)):
            assert_close_to_reference(got, ref, twin, name=f"output {index}")
            assert torch.equal(got, again)
