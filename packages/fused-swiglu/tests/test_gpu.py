"""Compiled on a GPU at real sizes: odd dims (d_model 1000, d_intermediate 2730),
the fp16-accumulation bound at a real reduction length, int64 offsets, autocast on CUDA.

Every autotuned kernel runs its last config here (conftest.py pins it; test_every_config.py
runs the others). The int64 tests hold the fewest (M, N) tensors past 2^31 elements that the
computation needs at once: h, g, u in the forward; g, u and the upstream gradient in the backward.
"""

import pytest
import torch
from tritonformer_testkit import FLOAT_DTYPES, assert_close_to_reference, dtype_params, poisoned_allocations

from fused_swiglu import FastAccumFusedSwiGLU, FusedSwiGLU, SwiGLUMLP, swiglu, swiglu_mlp
from fused_swiglu.kernels.backward import _mlp_down_grad_kernel, _mlp_down_grad_tma_kernel
from fused_swiglu.kernels.configs import prune_down_grad
from fused_swiglu.ops import launchers
from fused_swiglu.ops.launchers import launch_forward, use_tma_down_grad, use_tma_forward
from fused_swiglu.reference import ROUNDINGS, swiglu_fp16_accumulate_reference, swiglu_mlp_reference, swiglu_reference


@pytest.mark.gpu(reason="d_model 1000 x d_intermediate 2730 over 4096 rows is too slow for the interpreter")
@pytest.mark.parametrize(
    "function, dtype",
    [*(("FusedSwiGLU", dtype) for dtype in FLOAT_DTYPES), ("FastAccum-fp32acc", torch.float16)],
    ids=["FusedSwiGLU-fp32", "FusedSwiGLU-fp16", "FusedSwiGLU-bf16", "FastAccum-fp32acc-fp16"],
)
def test_odd_real_dims(function, dtype, sw):
    if function == "FusedSwiGLU":
        fn = FusedSwiGLU.apply
    else:
        fn = lambda x, wg, wu: FastAccumFusedSwiGLU.apply(x, wg, wu, False)  # noqa: E731
    inputs = sw.make_inputs((4, 1024), 1000, 2730, dtype, "cuda")
    sw.check_against_reference(fn, swiglu_reference, inputs)


@pytest.mark.gpu(reason="d_model 1000 x d_intermediate 2730 over 4096 rows is too slow for the interpreter")
@pytest.mark.parametrize(
    "bias, dtype",
    [*((False, dtype) for dtype in FLOAT_DTYPES), (True, torch.bfloat16)],
    ids=["no-bias-fp32", "no-bias-fp16", "no-bias-bf16", "bias-bf16"],
)
def test_mlp_odd_real_dims(bias, dtype, sw):
    x, w_gate, w_up, *biases = sw.make_inputs((2, 2048), 1000, 2730, dtype, "cuda", bias)
    w_down = sw.linear_weight(2730, 1000, "cuda", dtype).requires_grad_()
    inputs = [x, w_gate, w_up, w_down]
    if bias:
        inputs += [*biases, (0.5 * torch.randn(1000, device="cuda")).to(dtype).requires_grad_()]
    sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, inputs)


@pytest.mark.gpu(reason="autotuning times several configs, which happens only compiled")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_first_call_tunes_every_candidate_and_stays_correct(dtype, sw, monkeypatch):
    """Every config unpinned and nothing tuned yet: the MLP's first forward+backward times each
    candidate of each kernel on the real tensors. The down-projection backward overwrites g and u
    with d_gate and d_up, so every timed run must start from the saved values (autotune
    restore_value); without that, the gradients are computed from d_gate, d_up taken for g, u.
    bf16 runs the Hopper TMA kernels where they apply, fp32 the pointer kernels."""
    sw.unpin_configs(monkeypatch)
    x, w_gate, w_up = sw.make_inputs((2, 2048), 1000, 2760, dtype, "cuda")
    w_down = sw.linear_weight(2760, 1000, "cuda", dtype).requires_grad_()
    dy_like = torch.empty(4096, 1000, device="cuda", dtype=dtype)
    down = _mlp_down_grad_tma_kernel if use_tma_down_grad(dy_like, w_down) else _mlp_down_grad_kernel
    candidates = prune_down_grad(sw.all_configs[down], {"dy_ptr": dy_like, "M": 4096, "N": 2760})
    assert len(candidates) > 1  # so that the in-place kernel is timed more than once
    sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, [x, w_gate, w_up, w_down])


@pytest.mark.gpu(reason="the skinny tiles are timed against each other only compiled")
@pytest.mark.parametrize("rows", [1, 16])
def test_decode_rows_take_the_skinny_tiles(rows, sw, monkeypatch):
    """A decode step's few rows through a 1.4B model's MLP (2048 -> 5632 -> 2048), every config
    unpinned: the forward times only the 16-row tiles of the pointer kernel (the TMA kernel's are 64
    rows tall), and forward and backward match the reference."""
    sw.unpin_configs(monkeypatch)
    x, w_gate, w_up = sw.make_inputs((rows,), 2048, 5632, torch.bfloat16, "cuda")
    w_down = sw.linear_weight(5632, 2048, "cuda", torch.bfloat16).requires_grad_()
    sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, [x, w_gate, w_up, w_down])
    forwards = launchers.FORWARD.entries()  # unpinning started a fresh table: this test's forwards
    assert forwards and all(entry.config.kwargs["BLOCK_M"] == 16 for entry in forwards)
    assert not launchers.FORWARD_TMA.entries()


@pytest.mark.gpu(
    reason="the fp16-accumulation bound at a real reduction length (d_model 2048) needs the GPU's fp16 MMA"
)
def test_fp16_accumulation_bound_at_real_size(sw):
    x, w_gate, w_up = sw.make_inputs((512,), 2048, 2730, torch.float16, "cuda")
    with poisoned_allocations():
        h, grads, dh = sw.outputs_and_grads(lambda *a: FastAccumFusedSwiGLU.apply(*a, True), [x, w_gate, w_up])
    y_ref, grads_ref, _ = sw.outputs_and_grads(
        swiglu_reference, sw.detached([x, w_gate, w_up], torch.float64), dh.double()
    )
    twins = [swiglu_fp16_accumulate_reference(x.detach(), w_gate.detach(), w_up.detach(), dh, r) for r in ROUNDINGS]
    for i, (name, ours, expected) in enumerate(zip(("h", "dx", "dw_gate", "dw_up"), (h, *grads), (y_ref, *grads_ref))):
        expected = expected.detach()
        worst = max((twin[i] for twin in twins), key=lambda t: float((t.double() - expected).abs().max()))
        assert_close_to_reference(ours, expected, worst, name=name)


@pytest.mark.gpu(reason="h, g and u of 800,000 x 2730 (past 2^31 elements) need 13 GB of GPU memory")
def test_int64_offsets_past_2_31_elements(sw):
    """Rows past element 2^31: h and dx there, and weight gradients that only those rows feed.

    Only the last `tail` rows of h reach the loss (a copy of them), so h itself is freed after
    the forward and its gradient is zero elsewhere: the backward holds g, u and that gradient."""
    rows, d_model, d_inter, tail = 800_000, 64, 2730, 64
    assert rows * d_inter > 2**31
    x, w_gate, w_up = sw.make_inputs((rows,), d_model, d_inter, torch.bfloat16, "cuda")
    h = swiglu(x, w_gate, w_up)
    h_tail = h[-tail:].clone()
    del h
    dh_tail = torch.randn_like(h_tail)
    dx, dw_gate, dw_up = torch.autograd.grad(h_tail, (x, w_gate, w_up), dh_tail)
    check = [x.detach()[-tail:].requires_grad_(), w_gate.detach().requires_grad_(), w_up.detach().requires_grad_()]
    y_ref, grads_ref, _ = sw.outputs_and_grads(swiglu_reference, sw.detached(check, torch.float64), dh_tail.double())
    y_low, grads_low, _ = sw.outputs_and_grads(swiglu_reference, sw.detached(check), dh_tail)
    assert_close_to_reference(h_tail, y_ref, y_low, name="h")
    for name, ours, ref, low in zip(("dx", "dw_gate", "dw_up"), (dx[-tail:], dw_gate, dw_up), grads_ref, grads_low):
        assert_close_to_reference(ours, ref, low, name=name)
    assert not dx[:-tail].any(), "dx must be zero where dh is"


@pytest.mark.gpu(reason="g, u and h of 800,000 x 2730 (past 2^31 elements) need 13 GB of GPU memory")
def test_mlp_int64_offsets_past_2_31_elements(sw):
    """The MLP keeps only x, g, u between forward and backward; its backward rebuilds h (13 GB in all)."""
    rows, d_model, d_inter, tail = 800_000, 64, 2730, 64
    x, w_gate, w_up = sw.make_inputs((rows,), d_model, d_inter, torch.bfloat16, "cuda")
    w_down = sw.linear_weight(d_inter, d_model, "cuda", torch.bfloat16).requires_grad_()
    y = swiglu_mlp(x, w_gate, w_up, w_down)
    y_tail = y[-tail:].clone()
    del y
    dy_tail = torch.randn_like(y_tail)
    grads = torch.autograd.grad(y_tail, (x, w_gate, w_up, w_down), dy_tail)
    check = [x.detach()[-tail:].requires_grad_()] + [w.detach().requires_grad_() for w in (w_gate, w_up, w_down)]
    ref = sw.detached(check, torch.float64)
    y_ref, grads_ref, _ = sw.outputs_and_grads(swiglu_mlp_reference, ref, dy_tail.double())
    y_low, grads_low, _ = sw.outputs_and_grads(swiglu_mlp_reference, sw.detached(check), dy_tail)
    assert_close_to_reference(y_tail, y_ref, y_low, name="y")
    ours = (grads[0][-tail:], *grads[1:])
    for name, g, ref, low in zip(("dx", "dw_gate", "dw_up", "dw_down"), ours, grads_ref, grads_low):
        assert_close_to_reference(g, ref, low, name=name)
    assert not grads[0][:-tail].any(), "dx must be zero where dy is"


@pytest.mark.gpu(reason="autocast runs on CUDA")
def test_autocast_with_fp32_parameters():
    module = SwiGLUMLP(256, 704).cuda()
    x = torch.randn(4, 64, 256, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = module(x)
    assert y.dtype == torch.bfloat16
    y.float().square().mean().backward()
    assert x.grad.dtype == torch.float32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in module.parameters())


@pytest.mark.gpu(reason="the TMA forward runs compiled on sm_90")
@pytest.mark.parametrize("dtype", dtype_params((torch.bfloat16, torch.float16)))
def test_tma_and_pointer_forward_kernels_agree_with_the_reference(dtype, sw):
    x, w_gate, w_up, b_gate, b_up = (t.detach() for t in sw.make_inputs((1000,), 1024, 2816, dtype, "cuda", True))
    if not use_tma_forward(x, w_gate, w_up):
        pytest.skip("the TMA forward is not chosen on this GPU / Triton (it needs sm_90 and Triton >= 3.4)")
    expected = swiglu_reference(*(t.double() for t in (x, w_gate, w_up, b_gate, b_up)))
    low = swiglu_reference(x, w_gate, w_up, b_gate, b_up)
    for tma in (True, False):
        with poisoned_allocations():
            h, g, u = (torch.empty(1000, 2816, device="cuda", dtype=dtype) for _ in range(3))
        launch_forward(x, w_gate, w_up, b_gate, b_up, h, g, u, True, False, tma)
        assert_close_to_reference(h, expected, low, name=f"h ({'TMA' if tma else 'pointer'} kernel)")
