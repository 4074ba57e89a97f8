"""add_dropout_norm and AddDropoutNorm: s = dropout(x) + residual, y = norm(s), forward and backward
against the float64 reference with the kernel's own dropout mask, and the mask's properties."""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import assert_close_to_reference

from fused_norm_xent import AddDropoutNorm, add_dropout_norm
from fused_norm_xent.reference import add_dropout_norm_reference

pytestmark = pytest.mark.kernels

KINDS = ["layernorm", "rmsnorm"]


def keep_mask(shape, p, seed, device, seed_offset=0):
    """The kernel's dropout mask for (seed, seed_offset): dropout(ones) kept exactly in fp32."""
    ones = torch.ones(shape, device=device)
    _, dropped = add_dropout_norm(ones, None, None, None, p, residual_in_fp32=True, seed=seed, seed_offset=seed_offset)
    assert dropped.dtype == torch.float32
    return dropped != 0


def _torch_twin(keep, p, norm, prenorm, residual_in_fp32, eps):
    """The unfused computation in PyTorch, in the inputs' own dtypes."""

    def run(x, residual, weight, bias):
        if p == 1.0:
            s = x * 0.0
        elif p > 0:
            s = torch.where(keep, x / (1.0 - p), torch.zeros_like(x))
        else:
            s = x
        res_dtype = residual.dtype if residual is not None else (torch.float32 if residual_in_fp32 else x.dtype)
        s = s.to(res_dtype) + residual if residual is not None else s.to(res_dtype)
        w = None if weight is None else weight.to(s.dtype)
        if norm == "rmsnorm":
            y = F.rms_norm(s, s.shape[-1:], w, eps)
            y = y if bias is None else y + bias.to(s.dtype)
        else:
            y = F.layer_norm(s, s.shape[-1:], w, None if bias is None else bias.to(s.dtype), eps)
        y = y.to(x.dtype)
        return (y, s) if prenorm else (y, y)

    return run


def check(helpers, x, residual, weight, bias, p, *, norm, prenorm=True, residual_in_fp32=False, seed=1234, eps=1e-5):
    keep = keep_mask(x.shape, p, seed, x.device) if p > 0 else None
    inputs = helpers.leaves(x, residual, weight, bias)
    dy = torch.randn(x.shape, device=x.device)
    upstream = [dy, torch.randn(x.shape, device=x.device) if prenorm else None]

    def ours(x, residual, weight, bias):
        return add_dropout_norm(
            x, residual, weight, bias, p, prenorm=prenorm, norm=norm, eps=eps, residual_in_fp32=residual_in_fp32,
            seed=seed,
        )  # fmt: skip

    (y, new_residual), grads = helpers.forward_backward(ours, inputs, upstream, poison=True)
    res_dtype = residual.dtype if residual is not None else (torch.float32 if residual_in_fp32 else x.dtype)
    assert y.dtype == x.dtype and new_residual.dtype == (res_dtype if prenorm else x.dtype)
    if not prenorm:
        assert new_residual is y

    def reference(x, residual, weight, bias):
        return add_dropout_norm_reference(
            x, residual, weight, bias, keep, p, prenorm=prenorm, norm=norm, eps=eps
        )  # fmt: skip

    (y_ref, res_ref), grads_ref = helpers.forward_backward(
        reference, helpers.as_float64(*inputs), [None if u is None else u.double() for u in upstream]
    )
    twin = _torch_twin(keep, p, norm, prenorm, residual_in_fp32, eps)
    (y_low, res_low), grads_low = helpers.forward_backward(twin, helpers.leaves(x, residual, weight, bias), upstream)
    names = [n for n, t in zip(["dx", "dresidual", "dweight", "dbias"], inputs) if t is not None]
    results = {"y": (y, y_ref, y_low), "new_residual": (new_residual, res_ref, res_low)}
    results.update({n: g for n, g in zip(names, zip(grads, grads_ref, grads_low))})
    helpers.assert_all_close(results)


def _params(n, dtype, device, norm):
    weight = (1.0 + 0.5 * torch.randn(n, device=device)).to(dtype)
    bias = (0.5 * torch.randn(n, device=device)).to(dtype) if norm == "layernorm" else None
    return weight, bias


@pytest.mark.parametrize(
    "norm, dtype, prenorm",
    [("layernorm", torch.float32, True), ("layernorm", torch.bfloat16, False), ("rmsnorm", torch.float16, True),
     ("rmsnorm", torch.bfloat16, True), ("rmsnorm", torch.float32, False)],
    ids=str,
)  # fmt: skip
def test_dropout_and_residual(helpers, norm, dtype, prenorm, device):
    x = torch.randn(13, 96, device=device).to(dtype)
    residual = torch.randn(13, 96, device=device).to(dtype)
    check(helpers, x, residual, *_params(96, dtype, device, norm), 0.25, norm=norm, prenorm=prenorm)


@pytest.mark.parametrize("residual_in_fp32", [False, True])
@pytest.mark.parametrize("norm", KINDS)
def test_first_block_without_residual(helpers, norm, residual_in_fp32, device):
    x = torch.randn(9, 200, device=device).to(torch.bfloat16)
    check(helpers, x, None, *_params(200, torch.bfloat16, device, norm), 0.1, norm=norm,
          residual_in_fp32=residual_in_fp32)  # fmt: skip


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("norm", KINDS)
def test_fp32_residual_stream_with_bf16_branch(helpers, norm, p, device):
    x = torch.randn(11, 64, device=device).to(torch.bfloat16)
    residual = torch.randn(11, 64, device=device)
    check(helpers, x, residual, *_params(64, torch.float32, device, norm), p, norm=norm)


@pytest.mark.parametrize("norm", KINDS)
def test_rows_wider_than_a_block(helpers, norm, device):
    x, residual = torch.randn(3, 9000, device=device), torch.randn(3, 9000, device=device).to(torch.bfloat16)
    check(helpers, x, residual, *_params(9000, torch.float32, device, norm), 0.2, norm=norm)


@pytest.mark.parametrize("norm", KINDS)
def test_rows_over_several_backward_programs(helpers, norm, device):
    """Enough rows that the backward spreads over several programs, whose partial sums a second
    kernel reduces into the weight and bias gradients, beside the residual's gradient."""
    x, residual = torch.randn(48, 600, device=device).to(torch.bfloat16), torch.randn(48, 600, device=device)
    check(helpers, x, residual, *_params(600, torch.float32, device, norm), 0.2, norm=norm)


def test_without_parameters_and_p_1(helpers, device):
    x, residual = torch.randn(5, 40, device=device), torch.randn(5, 40, device=device)
    check(helpers, x, residual, None, None, 0.5, norm="layernorm")
    check(helpers, x, residual, None, None, 1.0, norm="rmsnorm")


def test_same_seed_same_result_and_different_seeds_differ(device):
    x, residual = torch.randn(8, 256, device=device), torch.randn(8, 256, device=device)
    w = torch.ones(256, device=device)
    run = lambda **kw: add_dropout_norm(x, residual, w, None, 0.5, **kw)  # noqa: E731
    first, again = run(seed=7), run(seed=7)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[1], run(seed=8)[1])
    assert not torch.equal(first[1], run(seed=7, seed_offset=1)[1])
    torch.manual_seed(3)
    drawn = run()
    torch.manual_seed(3)
    assert torch.equal(drawn[1], run()[1]), "seed=None must follow torch.manual_seed"
    assert not torch.equal(drawn[1], run()[1])


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_mask_keeps_one_minus_p_without_structure(p, device):
    keep = keep_mask((64, 1000), p, seed=99, device=device)
    kept = keep.float().mean().item()
    # Binomial(64000, 1 - p): 10 standard deviations is under 0.012 for these p.
    assert abs(kept - (1 - p)) < 0.012, kept
    assert not torch.equal(keep[0], keep[1]) and not torch.equal(keep[:, 0], keep[:, 1])
    rows, cols = keep.float().mean(1), keep.float().mean(0)
    assert rows.std() < 0.1 and cols.std() < 0.2


def test_module_trains_with_dropout_and_evaluates_without(device):
    module = AddDropoutNorm(48, norm="layernorm", p=0.5, device=device)
    assert list(module.state_dict()) == ["weight", "bias"]
    assert list(AddDropoutNorm(48, norm="rmsnorm").state_dict()) == ["weight"]
    x, residual = torch.randn(4, 48, device=device), torch.randn(4, 48, device=device)
    module.eval()
    y, new_residual = module(x, residual)
    assert_close_to_reference(new_residual, x.double() + residual.double(), x + residual, name="new_residual")
    assert_close_to_reference(y, F.layer_norm((x + residual).double(), (48,)), F.layer_norm(x + residual, (48,)))
    module.train()
    _, dropped = module(x, residual, seed=5)
    assert not torch.equal(dropped, new_residual)


@pytest.mark.gpu(reason="rows past 2^31 elements need 4+ GiB of GPU memory")
def test_int64_offsets_past_2_31_elements():
    n_cols = 4096
    n_rows = 2**31 // n_cols + 2
    x = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    y, new_residual = add_dropout_norm(x, residual, None, None, 0.5, norm="rmsnorm", seed=11)
    tail = slice(n_rows - 2, n_rows)
    keep = new_residual[tail] != residual[tail]
    assert abs(keep.float().mean().item() - 0.5) < 0.05
    expected = torch.where(keep, x[tail].float() * 2, 0.0) + residual[tail].float()
    assert_close_to_reference(new_residual[tail], expected.double(), expected.to(torch.bfloat16))


@pytest.mark.gpu(reason="the headline shape (16384 x 4096 bf16) is too slow for the interpreter")
@pytest.mark.parametrize("norm", KINDS)
def test_headline_shape(helpers, norm):
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn(16384, 4096, device="cuda", dtype=torch.float32)
    check(helpers, x, residual, *_params(4096, torch.float32, "cuda", norm), 0.1, norm=norm)
