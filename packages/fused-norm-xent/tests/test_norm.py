"""layer_norm / rms_norm and the LayerNorm / RMSNorm modules against the float64 references,
forward and backward (x, weight, bias)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import assert_close_to_reference
from tritonformer_testkit.dtypes import dtype_name

from fused_norm_xent import LayerNorm, RMSNorm, layer_norm, rms_norm
from fused_norm_xent.reference import layer_norm_reference, rms_norm_reference

pytestmark = pytest.mark.kernels

KINDS = ["layernorm", "rmsnorm"]


def _ours(kind, normalized_shape, eps, offset):
    if kind == "layernorm":
        return lambda x, w, b: layer_norm(x, normalized_shape, w, b, eps)
    return lambda x, w, b: rms_norm(x, normalized_shape, w, eps, offset=offset)


def _reference(kind, ndim, eps, offset):
    if kind == "layernorm":
        return lambda x, w, b: layer_norm_reference(x, w, b, eps, ndim)
    return lambda x, w, b: rms_norm_reference(x, w, eps, offset, normalized_ndim=ndim)


def _like(param, x):
    return param if param is None else param.to(x.dtype)


def _torch(kind, normalized_shape, eps, offset):
    if kind == "layernorm":
        # torch's CPU layer_norm wants the parameters in x's dtype (its CUDA one does not).
        return lambda x, w, b: F.layer_norm(x, normalized_shape, _like(w, x), _like(b, x), eps)
    return lambda x, w, b: F.rms_norm(x, normalized_shape, None if w is None else w + offset, eps)


def check_norm(helpers, kind, x, weight=None, bias=None, eps=1e-5, offset=0.0, normalized_shape=None):
    """Output and gradients of x, weight, bias against the float64 reference, with PyTorch in
    the same dtypes as the baseline; every torch.empty in our call is NaN-poisoned."""
    normalized_shape = tuple(normalized_shape or x.shape[-1:])
    bias = bias if kind == "layernorm" else None
    inputs = helpers.leaves(x, weight, bias)
    dy = torch.randn(x.shape, device=x.device)
    (y,), grads = helpers.forward_backward(_ours(kind, normalized_shape, eps, offset), inputs, [dy], poison=True)
    assert y.shape == x.shape and y.dtype == x.dtype
    ndim = len(normalized_shape)
    (y_ref,), grads_ref = helpers.forward_backward(
        _reference(kind, ndim, eps, offset), helpers.as_float64(*inputs), [dy.double()]
    )
    lowp = helpers.leaves(x, weight, bias)
    (y_low,), grads_low = helpers.forward_backward(_torch(kind, normalized_shape, eps, offset), lowp, [dy])
    names = [n for n, t in zip(["dx", "dweight", "dbias"], inputs) if t is not None]
    results = {"y": (y, y_ref, y_low)}
    results.update({n: g for n, g in zip(names, zip(grads, grads_ref, grads_low))})
    helpers.assert_all_close(results)


def _affine(n, dtype, device, weight=True, bias=True):
    w = (1.0 + 0.5 * torch.randn(n, device=device)).to(dtype) if weight else None
    b = (0.5 * torch.randn(n, device=device)).to(dtype) if bias else None
    return w, b


# Every width and every dtype, not their cross product (each pair compiles its own kernels on a GPU).
FP32, FP16, BF16 = torch.float32, torch.float16, torch.bfloat16
WIDTH_CASES = [(1, 1, FP32), (37, 1, FP32), (37, 1, BF16), (37, 127, FP16), (1, 1000, BF16), (19, 1000, FP32),
               (2, 4097, BF16), (2, 4097, FP16)]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "n_rows, n_cols, dtype",
    [pytest.param(*case, id=f"{case[0]}-{case[1]}-{dtype_name(case[2])}") for case in WIDTH_CASES],
)
def test_widths_rows_dtypes(helpers, kind, n_rows, n_cols, dtype, device):
    x = (2 * torch.randn(n_rows, n_cols, device=device) + 0.5).to(dtype)
    check_norm(helpers, kind, x, *_affine(n_cols, dtype, device))


@pytest.mark.parametrize(
    "kind, dtype", [("layernorm", FP32), ("layernorm", BF16), ("rmsnorm", FP16), ("rmsnorm", BF16)], ids=str
)
def test_rows_wider_than_a_block(helpers, kind, dtype, device):
    """9000 columns: the chunked kernels (Welford merge forward, partial-buffer backward)."""
    x = (torch.randn(3, 9000, device=device) + 3.0).to(dtype)
    check_norm(helpers, kind, x, *_affine(9000, dtype, device))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_cols", [300, 9000])
def test_large_mean_small_spread(helpers, kind, n_cols, device):
    """|mean| >> std: the variance must not come from E[x^2] - E[x]^2."""
    x = 1000.0 + 0.01 * torch.randn(4, n_cols, device=device)
    check_norm(helpers, kind, x, *_affine(n_cols, torch.float32, device))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "weight, bias, n_cols", [(False, False, 96), (True, False, 96), (False, True, 96), (False, True, 9000)]
)
def test_without_weight_or_bias(helpers, kind, weight, bias, n_cols, device):
    check_norm(
        helpers, kind, torch.randn(6, n_cols, device=device), *_affine(n_cols, torch.float32, device, weight, bias)
    )


@pytest.mark.parametrize("n_cols, dtype", [(64, FP32), (64, BF16), (9000, FP16)], ids=str)
def test_rms_offset(helpers, dtype, n_cols, device):
    """y = x * rstd * (1 + w): the Gemma form, weights near 0."""
    w = (0.1 * torch.randn(n_cols, device=device)).to(dtype)
    check_norm(helpers, "rmsnorm", torch.randn(3, n_cols, device=device).to(dtype), w, offset=1.0, eps=1e-6)


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight:UserWarning")  # torch's twin, on the CPU
@pytest.mark.parametrize("kind", KINDS)
def test_fp32_parameters_with_bf16_input(helpers, kind, device):
    x = torch.randn(7, 200, device=device).to(torch.bfloat16)
    check_norm(helpers, kind, x, *_affine(200, torch.float32, device))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_cols", [200, 9000])
def test_out_dtype(helpers, kind, n_cols, device):
    """out_dtype=bf16 on an fp32 x: y is the fp32 result rounded once, as torch's fp32 norm then
    .to(bf16); the bf16 dy comes back as an fp32 dx and fp32 parameter gradients (the one-block
    and the chunked kernels)."""
    x = (2 * torch.randn(5, n_cols, device=device) + 0.5).requires_grad_()
    w, b = (t.requires_grad_() for t in _affine(n_cols, FP32, device))
    b = b if kind == "layernorm" else None
    inputs = [t for t in (x, w, b) if t is not None]
    dy = torch.randn(5, n_cols, device=device).to(BF16)
    if kind == "layernorm":
        y = layer_norm(x, (n_cols,), w, b, 1e-5, out_dtype=BF16)
    else:
        y = rms_norm(x, (n_cols,), w, 1e-5, out_dtype=BF16)
    assert y.dtype == BF16
    grads = torch.autograd.grad(y, inputs, dy)
    x64, w64, b64 = helpers.as_float64(x, w, b)
    reference = _reference(kind, 1, 1e-5, 0.0)(x64, w64, b64)
    grads_ref = torch.autograd.grad(reference, [t for t in (x64, w64, b64) if t is not None], dy.double())
    torch_fp32 = _torch(kind, (n_cols,), 1e-5, 0.0)(x, w, b)
    grads_fp32 = torch.autograd.grad(torch_fp32, inputs, dy.float())
    assert_close_to_reference(y, reference.detach(), torch_fp32.detach().to(BF16), name="y")
    for name, g, g_ref, g_fp32 in zip(["dx", "dweight", "dbias"], grads, grads_ref, grads_fp32):
        assert g.dtype == FP32, name
        assert_close_to_reference(g, g_ref, g_fp32, name=name)


def test_out_dtype_must_be_a_float_dtype(device):
    x = torch.randn(3, 8, device=device)
    with pytest.raises(TypeError, match="out_dtype must be None or one of"):
        rms_norm(x, (8,), out_dtype=torch.int32)
    with pytest.raises(TypeError, match="out_dtype must be None or one of"):
        layer_norm(x, (8,), out_dtype="bfloat16")


@pytest.mark.parametrize("kind", KINDS)
def test_multi_dim_normalized_shape_and_leading_dims(helpers, kind, device):
    x = torch.randn(2, 3, 4, 10, device=device)
    w, b = (1 + torch.randn(4, 10, device=device), torch.randn(4, 10, device=device))
    check_norm(helpers, kind, x, w, b, normalized_shape=(4, 10))


@pytest.mark.parametrize("kind", KINDS)
def test_non_contiguous_input(helpers, kind, device):
    w, b = _affine(100, torch.float32, device)
    check_norm(helpers, kind, torch.randn(5, 200, device=device)[:, ::2], w, b)  # strided columns
    check_norm(helpers, kind, torch.randn(100, 5, device=device).t(), w, b)  # transposed
    check_norm(helpers, kind, torch.randn(4, 3, 100, device=device).transpose(0, 1), w, b)  # rows not mergeable
    w, b = _affine(9000, torch.float32, device)
    check_norm(helpers, kind, torch.randn(9000, 2, device=device).t(), w, b)  # chunked rows, strided columns


@pytest.mark.parametrize("kind", KINDS)
def test_non_finite_rows_propagate_like_torch(kind, device):
    """A row holding a NaN or an inf normalizes to NaN throughout, as torch's CUDA kernels do
    (torch's CPU rms_norm differs: x * rsqrt(inf) gives 0 beside the inf); other rows are exact."""
    x = torch.randn(4, 50, device=device)
    x[1, 3] = float("nan")
    x[2, 7] = float("inf")
    w, b = _affine(50, torch.float32, device)
    ours = _ours(kind, (50,), 1e-5, 0.0)(x, w, b)
    finite_rows = x.isfinite().all(-1, keepdim=True)
    expected = _reference(kind, 1, 1e-5, 0.0)(x.double(), w.double(), b.double())
    expected = torch.where(finite_rows, expected, float("nan"))
    assert_close_to_reference(ours, expected, _torch(kind, (50,), 1e-5, 0.0)(x, w, b), name="y")


@pytest.mark.parametrize("kind", KINDS)
def test_empty_inputs(kind, device):
    w = torch.randn(8, device=device, requires_grad=True)
    x = torch.randn(0, 8, device=device, requires_grad=True)
    y = _ours(kind, (8,), 1e-5, 0.0)(x, w, None)
    y.sum().backward()
    assert y.shape == (0, 8) and torch.equal(w.grad, torch.zeros_like(w))


def test_layer_norm_module_is_a_drop_in(device):
    theirs = torch.nn.LayerNorm((4, 6), eps=1e-6, bias=True, device=device)
    torch.nn.init.normal_(theirs.weight)
    torch.nn.init.normal_(theirs.bias)
    ours = LayerNorm((4, 6), eps=1e-6, bias=True, device=device)
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias"]
    assert repr(ours).split("(", 1)[1] == repr(theirs).split("(", 1)[1]
    x = torch.randn(3, 4, 6, device=device)
    assert_close_to_reference(ours(x), copy.deepcopy(theirs).double()(x.double()), theirs(x), name="LayerNorm")
    assert list(LayerNorm(8, elementwise_affine=False).state_dict()) == []
    assert list(LayerNorm(8, bias=False).state_dict()) == ["weight"]


def test_rms_norm_module_is_a_drop_in(device):
    theirs = torch.nn.RMSNorm([6], eps=None, device=device)
    torch.nn.init.normal_(theirs.weight)
    ours = RMSNorm([6], device=device)
    ours.load_state_dict(theirs.state_dict())
    assert list(ours.state_dict()) == ["weight"]
    assert repr(ours).split("(", 1)[1] == repr(theirs).split("(", 1)[1]
    x = torch.randn(5, 6, device=device)
    assert_close_to_reference(ours(x), copy.deepcopy(theirs).double()(x.double()), theirs(x), name="RMSNorm")
    assert RMSNorm(6, elementwise_affine=False).weight is None


def test_rms_norm_module_offset_starts_as_identity_scale(device):
    module = RMSNorm(32, offset=1.0, device=device)
    assert torch.equal(module.weight, torch.zeros_like(module.weight))
    x = torch.randn(3, 32, device=device)
    assert_close_to_reference(module(x), F.rms_norm(x.double(), (32,)), F.rms_norm(x, (32,)), name="y")


@pytest.mark.gpu(reason="rows past 2^31 elements need 4+ GiB of GPU memory")
@pytest.mark.parametrize("kind", KINDS)
def test_int64_offsets_past_2_31_elements(kind):
    n_cols = 8192
    n_rows = 2**31 // n_cols + 3
    x = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w, b = _affine(n_cols, torch.bfloat16, "cuda")
    y = _ours(kind, (n_cols,), 1e-5, 0.0)(x, w, b)
    # One random row as every row's upstream gradient (a stride-0 view): 4 GiB less to hold.
    dy = torch.randn(n_cols, device="cuda", dtype=torch.bfloat16).expand(n_rows, n_cols)
    (dx,) = torch.autograd.grad(y, x, dy)
    tail = slice(n_rows - 3, n_rows)
    xt = x[tail].detach()
    assert_close_to_reference(
        y[tail], _reference(kind, 1, 1e-5, 0.0)(xt, w, b), _torch(kind, (n_cols,), 1e-5, 0.0)(xt, w, b)
    )
    xt64 = xt.double().requires_grad_(True)
    (dx_ref,) = torch.autograd.grad(_reference(kind, 1, 1e-5, 0.0)(xt64, w, b), xt64, dy[tail].double())
    xtl = xt.clone().requires_grad_(True)
    (dx_low,) = torch.autograd.grad(_torch(kind, (n_cols,), 1e-5, 0.0)(xtl, w, b), xtl, dy[tail])
    assert_close_to_reference(dx[tail], dx_ref, dx_low, name="dx")


@pytest.mark.gpu(reason="the headline shapes and 65536-wide bf16 rows are too slow for the interpreter")
@pytest.mark.parametrize(
    "kind, shape",
    [("layernorm", (16384, 4096)), ("rmsnorm", (16384, 4096)), ("layernorm", (4096, 8192)), ("rmsnorm", (4096, 8192)),
     ("layernorm", (1000, 50257)), ("rmsnorm", (512, 65536)), ("layernorm", (3, 131072))],
    ids=str,
)  # fmt: skip
def test_large_shapes(helpers, kind, shape):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    check_norm(helpers, kind, x, *_affine(shape[1], torch.bfloat16, "cuda"))


@pytest.mark.gpu(reason="autocast runs on CUDA")
def test_autocast_keeps_input_dtype():
    x = torch.randn(8, 300, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(300, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer_norm(x, 300, w)
    y.float().sum().backward()
    assert y.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32
