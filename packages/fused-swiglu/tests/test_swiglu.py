"""swiglu / FusedSwiGLU / FastAccumFusedSwiGLU against the float64 reference, forward and every gradient."""

import pytest
import torch
import torch.nn.functional as F
import triton
from tritonformer_testkit import assert_close_to_reference, dtype_params, poisoned_allocations

from fused_swiglu import FastAccumFusedSwiGLU, FusedSwiGLU, _compat, swiglu
from fused_swiglu._compat import multiprocessor_count
from fused_swiglu.kernels.activation import ACTIVATION_CODES
from fused_swiglu.kernels.backward import _swiglu_weight_grad_kernel
from fused_swiglu.kernels.configs import weight_grad_split
from fused_swiglu.ops.launchers import launch_forward, mlp_down_grad_, swiglu_grad_, swiglu_weight_grad
from fused_swiglu.reference import swiglu_reference

pytestmark = pytest.mark.kernels

FUNCTIONS = {
    "swiglu": swiglu,
    "FusedSwiGLU": FusedSwiGLU.apply,
    # fp16_accumulate=False: fp16 operands, fp32 accumulation, the same contract as FusedSwiGLU.
    "FastAccum-fp32acc": lambda x, wg, wu, bg, bu, activation: FastAccumFusedSwiGLU.apply(
        x, wg, wu, False, bg, bu, activation
    ),
}


# (leading dims, d_model, d_intermediate): leading dims 1 to 3, one row, and sizes that are not
# multiples of any tile (the interpreter's tile is 32 x 32 x 16) next to ones that are.
SHAPES = [
    ((37,), 100, 90),
    ((2, 19), 64, 64),
    ((2, 3, 7), 40, 70),
    ((1,), 33, 17),
]


@pytest.mark.parametrize("dtype", dtype_params())
@pytest.mark.parametrize(
    "leading, d_model, d_inter", SHAPES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v)
)
def test_forward_and_gradients(leading, d_model, d_inter, dtype, device, sw):
    inputs = sw.make_inputs(leading, d_model, d_inter, dtype, device)
    y, _ = sw.check_against_reference(swiglu, swiglu_reference, inputs)
    assert y.shape == (*leading, d_inter)


@pytest.mark.parametrize(
    "function, bias, activation",
    [
        *((function, bias, "silu") for function in ("FusedSwiGLU", "FastAccum-fp32acc") for bias in (False, True)),
        ("FusedSwiGLU", False, "gelu_tanh"),
        ("FusedSwiGLU", True, "gelu_tanh"),
        ("FastAccum-fp32acc", False, "gelu_tanh"),  # the same kernels as FusedSwiGLU's: the argument's way through
    ],
    ids=lambda v: ("bias" if v else "no-bias") if isinstance(v, bool) else v,
)
def test_both_functions_fp16(function, bias, activation, device, sw):
    inputs = sw.make_inputs((2, 21), 50, 45, torch.float16, device, bias)
    ours, reference = (sw.with_activation(fn, activation, 5) for fn in (FUNCTIONS[function], swiglu_reference))
    sw.check_against_reference(ours, reference, inputs)


@pytest.mark.parametrize("activation", list(ACTIVATION_CODES))
@pytest.mark.parametrize("dtype", dtype_params())
def test_bias(dtype, activation, device, sw):
    ours, reference = (sw.with_activation(fn, activation, 5) for fn in (swiglu, swiglu_reference))
    sw.check_against_reference(ours, reference, sw.make_inputs((29,), 48, 35, dtype, device, bias=True))


@pytest.mark.parametrize("dtype", dtype_params())
def test_gelu_tanh_of_large_gates(dtype, device, sw):
    """GeGLU where the gate biases put |g| anywhere from ~1 to 1000: past |g| ~ 10, where
    tanh(y) = (e^2y - 1) / (e^2y + 1) would overflow to inf / inf, the tanh saturates in fp32; forward
    and every gradient as close to the float64 reference as torch's, and no NaN (checked there).

    w_up is zero, so that u is its bias exactly: with gates near 1000, h = gelu(g) * u would
    otherwise magnify the rounding of u's matmul 1000-fold, and compare the two matmuls' summation
    orders (fp32 on a GPU: ours a sequential FMA chain, cuBLAS's another) instead of the gate."""
    x, w_gate, w_up, b_gate, b_up = sw.make_inputs((2, 13), 24, 40, dtype, device, bias=True)
    magnitudes = torch.logspace(0, 3, 40, device=device) * torch.tensor([1.0, -1.0], device=device).repeat(20)
    b_gate = magnitudes.to(dtype).requires_grad_()
    w_up = torch.zeros_like(w_up).requires_grad_()
    ours, reference = (sw.with_activation(fn, "gelu_tanh", 5) for fn in (swiglu, swiglu_reference))
    sw.check_against_reference(ours, reference, [x, w_gate, w_up, b_gate, b_up])


def test_gelu_tanh_of_extreme_gates(device):
    """|g| from 11 (where fp32's exp(-2|y|) underflows to 0) to fp32's largest: gelu(g) is g or 0
    and gelu'(g) 1 or 0 exactly, and g^2, g^3 must not overflow into a NaN; so h, d_gate and d_up
    equal the float64 reference's values rounded once: in the forward, the elementwise backward and
    the down projection's backward epilogue (dh = dy @ I there)."""
    code = ACTIVATION_CODES["gelu_tanh"]
    magnitudes = torch.tensor([11.0, 16.0, 100.0, 1e4, 1e13, 1e20, 3e38], device=device)
    gate = torch.cat([magnitudes, -magnitudes])  # float32, (14,)
    up = torch.rand(14, device=device) * 2 - 1
    dh = torch.rand(3, 14, device=device) * 2 - 1
    g64 = gate.double().repeat(3, 1).requires_grad_()
    act64 = F.gelu(g64, approximate="tanh")
    (d_act64,) = torch.autograd.grad(act64, g64, torch.ones_like(act64))
    act64, u64 = act64.detach(), up.double()
    h_ref, d_gate_ref, d_up_ref = act64 * u64, dh.double() * u64 * d_act64, dh.double() * act64

    w = torch.randn(8, 14, device=device)
    h = swiglu(torch.zeros(3, 8, device=device), w, w, gate, up, activation="gelu_tanh")  # g, u: the biases
    g, u = gate.repeat(3, 1), up.repeat(3, 1)
    swiglu_grad_(dh, g, u, code)
    g_down, u_down = gate.repeat(3, 1), up.repeat(3, 1)
    h_down = mlp_down_grad_(dh, torch.eye(14, device=device), g_down, u_down, code)
    checks = [("h", h, h_ref), ("d_gate", g, d_gate_ref), ("d_up", u, d_up_ref), ("h (down)", h_down, h_ref),
              ("d_gate (down)", g_down, d_gate_ref), ("d_up (down)", u_down, d_up_ref)]  # fmt: skip
    for name, value, reference in checks:
        assert torch.equal(value, reference.float()), f"{name}: {value} != {reference.float()}"


def test_strided_bias(device, sw):
    x, w_gate, w_up = sw.make_inputs((13,), 24, 40, torch.bfloat16, device)
    b_gate, b_up = (torch.randn(80, device=device, dtype=torch.bfloat16)[::2].requires_grad_() for _ in range(2))
    assert b_gate.stride() == (2,)
    sw.check_against_reference(swiglu, swiglu_reference, [x, w_gate, w_up, b_gate, b_up])


def test_no_leading_dims(device, sw):
    """x of shape (d_model,): a single token, as torch.matmul allows."""
    sw.check_against_reference(swiglu, swiglu_reference, sw.make_inputs((), 24, 40, torch.bfloat16, device))


@pytest.mark.parametrize("layout", ["strided-rows", "column-major", "not-flattenable", "strided-cols"])
def test_non_contiguous_x(layout, device, sw):
    d_model, d_inter = 40, 56
    if layout == "strided-rows":
        x = torch.randn(50, 2 * d_model, device=device)[:, :d_model]
    elif layout == "column-major":
        x = torch.randn(d_model, 45, device=device).t()
    elif layout == "not-flattenable":  # (3, 9, d_model) picked out of (3, 18, d_model): no (27, d_model) view
        x = torch.randn(3, 18, d_model, device=device)[:, ::2]
    else:
        x = torch.randn(30, 2 * d_model, device=device)[:, ::2]
    x = x.to(torch.bfloat16).requires_grad_()
    _, w_gate, w_up = sw.make_inputs((1,), d_model, d_inter, torch.bfloat16, device)
    sw.check_against_reference(swiglu, swiglu_reference, [x, w_gate, w_up])


def test_transposed_weights_and_gradient(device, sw):
    """Weights as views of nn.Linear-layout (d_intermediate, d_model) tensors; a non-contiguous dh."""
    x = torch.randn(33, 40, device=device, dtype=torch.float16).requires_grad_()
    w_gate = sw.linear_weight(40, 60, device, torch.float16).t().contiguous().t().requires_grad_()
    w_up = sw.linear_weight(40, 60, device, torch.float16).t().contiguous().t().requires_grad_()
    assert w_gate.stride() == (1, 40)
    dy = torch.randn(60, 33, device=device, dtype=torch.float16).t()  # column-major upstream gradient
    with poisoned_allocations():
        y, grads, _ = sw.outputs_and_grads(swiglu, [x, w_gate, w_up], dy)
    y_ref, grads_ref, _ = sw.outputs_and_grads(
        swiglu_reference, sw.detached([x, w_gate, w_up], torch.float64), dy.double()
    )
    y_low, grads_low, _ = sw.outputs_and_grads(swiglu_reference, sw.detached([x, w_gate, w_up]), dy)
    assert_close_to_reference(y, y_ref, y_low, name="y")
    for name, g, g_ref, g_low in zip(("dx", "dw_gate", "dw_up"), grads, grads_ref, grads_low):
        assert_close_to_reference(g, g_ref, g_low, name=name)


def test_expanded_upstream_gradient(device, sw):
    """y.sum().backward() hands the backward a stride-0 dh."""
    inputs = sw.make_inputs((17,), 32, 48, torch.bfloat16, device)
    with poisoned_allocations():
        swiglu(*inputs).sum().backward()
    ref = sw.detached(inputs, torch.float64)
    swiglu_reference(*ref).sum().backward()
    low = sw.detached(inputs)
    swiglu_reference(*low).sum().backward()
    for name, ours, r, lo in zip(("x", "w_gate", "w_up"), inputs, ref, low):
        assert_close_to_reference(ours.grad, r.grad, lo.grad, name=f"d{name}")


@pytest.mark.parametrize("trainable", ["x-only", "weights-only", "w_gate-only"])
def test_partial_gradients(trainable, device, sw):
    x, w_gate, w_up = sw.make_inputs((25,), 40, 36, torch.bfloat16, device)
    x.requires_grad_(trainable == "x-only")
    w_gate.requires_grad_(trainable != "x-only")
    w_up.requires_grad_(trainable == "weights-only")
    sw.check_against_reference(swiglu, swiglu_reference, [x, w_gate, w_up])


def test_inference_forward_saves_nothing(device, sw):
    x, w_gate, w_up = sw.detached(sw.make_inputs((40,), 32, 64, torch.bfloat16, device))
    for t in (x, w_gate, w_up):
        t.requires_grad_(False)
    with poisoned_allocations():
        y = swiglu(x, w_gate, w_up)
    assert y.grad_fn is None
    assert_close_to_reference(
        y, swiglu_reference(*sw.detached([x, w_gate, w_up], torch.float64)), swiglu_reference(x, w_gate, w_up), name="y"
    )


def test_empty_batch(device, sw):
    x, w_gate, w_up = sw.make_inputs((0, 5), 16, 24, torch.bfloat16, device)
    y = swiglu(x, w_gate, w_up)
    assert y.shape == (0, 5, 24)
    dx, dw_gate, dw_up = torch.autograd.grad(y, (x, w_gate, w_up), torch.ones_like(y))
    assert dx.shape == x.shape
    assert torch.equal(dw_gate, torch.zeros_like(dw_gate)) and torch.equal(dw_up, torch.zeros_like(dw_up))


def test_second_backward_through_the_graph_raises(device, sw):
    """The backward overwrites the saved g and u with their gradients: a retained graph must not be reused."""
    x, w_gate, w_up = sw.make_inputs((9,), 16, 16, torch.bfloat16, device)
    y = swiglu(x, w_gate, w_up)
    y.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_autocast_with_fp32_parameters(bias, device, sw, monkeypatch):
    """fp32 inputs under torch.autocast run in its dtype, as F.linear's do; every gradient comes
    back in fp32, as close to the float64 reference as F.linear's under autocast, and those of the
    weights and biases leave FusedSwiGLU's backward in fp32 (written so by the kernels: no cast)."""
    returned = sw.returned_grad_dtypes(monkeypatch, FusedSwiGLU)
    inputs = sw.make_inputs((2, 11), 40, 48, torch.float32, device, bias)
    sw.check_autocast_against_torch(swiglu, sw.swiglu_linear, swiglu_reference, inputs)
    (dtypes,) = returned
    # w_gate, w_up, b_gate, b_up, then None for the activation
    assert dtypes[1:] == [torch.float32] * (4 if bias else 2) + [None] * (1 if bias else 3), dtypes


@pytest.mark.parametrize("split", [False, True], ids=["whole-tiles", "split-last-wave"])
def test_weight_gradient_in_fp32_of_bf16_operands(split, device):
    """swiglu_weight_grad(..., torch.float32) of bf16 operands stores the fp32 sums uncast, by the
    main kernel and by the split reduction: held to fp32's precision (torch's fp32 product of the
    same operands), which a bf16 rounding on the way would miss by far."""
    config = _swiglu_weight_grad_kernel.configs[0].kwargs
    assert len(_swiglu_weight_grad_kernel.configs) == 1  # pinned (GPU) or the interpreter's one config
    sms = multiprocessor_count(torch.device(device))
    # Split: the shape of test_weight_gradient_split_of_the_last_wave; whole: one full wave of
    # tiles, ragged at the edges.
    m, k, n = (42, 40, 60) if split else (37, config["BLOCK_K"] - 8, config["BLOCK_N"] * sms - 10)
    tiles = triton.cdiv(k, config["BLOCK_K"]) * triton.cdiv(n, config["BLOCK_N"])
    assert (weight_grad_split(tiles, sms, triton.cdiv(m, config["BLOCK_M"])) > 1) == split
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    d_gate, d_up = (torch.randn(m, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    with poisoned_allocations():
        dw_gate, dw_up = swiglu_weight_grad(x, d_gate, d_up, torch.float32)
    for name, dw, d in (("dw_gate", dw_gate, d_gate), ("dw_up", dw_up, d_up)):
        assert dw.dtype == torch.float32 and dw.shape == (k, n)
        reference = x.double().t() @ d.double()
        assert_close_to_reference(dw, reference, x.float().t() @ d.float(), name=name)
        with pytest.raises(AssertionError):  # the check would see a bf16 rounding
            assert_close_to_reference(dw.to(torch.bfloat16).float(), reference, x.float().t() @ d.float())


@pytest.mark.torch_compile
@pytest.mark.parametrize("activation", list(ACTIVATION_CODES))
def test_torch_compile_fullgraph(activation, device, sw):
    """The launchers are custom ops: torch.compile(fullgraph=True) traces forward and backward without a break."""
    inputs = sw.make_inputs((3, 13), 32, 40, torch.bfloat16, device)
    compiled = torch.compile(sw.with_activation(swiglu, activation, 5), backend="eager", fullgraph=True)
    sw.check_against_reference(compiled, sw.with_activation(swiglu_reference, activation, 5), inputs)


@pytest.mark.parametrize("dtype", dtype_params((torch.bfloat16, torch.float16)))
@pytest.mark.parametrize(
    "bias, activation",
    [(False, "silu"), (True, "silu"), (True, "gelu_tanh")],
    ids=["no-bias", "bias", "bias-gelu_tanh"],
)
@pytest.mark.skipif(_compat.TensorDescriptor is None, reason="TMA tensor descriptors need Triton >= 3.4")
def test_tma_forward_kernel(bias, activation, dtype, device, sw):
    """The Hopper TMA forward kernel (run here through the interpreter's descriptors): edges of
    every dim zero-padded by the descriptors (M=37, N=72, K=40 against 32 x 32 x 16 tiles)."""
    x, w_gate, w_up, *biases = (t.detach() for t in sw.make_inputs((37,), 40, 72, dtype, device, bias))
    b_gate, b_up = biases if bias else (None, None)
    with poisoned_allocations():
        h, g, u = (torch.empty(37, 72, device=device, dtype=dtype) for _ in range(3))
    launch_forward(x, w_gate, w_up, b_gate, b_up, h, g, u, True, False, True, ACTIVATION_CODES[activation])
    inputs = [x, w_gate, w_up, b_gate, b_up]
    expected = swiglu_reference(*(None if t is None else t.double() for t in inputs), activation)
    assert_close_to_reference(h, expected, swiglu_reference(*inputs, activation), name="h")
    gate = x.double() @ w_gate.double() + (b_gate.double() if bias else 0)
    assert_close_to_reference(g, gate, x @ w_gate + (b_gate if bias else 0), name="g")


def test_weight_gradient_split_of_the_last_wave(device, sw):
    """dw_gate, dw_up where the last wave of output tiles splits its reduction over several
    programs (checked to happen with the config this run uses), and the partial sums meet in the
    reduction kernel; M = 42 rows leaves the last reduction step partial."""
    x, w_gate, w_up = sw.make_inputs((42,), 40, 60, torch.bfloat16, device)
    config = _swiglu_weight_grad_kernel.configs[0].kwargs
    assert len(_swiglu_weight_grad_kernel.configs) == 1  # pinned (GPU) or the interpreter's one config
    tiles = triton.cdiv(40, config["BLOCK_K"]) * triton.cdiv(60, config["BLOCK_N"])
    assert weight_grad_split(tiles, multiprocessor_count(x.device), triton.cdiv(42, config["BLOCK_M"])) > 1
    sw.check_against_reference(swiglu, swiglu_reference, [x, w_gate, w_up])
