"""Launches after the first go straight to the compiled kernel (Triton 3.4-3.9), and stay right.

The key under which a config and its compiled kernel are reused must separate every call that the
JIT would compile differently or the autotuner would tune again: a misaligned operand, another
dtype, another shape. A replaced config list (the tests' pinning) and a launch hook (a profiler)
send launches back through the autotuner and the JIT.
"""

import pytest
import torch

from fused_swiglu import _compat, swiglu_mlp
from fused_swiglu.ops import launchers
from fused_swiglu.reference import swiglu_mlp_reference

pytestmark = pytest.mark.gpu(reason="direct launches exist only for compiled kernels")

TUNED = (
    launchers.FORWARD,
    launchers.FORWARD_TMA,
    launchers.DOWN_GRAD,
    launchers.DOWN_GRAD_TMA,
    launchers.INPUT_GRAD,
    launchers.INPUT_GRAD_TMA,
    launchers.WEIGHT_GRAD,
    launchers.WEIGHT_GRAD_TMA,
)


def _clear():
    for launches in TUNED:
        launches.entries.clear()


def _inputs(dtype, rows=300, d_model=128, d_inter=384, offset=0):
    """MLP operands; x starts `offset` elements into its buffer (offset 1: not 16-byte aligned)."""
    buffer = torch.randn(offset + rows * d_model, device="cuda", dtype=dtype)
    x = buffer[offset:].view(rows, d_model).requires_grad_()
    scale = d_model**-0.5
    weights = [
        (torch.randn(*shape, device="cuda", dtype=dtype) * scale).requires_grad_()
        for shape in ((d_model, d_inter), (d_model, d_inter), (d_inter, d_model))
    ]
    return [x, *weights]


def _fwd_bwd(inputs, dy):
    y = swiglu_mlp(*inputs)
    return (y, *torch.autograd.grad(y, inputs, dy))


def test_repeated_calls_reuse_the_tuned_kernels_and_match_the_first(sw):
    _clear()
    inputs = _inputs(torch.bfloat16)
    dy = torch.randn(300, 128, device="cuda", dtype=torch.bfloat16)
    first = _fwd_bwd(inputs, dy)  # through the autotuner and the JIT
    kept = {id(launches): len(launches.entries) for launches in TUNED}
    second = _fwd_bwd(inputs, dy)  # directly, where allowed
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    if _compat.DIRECT_LAUNCH:
        # forward (TMA or pointer), the down-projection backward, the input and weight gradients
        assert sum(kept.values()) == 4
        assert {id(launches): len(launches.entries) for launches in TUNED} == kept  # nothing new
    else:
        assert sum(kept.values()) == 0
    sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, inputs)


def test_misaligned_operands_other_dtypes_and_shapes_get_their_own_entries(sw):
    cases = ((torch.bfloat16, 300, 0), (torch.bfloat16, 300, 1), (torch.float16, 300, 0), (torch.bfloat16, 301, 0))
    for dtype, rows, offset in cases:
        for _ in range(2):  # through the JIT, then directly
            sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, _inputs(dtype, rows=rows, offset=offset))
    _clear()
    with torch.no_grad():
        for dtype, rows, offset in cases:
            swiglu_mlp(*_inputs(dtype, rows=rows, offset=offset))
    if _compat.DIRECT_LAUNCH:
        forward_entries = len(launchers.FORWARD.entries) + len(launchers.FORWARD_TMA.entries)
        assert forward_entries == len(cases)


@pytest.mark.skipif(not _compat.DIRECT_LAUNCH, reason="direct launches need Triton 3.4-3.9")
def test_a_replaced_config_list_is_tuned_again(monkeypatch, sw):
    _clear()
    inputs = _inputs(torch.bfloat16)
    with torch.no_grad():
        swiglu_mlp(*inputs)
        swiglu_mlp(*inputs)
        launches = launchers.FORWARD_TMA if launchers.FORWARD_TMA.entries else launchers.FORWARD
        (before,) = launches.entries.values()
        monkeypatch.setattr(launches.tuner, "configs", list(launches.tuner.configs[:1]))
        swiglu_mlp(*inputs)
        (after,) = launches.entries.values()
    assert before[0] is not launches.tuner.configs and after[0] is launches.tuner.configs
    sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, inputs)


@pytest.mark.skipif(not _compat.DIRECT_LAUNCH, reason="direct launches need Triton 3.4-3.9")
def test_a_launch_hook_sends_launches_through_the_jit():
    import triton

    inputs = _inputs(torch.bfloat16)
    with torch.no_grad():
        want = swiglu_mlp(*inputs)
        seen = []
        runtime = triton.knobs.runtime
        runtime.launch_enter_hook = seen.append
        try:
            got = swiglu_mlp(*inputs)
        finally:
            runtime.launch_enter_hook = None
    assert len(seen) == 1  # the fused forward (the down projection is cuBLAS)
    assert torch.equal(want, got)
