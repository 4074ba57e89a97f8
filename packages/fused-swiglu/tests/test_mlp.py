"""swiglu_mlp / FusedSwiGLUMLP (SwiGLU + down projection, fused backward) against the float64 reference."""

import pytest
import torch
import triton
from tritonformer_testkit import (
    assert_close_to_reference,
    assert_rms_close_to_reference,
    dtype_params,
    poisoned_allocations,
)

from fused_swiglu import FusedSwiGLUMLP, _compat, swiglu, swiglu_mlp
from fused_swiglu.kernels.activation import ACTIVATION_CODES
from fused_swiglu.kernels.backward import _mlp_down_grad_kernel, _swiglu_weight_grad_tma_kernel
from fused_swiglu.kernels.configs import weight_grad_split
from fused_swiglu.ops import launchers
from fused_swiglu.reference import swiglu_mlp_reference, swiglu_reference

pytestmark = pytest.mark.kernels


def make_mlp_inputs(sw, leading, d_model, d_inter, dtype, device, bias=False, d_out=None):
    x, w_gate, w_up, *biases = sw.make_inputs(leading, d_model, d_inter, dtype, device, bias)
    w_down = sw.linear_weight(d_inter, d_out or d_model, device, dtype).requires_grad_()
    if not bias:
        return [x, w_gate, w_up, w_down]
    b_down = (0.5 * torch.randn(d_out or d_model, device=device)).to(dtype).requires_grad_()
    return [x, w_gate, w_up, w_down, *biases, b_down]


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize("leading, d_model, d_inter", [((37,), 100, 90), ((2, 3, 5), 48, 80)], ids=str)
def test_forward_and_gradients(leading, d_model, d_inter, dtype, device, sw):
    inputs = make_mlp_inputs(sw, leading, d_model, d_inter, dtype, device)
    y, _ = sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, inputs)
    assert y.shape == (*leading, d_model)


@pytest.mark.parametrize("activation", list(ACTIVATION_CODES))
@pytest.mark.parametrize("dtype", dtype_params())
def test_biases_and_other_output_width(dtype, activation, device, sw):
    inputs = make_mlp_inputs(sw, (2, 17), 40, 72, dtype, device, bias=True, d_out=24)
    ours, reference = (sw.with_activation(fn, activation, 7) for fn in (FusedSwiGLUMLP.apply, swiglu_mlp_reference))
    sw.check_against_reference(ours, reference, inputs)


def test_non_contiguous_input_weights_and_gradient(device, sw):
    x = torch.randn(3, 18, 40, device=device, dtype=torch.bfloat16)[:, ::2].requires_grad_()
    _, w_gate, w_up, _ = make_mlp_inputs(sw, (1,), 40, 56, torch.bfloat16, device)
    w_down = sw.linear_weight(56, 40, device, torch.bfloat16).t().contiguous().t().requires_grad_()
    dy = torch.randn(3, 40, 9, device=device, dtype=torch.bfloat16).transpose(1, 2)
    with_dy = [x, w_gate, w_up, w_down]
    with poisoned_allocations():
        y, grads, _ = sw.outputs_and_grads(swiglu_mlp, with_dy, dy)
    y_ref, grads_ref, _ = sw.outputs_and_grads(swiglu_mlp_reference, sw.detached(with_dy, torch.float64), dy.double())
    y_low, grads_low, _ = sw.outputs_and_grads(swiglu_mlp_reference, sw.detached(with_dy), dy)
    assert_close_to_reference(y, y_ref, y_low, name="y")
    for name, g, g_ref, g_low in zip(("dx", "dw_gate", "dw_up", "dw_down"), grads, grads_ref, grads_low):
        assert_close_to_reference(g, g_ref, g_low, name=name)


@pytest.mark.parametrize("trainable", ["x-only", "w_down-only", "weights-only"])
def test_partial_gradients(trainable, device, sw):
    inputs = make_mlp_inputs(sw, (21,), 32, 48, torch.bfloat16, device)
    for name, t in zip(("x", "w_gate", "w_up", "w_down"), inputs):
        t.requires_grad_(
            {"x-only": name == "x", "w_down-only": name == "w_down", "weights-only": name != "x"}[trainable]
        )
    sw.check_against_reference(swiglu_mlp, swiglu_mlp_reference, inputs)


def test_second_backward_through_the_graph_raises(device, sw):
    y = swiglu_mlp(*make_mlp_inputs(sw, (9,), 16, 16, torch.bfloat16, device))
    y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_autocast_with_fp32_parameters(bias, device, sw, monkeypatch):
    """fp32 inputs under torch.autocast: every gradient in fp32, as close to the float64 reference
    as F.linear's under autocast; those of w_gate, w_up and the biases leave FusedSwiGLUMLP's
    backward in fp32 (written so by the kernels and the sums), w_down's in bf16 (cuBLAS's mm,
    cast by autograd)."""
    returned = sw.returned_grad_dtypes(monkeypatch, FusedSwiGLUMLP)
    inputs = make_mlp_inputs(sw, (2, 11), 40, 48, torch.float32, device, bias=bias, d_out=24)
    sw.check_autocast_against_torch(swiglu_mlp, sw.swiglu_mlp_linear, swiglu_mlp_reference, inputs)
    (dtypes,) = returned
    fp32, biases = torch.float32, [torch.float32] * 3 if bias else [None] * 3
    assert dtypes[1:] == [fp32, fp32, torch.bfloat16, *biases, None], dtypes  # None: the activation's


@pytest.mark.torch_compile
@pytest.mark.parametrize("activation", list(ACTIVATION_CODES))
def test_torch_compile_fullgraph(activation, device, sw):
    inputs = make_mlp_inputs(sw, (2, 11), 32, 40, torch.bfloat16, device, bias=True)
    compiled = torch.compile(sw.with_activation(swiglu_mlp, activation, 7), backend="eager", fullgraph=True)
    sw.check_against_reference(compiled, sw.with_activation(swiglu_mlp_reference, activation, 7), inputs)


@pytest.mark.parametrize("activation", list(ACTIVATION_CODES))
@pytest.mark.parametrize("epilogue", ["row-slices", "one-pass"])
def test_down_projection_epilogue_schedules(epilogue, activation, device, sw, monkeypatch):
    """Both schedules of the SwiGLU epilogue of dh = dy @ w_down^T (configs.py), on the tile of
    the config this run uses: row slices after the main loop, or g and u loaded before it and
    one pass over the tile (EPILOGUE_M == BLOCK_M)."""
    (base,) = _mlp_down_grad_kernel.configs  # pinned (GPU) or the interpreter's one config
    rows = base.kwargs["BLOCK_M"] // (2 if epilogue == "row-slices" else 1)
    config = triton.Config(dict(base.kwargs, EPILOGUE_M=rows), num_warps=base.num_warps, num_stages=base.num_stages)
    monkeypatch.setattr(_mlp_down_grad_kernel, "configs", [config])
    inputs = make_mlp_inputs(sw, (2, 19), 48, 72, torch.bfloat16, device)
    ours, reference = (sw.with_activation(fn, activation, 7) for fn in (swiglu_mlp, swiglu_mlp_reference))
    sw.check_against_reference(ours, reference, inputs)


@pytest.mark.skipif(_compat.TensorDescriptor is None, reason="TMA tensor descriptors need Triton >= 3.4")
@pytest.mark.parametrize(
    "dtype, activation",
    [(torch.bfloat16, "silu"), (torch.float16, "silu"), (torch.bfloat16, "gelu_tanh")],
    ids=["bf16", "fp16", "bf16-gelu_tanh"],
)
def test_tma_backward_kernels(dtype, activation, device, sw, monkeypatch):
    """The Hopper TMA down-projection backward and weight gradients, chosen by force (on the CPU
    through the interpreter's descriptors): 38 rows, d_model 48, intermediate 56 against 32 x 32 x
    16 tiles, so the rows' and the intermediate's edges are zero-padded by the descriptors, the
    epilogue runs in row slices and the weight gradient's last wave splits (checked below)."""
    if device == "cuda" and not _compat.is_hopper(None):
        pytest.skip("the TMA kernels are compiled for sm_90 only")
    (config,) = _swiglu_weight_grad_tma_kernel.configs  # pinned (GPU) or the interpreter's one config
    tiles = triton.cdiv(48, config.kwargs["BLOCK_K"]) * triton.cdiv(56, config.kwargs["BLOCK_N"])
    steps = triton.cdiv(38, config.kwargs["BLOCK_M"])
    assert weight_grad_split(tiles, _compat.multiprocessor_count(torch.device(device)), steps) > 1
    monkeypatch.setattr(launchers, "down_grad_tma_suits", lambda *layout: True)
    monkeypatch.setattr(launchers, "weight_grad_tma_suits", lambda *layout: True)
    launchers.clear_plans()  # plans choose their kernel when built
    try:
        inputs = make_mlp_inputs(sw, (2, 19), 48, 56, dtype, device)
        ours, reference = (sw.with_activation(fn, activation, 7) for fn in (swiglu_mlp, swiglu_mlp_reference))
        sw.check_against_reference(ours, reference, inputs)
        assert len(launchers.DOWN_GRAD_TMA) == 1 and len(launchers.WEIGHT_GRAD_TMA) == 1  # they ran
        assert len(launchers.DOWN_GRAD) == 0 and len(launchers.WEIGHT_GRAD) == 0
    finally:
        launchers.clear_plans()


@pytest.mark.skipif(_compat.TensorDescriptor is None, reason="TMA tensor descriptors need Triton >= 3.4")
@pytest.mark.parametrize("transposed", [False, True], ids=["row-major", "linear-views"])
def test_tma_forward_kernel(transposed, device, sw, monkeypatch):
    """The Hopper TMA forward, chosen by force (on the CPU through the interpreter's descriptors),
    with row-major weights and with nn.Linear weights' transposed views (its descriptors then read
    the (N, K) rows and each tile is transposed): 38 rows, d_model 48, intermediate 56, the edges
    zero-padded by the descriptors."""
    if device == "cuda" and not _compat.is_hopper(None):
        pytest.skip("the TMA kernels are compiled for sm_90 only")
    monkeypatch.setattr(launchers, "HOPPER_TMA", True)
    monkeypatch.setattr(launchers, "is_hopper", lambda index: True)
    launchers.clear_plans()
    try:
        x, w_gate, w_up = sw.make_inputs((2, 19), 48, 56, torch.bfloat16, device)
        if transposed:
            w_gate, w_up = (w.detach().t().contiguous().t().requires_grad_() for w in (w_gate, w_up))
            assert w_gate.stride() == (1, 48)
        sw.check_against_reference(swiglu, swiglu_reference, [x, w_gate, w_up])
        assert len(launchers.FORWARD_TMA) == 1 and len(launchers.FORWARD) == 0  # the TMA kernel ran
    finally:
        launchers.clear_plans()


class _WeightSizedCopies(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the copies (copy_, clone, _to_copy) whose output has `numel` elements."""

    def __init__(self, numel):
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        copies = (torch.ops.aten.copy_.default, torch.ops.aten.clone.default, torch.ops.aten._to_copy.default)
        if func in copies and isinstance(out, torch.Tensor) and out.numel() == self.numel:
            self.count += 1
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_linear_weights_get_their_gradients_in_place(dtype, device, sw):
    """Weights passed as the transposed views of nn.Linear weights (the Hugging Face layout, w.t()):
    values as the reference's, and each Linear's gradient is written in its own layout, so that
    autograd stores it as it comes, with no transposing copy of any weight-sized tensor."""
    d_model, d_inter = 48, 72
    gate, up = (torch.nn.Linear(d_model, d_inter, bias=False, device=device, dtype=dtype) for _ in range(2))
    down = torch.nn.Linear(d_inter, d_model, bias=False, device=device, dtype=dtype)
    x = torch.randn(2, 19, d_model, device=device, dtype=dtype)
    dy = torch.randn(2, 19, d_model, device=device, dtype=dtype)
    linears = (gate, up, down)
    counter = _WeightSizedCopies(d_model * d_inter)
    y = swiglu_mlp(x, *(lin.weight.t() for lin in linears))
    with counter:
        y.backward(dy)
    assert counter.count == 0
    weights = [lin.weight.detach().double().t().requires_grad_() for lin in linears]
    reference = swiglu_mlp_reference(x.double(), *weights)
    grads_ref = torch.autograd.grad(reference, weights, dy.double())
    lowp = [lin.weight.detach().t().requires_grad_() for lin in linears]
    grads_low = torch.autograd.grad(swiglu_mlp_reference(x, *lowp), lowp, dy)
    for name, lin, g_ref, g_low in zip(["dw_gate", "dw_up", "dw_down"], linears, grads_ref, grads_low):
        assert lin.weight.grad.is_contiguous(), name
        assert_rms_close_to_reference(lin.weight.grad, g_ref.t(), g_low.t(), name=name)  # as conftest's weight grads


@pytest.mark.torch_compile
def test_linear_weight_views_under_torch_compile(device):
    """The same transposed views through torch.compile (AOTAutograd, the custom ops' fake
    implementations with the column-major weight gradients): results and gradients as eager."""
    torch.manual_seed(0)
    weights = [torch.randn(shape, device=device) for shape in ((72, 48), (72, 48), (48, 72))]
    x = torch.randn(2, 19, 48, device=device)

    def run(fn):
        leaves = [w.detach().clone().requires_grad_() for w in weights]
        y = fn(x, *(w.t() for w in leaves))
        y.square().sum().backward()
        return [y.detach()] + [w.grad for w in leaves]

    eager = run(swiglu_mlp)
    compiled = run(torch.compile(swiglu_mlp, backend="aot_eager", fullgraph=True))
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b)
    assert all(g.is_contiguous() for g in compiled[1:])
