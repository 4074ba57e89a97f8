"""Launches after the first go straight to the compiled kernel (Triton 3.4-3.9), and stay right.

Each call looks up the plan of its layouts (a Launch with its grid and arguments fixed); the
Launch keeps the compiled kernel of its first launch under a key that must separate every call
the JIT would compile differently: here a misaligned view (its data pointer off the 16-byte
grid) and a different dtype. A launch hook (a profiler) sends launches back through the JIT.
"""

import pytest
import torch

from fused_rope import apply_rotary_qk
from fused_rope._runtime.launch import DIRECT_LAUNCH, Launch
from fused_rope.ops import rope as rope_ops
from fused_rope.ops import rope_qk as rope_qk_ops

pytestmark = pytest.mark.gpu(reason="direct launches exist only for compiled kernels")


@pytest.fixture
def launches(monkeypatch):
    """The Launch objects called, in call order (each still launches)."""
    called = []
    launch = Launch.__call__

    def record(self, *args):
        called.append(self)
        return launch(self, *args)

    monkeypatch.setattr(Launch, "__call__", record)
    return called


def qk_inputs(dtype, offset=0):
    """q, k (2, 4, 64, 64) views of a buffer, starting `offset` elements in; cos, sin (64, 64)."""
    buffer = torch.randn(offset + 2 * 64 * 8 * 64, device="cuda", dtype=dtype)
    qk = buffer[offset:].view(2, 64, 8, 64).transpose(1, 2)
    angles = torch.rand(64, 64, device="cuda") * 40
    return qk[:, :4], qk[:, 4:], angles.cos(), angles.sin()


def test_repeated_calls_reuse_the_compiled_kernel_and_match_the_jit(launches, rope_checks):
    rope_qk_ops._plan.cache_clear()
    q, k, cos, sin = qk_inputs(torch.bfloat16)
    first = apply_rotary_qk(q, k, cos, sin)  # through the JIT
    second = apply_rotary_qk(q, k, cos, sin)  # directly, where allowed
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert len(launches) == 2 and launches[0] is launches[1]  # one plan, one Launch
    assert len(launches[0]._compiled) == (1 if DIRECT_LAUNCH else 0)
    rope_checks.check_rope_qk(q, k, cos, sin)  # forward and backward, against the reference


def test_misaligned_views_and_other_dtypes_get_their_own_kernels(launches, rope_checks):
    cases = ((torch.bfloat16, 0), (torch.bfloat16, 1), (torch.float16, 0), (torch.bfloat16, 8))
    for dtype, offset in cases:
        for _ in range(2):  # the JIT's launch, then the direct one
            rope_checks.check_rope_qk(*qk_inputs(dtype, offset))
    rope_qk_ops._plan.cache_clear()
    launches.clear()
    for dtype, offset in cases:
        apply_rotary_qk(*qk_inputs(dtype, offset))  # forwards alone
    distinct = list({id(launch): launch for launch in launches}.values())
    assert len(distinct) == 2  # a plan per dtype (the layouts are the same)
    if DIRECT_LAUNCH:
        # offsets 0 and 8 elements (16 bytes) share a specialization; offset 1 and fp16 do not
        assert sum(len(launch._compiled) for launch in distinct) == 3


def test_te_style_launches_repeat_correctly(launches, rope_checks):
    rope_ops._plan.cache_clear()
    t = torch.randn(64, 2, 4, 64, device="cuda", dtype=torch.bfloat16)
    freqs = rope_checks.make_freqs(70, 64, "cuda")
    for _ in range(3):
        rope_checks.check_rope(t, freqs)
    forward, backward = launches[0], launches[1]
    assert launches == [forward, backward] * 3 and forward is not backward  # the direction is fixed per plan
    if DIRECT_LAUNCH:
        assert len(forward._compiled) == len(backward._compiled) == 1


@pytest.mark.skipif(not DIRECT_LAUNCH, reason="direct launches need Triton 3.4-3.9")
def test_a_launch_hook_sends_launches_through_the_jit():
    import triton

    q, k, cos, sin = qk_inputs(torch.bfloat16)
    want = apply_rotary_qk(q, k, cos, sin)
    seen = []
    runtime = triton.knobs.runtime
    runtime.launch_enter_hook = seen.append
    try:
        got = apply_rotary_qk(q, k, cos, sin)
    finally:
        runtime.launch_enter_hook = None
    assert len(seen) == 1
    assert all(torch.equal(a, b) for a, b in zip(want, got))
