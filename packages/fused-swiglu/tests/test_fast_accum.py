"""FastAccumFusedSwiGLU with fp16 accumulation, against its stated bound.

The bound is the project's rule with a modelled twin in place of PyTorch's (PyTorch has no
fp16-accumulating matmul): `reference.swiglu_fp16_accumulate_reference` accumulates each
16-wide k-chunk exactly and rounds it into an fp16 accumulator (tensor-core behaviour), once
rounding to nearest and once toward zero; the kernel's error against the float64 reference
must stay within 2x the larger of the two twins' errors plus the fp16 atol, for h, dx and the
weight gradients. The twins' errors are measured on the same inputs, so the bound follows the
shape (longer reductions, larger errors) instead of being a guessed constant.

Under the interpreter the arithmetic is known exactly: it rounds the fp16 accumulator to nearest
once per 16-wide k-step (the interpreter's tile), which is the round-to-nearest twin, so only
that (tighter) twin bounds it there; compiled on a GPU, whose rounding mode is not documented,
the larger of the two does.
"""

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, interpreting, poisoned_allocations

from fused_swiglu import FastAccumFusedSwiGLU
from fused_swiglu.reference import ROUNDINGS, swiglu_fp16_accumulate_reference, swiglu_reference

pytestmark = pytest.mark.kernels


def _fast_accum(x, w_gate, w_up):
    return FastAccumFusedSwiGLU.apply(x, w_gate, w_up, True)


def check_fp16_accumulation_bound(leading, d_model, d_inter, device, sw):
    x, w_gate, w_up = sw.make_inputs(leading, d_model, d_inter, torch.float16, device)
    with poisoned_allocations():
        h, grads, dh = sw.outputs_and_grads(_fast_accum, [x, w_gate, w_up])
    ours = (h, *grads)
    ref = sw.outputs_and_grads(swiglu_reference, sw.detached([x, w_gate, w_up], torch.float64), dh.double())
    ref = (ref[0], *ref[1])
    flat = [t.detach().reshape(-1, t.shape[-1]) for t in (x, w_gate, w_up, dh)]
    roundings = ("nearest",) if interpreting() else ROUNDINGS
    twins = [swiglu_fp16_accumulate_reference(*flat, rounding) for rounding in roundings]
    for i, name in enumerate(("h", "dx", "dw_gate", "dw_up")):
        expected = ref[i].detach().reshape(-1, ref[i].shape[-1])
        worst = max((twin[i] for twin in twins), key=lambda t: float((t.double() - expected).abs().max()))
        assert_close_to_reference(ours[i].reshape(expected.shape), expected, worst, name=name)
    return ours, ref


@pytest.mark.parametrize("leading, d_model, d_inter", [((37,), 200, 90), ((2, 9), 256, 64)], ids=str)
def test_fp16_accumulation_within_the_modelled_bound(leading, d_model, d_inter, device, sw):
    check_fp16_accumulation_bound(leading, d_model, d_inter, device, sw)


def test_fp16_accumulation_is_really_used(device, sw):
    """Accumulating in fp16 must cost precision against accumulating in fp32 on the same inputs:
    if it did not, the fast path would not be taken and the bound test would prove nothing."""
    x, w_gate, w_up = sw.make_inputs((64,), 512, 64, torch.float16, device)
    ref = swiglu_reference(*sw.detached([x, w_gate, w_up], torch.float64)).detach()
    errors = {}
    for fp16_accumulate in (False, True):
        h = FastAccumFusedSwiGLU.apply(x.detach(), w_gate.detach(), w_up.detach(), fp16_accumulate)
        errors[fp16_accumulate] = float((h.double() - ref).abs().mean())
    assert errors[True] > 1.5 * errors[False], errors
