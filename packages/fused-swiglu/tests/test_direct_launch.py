"""Tuned launches: the autotuner chooses once per plan; later calls launch the published choice
(on Triton 3.4-3.9 compiled, the compiled kernel directly) and stay right.

A plan must separate every call that the JIT would compile differently or the autotuner would
tune again: a misaligned operand, another dtype, another shape. A replaced config list (the
tests' pinning) is tuned again, and a launch hook (a profiler) sends launches through the JIT.
"""

import pytest
import torch

from fused_swiglu import swiglu_mlp
from fused_swiglu._runtime.launch import DIRECT_LAUNCH
from fused_swiglu.ops import launchers
from fused_swiglu.reference import swiglu_mlp_reference

pytestmark = pytest.mark.gpu(reason="direct launches exist only for compiled kernels")


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


def _tuned():
    return [len(kernel) for kernel in launchers.TUNED_KERNELS]


def test_repeated_calls_reuse_the_tuned_launches_and_match_the_first(sw):
    launchers.clear_plans()
    inputs = _inputs(torch.bfloat16)
    dy = torch.randn(300, 128, device="cuda", dtype=torch.bfloat16)
    first = _fwd_bwd(inputs, dy)  # through the autotuner
    tuned = _tuned()
    second = _fwd_bwd(inputs, dy)  # through the published Launches
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    # forward (TMA or pointer), the down-projection backward, the input and weight gradients
    assert sum(tuned) == 4 and _tuned() == tuned
    if DIRECT_LAUNCH:  # each Launch keeps the compiled kernel it calls directly
        assert all(entry.launch._compiled for kernel in launchers.TUNED_KERNELS for entry in kernel.entries())
    sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, inputs)


def test_misaligned_operands_other_dtypes_and_shapes_get_their_own_plans(sw):
    cases = ((torch.bfloat16, 300, 0), (torch.bfloat16, 300, 1), (torch.float16, 300, 0), (torch.bfloat16, 301, 0))
    for dtype, rows, offset in cases:
        for _ in range(2):  # tuned, then through the published Launch
            sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, _inputs(dtype, rows=rows, offset=offset))
    launchers.clear_plans()
    with torch.no_grad():
        for dtype, rows, offset in cases:
            swiglu_mlp(*_inputs(dtype, rows=rows, offset=offset))
    assert len(launchers.FORWARD) + len(launchers.FORWARD_TMA) == len(cases)


def test_a_replaced_config_list_is_tuned_again(monkeypatch, sw):
    launchers.clear_plans()
    inputs = _inputs(torch.bfloat16)
    with torch.no_grad():
        swiglu_mlp(*inputs)
        swiglu_mlp(*inputs)
        kernel = launchers.FORWARD_TMA if len(launchers.FORWARD_TMA) else launchers.FORWARD
        (before,) = kernel.entries()
        monkeypatch.setattr(kernel.tuner, "configs", list(kernel.tuner.configs[:1]))
        swiglu_mlp(*inputs)
        (after,) = kernel.entries()
    assert after is not before and after.config is kernel.tuner.configs[0]
    sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, inputs)


@pytest.mark.skipif(not DIRECT_LAUNCH, reason="direct launches need Triton 3.4-3.9")
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
