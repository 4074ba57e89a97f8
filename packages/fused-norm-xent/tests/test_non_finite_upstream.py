"""Ignored rows get exactly zero gradients whatever their upstream gradient, NaN and inf included,
as F.cross_entropy gives them: cross_entropy and linear_cross_entropy, every reduction and option.

A NaN upstream gradient on an ignored row is what a per-sequence mean produces for a sequence of
padding only (its token count is 0: loss / 0 selected away in the forward, 0 / 0 in the backward).
"""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import assert_close_to_reference

import fused_norm_xent as nx
from fused_norm_xent._compat import HAS_CUSTOM_OP

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
]

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
OPTIONS = [
    pytest.param({}, id="plain"),
    pytest.param({"label_smoothing": 0.1, "lse_square_scale": 1e-3}, id="smoothing-zloss"),
]
NON_FINITE = [pytest.param(float("nan"), id="nan"), pytest.param(float("inf"), id="inf")]


def torch_cross_entropy(
    logits,
    target,
    ignore_index=-100,
    reduction="mean",
    label_smoothing=0.0,
    lse_square_scale=0.0,
    compute=torch.float64,
):
    """F.cross_entropy plus the z-loss computed in `compute` (float64: the reference; float32 on
    low-precision logits: PyTorch's own low-precision baseline, as its CUDA kernels compute it)."""
    x = logits.to(compute)
    loss = F.cross_entropy(
        x, target.long(), ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )
    valid = target != ignore_index
    z_rows = torch.where(valid, lse_square_scale * torch.logsumexp(x, -1).square(), 0.0)
    return loss + {"none": z_rows, "sum": z_rows.sum(), "mean": z_rows.sum() / valid.sum()}[reduction]


def _upstream(reduction, target, bad, device, bad_valid_row=True):
    """ "none": finite per row, `bad` on the ignored rows and (bad_valid_row) on one valid row; else `bad`."""
    if reduction != "none":
        return torch.tensor(bad, device=device)
    upstream = torch.randn(target.shape, device=device)
    upstream[target == -100] = bad
    valid_rows = (target != -100).nonzero().flatten()
    if bad_valid_row and len(valid_rows):
        upstream[valid_rows[0]] = bad
    return upstream


def assert_gradient_like_torch(grad, expected, lowp, ignored, name):
    """Ignored rows (first dim) exactly 0, as torch's; elsewhere close to the float64 `expected`
    (as close as torch's low-precision `lowp`) where it is finite, and non-finite where it is not
    (NaN or +-inf: a gradient scaled by an inf upstream may pick either)."""
    assert torch.equal(expected[ignored], torch.zeros_like(expected[ignored])), f"{name}: torch's ignored rows"
    assert torch.equal(grad[ignored], torch.zeros_like(grad[ignored])), f"{name}: ignored rows are not exactly 0"
    finite = expected.isfinite()
    assert torch.equal(grad.isfinite(), finite), f"{name}: non-finite positions differ from torch"
    assert_close_to_reference(
        torch.where(finite, grad, 0), torch.where(finite, expected, 0), torch.where(finite, lowp, 0), name=name
    )


def _logits(n_rows, n_cols, dtype, device):
    logits = (3 * torch.randn(n_rows, n_cols, device=device)).to(dtype)
    target = torch.randint(0, n_cols, (n_rows,), device=device)
    target[[1, 4]] = -100
    return logits, target


def _torch_grads(fn, inputs, upstream):
    """(output, input gradients) of torch's fn in float64 and in the inputs' own precision."""
    ref_inputs = [t.double().requires_grad_(True) for t in inputs]
    expected = fn(*ref_inputs, compute=torch.float64)
    expected_grads = torch.autograd.grad(expected, ref_inputs, upstream.double())
    low_inputs = [t.clone().requires_grad_(True) for t in inputs]
    low = fn(*low_inputs, compute=torch.float32)
    low_grads = torch.autograd.grad(low, low_inputs, upstream.float())
    return expected, expected_grads, low_grads


def _cross_entropy_grads(logits, target, upstream, inplace, **options):
    """(loss, torch's float64 loss, dlogits, torch's float64 dlogits, torch's low-precision dlogits)."""
    leaf = logits.clone().requires_grad_(True)
    # In place, the kernel writes into a copy (a non-leaf): the gradient reaches the leaf through it.
    loss = nx.cross_entropy(leaf.clone() if inplace else leaf, target, inplace_backward=inplace, **options)
    upstream = upstream.to(loss.dtype)  # torch gets the upstream gradient the op gets
    (grad,) = torch.autograd.grad(loss, leaf, upstream)
    expected, (expected_grad,), (low_grad,) = _torch_grads(
        lambda x, compute: torch_cross_entropy(x, target, compute=compute, **options), [logits], upstream
    )
    return loss, expected, grad, expected_grad, low_grad


@pytest.mark.parametrize("bad", NON_FINITE)
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("inplace", [False, True], ids=["new-buffer", "inplace"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy(reduction, inplace, options, bad, dtype, device):
    logits, target = _logits(7, 50, dtype, device)
    upstream = _upstream(reduction, target, bad, device)
    _, _, *grads = _cross_entropy_grads(logits, target, upstream, inplace, reduction=reduction, **options)
    assert_gradient_like_torch(*grads, target == -100, "dlogits")


@pytest.mark.parametrize("reduction", ["none", "mean"])
def test_cross_entropy_rows_wider_than_a_block(reduction, device):
    """9000 classes: each row's gradient is written in two 8192-wide chunks."""
    logits, target = _logits(5, 9000, torch.bfloat16, device)
    upstream = _upstream(reduction, target, float("nan"), device)
    _, _, *grads = _cross_entropy_grads(logits, target, upstream, False, reduction=reduction, label_smoothing=0.05)
    assert_gradient_like_torch(*grads, target == -100, "dlogits")


def test_cross_entropy_per_sequence_mean_with_a_padding_sequence(device):
    """Two sequences of 5 tokens, the second all padding: a finite loss, and gradients as torch's."""
    logits, _ = _logits(10, 40, torch.float32, device)
    target = torch.randint(0, 40, (2, 5), device=device)
    target[1] = -100
    target[0, 2] = -100
    valid = target != -100
    n = valid.sum(1, keepdim=True)

    def per_sequence_mean(loss_rows):
        return torch.where(valid, loss_rows.view(2, 5) / n, 0.0).sum()

    leaf = logits.clone().requires_grad_(True)
    loss = per_sequence_mean(nx.cross_entropy(leaf, target.flatten(), reduction="none"))
    loss.backward()
    ref_leaf = logits.double().requires_grad_(True)
    expected = per_sequence_mean(F.cross_entropy(ref_leaf, target.flatten(), reduction="none"))
    expected.backward()
    assert loss.isfinite() and leaf.grad.isfinite().all()
    assert_close_to_reference(loss.detach(), expected.detach(), name="loss")
    assert_gradient_like_torch(leaf.grad, ref_leaf.grad, ref_leaf.grad, ~valid.flatten(), "dlogits")


@pytest.mark.parametrize("bad", [*NON_FINITE, pytest.param(1.0, id="one"), pytest.param(2.0, id="two")])
@pytest.mark.parametrize("inplace", [False, True], ids=["new-buffer", "inplace"])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_cross_entropy_every_row_ignored(reduction, inplace, bad, device):
    """torch: the mean is NaN (0 / 0), the sum 0, and every gradient exactly 0 whatever the upstream."""
    logits, _ = _logits(5, 30, torch.float32, device)
    target = torch.full((5,), -100, device=device)
    upstream = _upstream(reduction, target, bad, device)
    loss, expected, grad, expected_grad, _ = _cross_entropy_grads(
        logits, target, upstream, inplace, reduction=reduction, label_smoothing=0.1
    )
    assert torch.equal(loss.isnan(), expected.isnan()) and bool(loss.isnan().all()) == (reduction == "mean")
    assert torch.equal(expected_grad, torch.zeros_like(expected_grad))
    assert torch.equal(grad, torch.zeros_like(grad))


def _linear_inputs(n_tokens, hidden_size, vocab, dtype, device, ignored):
    hidden = torch.randn(n_tokens, hidden_size, device=device).to(dtype)
    weight = (torch.randn(vocab, hidden_size, device=device) / hidden_size**0.5).to(dtype)
    bias = (0.5 * torch.randn(vocab, device=device)).to(dtype)
    target = torch.randint(0, vocab, (n_tokens,), device=device)
    target[ignored] = -100
    return hidden, weight, bias, target


def _linear_grads(hidden, weight, bias, target, upstream, **options):
    """(loss, torch's float64 loss, gradients, torch's float64 ones, torch's low-precision ones)."""
    inputs = [t.clone().requires_grad_(True) for t in (hidden, weight, bias)]
    loss = nx.linear_cross_entropy(inputs[0], inputs[1], target, inputs[2], **options)
    upstream = upstream.to(loss.dtype)  # torch gets the upstream gradient the op gets
    grads = torch.autograd.grad(loss, inputs, upstream)
    options = {k: v for k, v in options.items() if k != "chunk_size"}
    expected, expected_grads, low_grads = _torch_grads(
        lambda h, w, b, compute: torch_cross_entropy(F.linear(h, w, b), target, compute=compute, **options),
        [hidden, weight, bias],
        upstream,
    )
    return loss, expected, grads, expected_grads, low_grads


def _assert_linear_grads_like_torch(grads, expected_grads, low_grads, target):
    """dhidden row by row as dlogits; dweight and dbias sum over the tokens (no rows to ignore)."""
    no_rows = torch.zeros(0, dtype=torch.long, device=target.device)
    for name, grad, expected, low, ignored in zip(
        ["dhidden", "dweight", "dbias"], grads, expected_grads, low_grads, [target == -100, no_rows, no_rows]
    ):
        assert_gradient_like_torch(grad, expected, low, ignored, name)


@pytest.mark.parametrize("bad", NON_FINITE)
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_cross_entropy(reduction, options, bad, dtype, device):
    """13 tokens in chunks of 4 (the last partial), three of them ignored."""
    hidden, weight, bias, target = _linear_inputs(13, 16, 60, dtype, device, [0, 5, 12])
    # A non-finite upstream on a valid row makes every dweight entry non-finite: "none" keeps the valid rows finite.
    upstream = _upstream(reduction, target, bad, device, bad_valid_row=False)
    _, _, grads, *expected = _linear_grads(hidden, weight, bias, target, upstream, reduction=reduction, chunk_size=4,
                                           **options)  # fmt: skip
    _assert_linear_grads_like_torch(grads, *expected, target)
    if reduction == "none":
        assert all(bool(g.isfinite().all()) for g in grads)


@pytest.mark.parametrize("bad", [*NON_FINITE, pytest.param(2.0, id="two")])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_linear_cross_entropy_every_token_ignored(reduction, bad, device):
    """No token counts: every gradient exactly 0, as torch's, whatever the upstream gradient."""
    hidden, weight, bias, target = _linear_inputs(9, 8, 30, torch.float32, device, slice(None))
    upstream = _upstream(reduction, target, bad, device)
    loss, expected, grads, expected_grads, _ = _linear_grads(
        hidden, weight, bias, target, upstream, reduction=reduction, chunk_size=4, label_smoothing=0.1
    )
    assert torch.equal(loss.isnan(), expected.isnan()) and bool(loss.isnan().all()) == (reduction == "mean")
    for grad, expected_grad in zip(grads, expected_grads):
        assert torch.equal(expected_grad, torch.zeros_like(expected_grad))
        assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_cross_entropy_per_sequence_mean_with_a_padding_sequence(dtype, device):
    """Three sequences of 6 tokens, the last all padding: finite parameter gradients, as torch's."""
    hidden, weight, bias, _ = _linear_inputs(18, 16, 50, dtype, device, [])
    target = torch.randint(0, 50, (3, 6), device=device)
    target[2] = -100
    target[0, :2] = -100
    valid = target != -100
    n = valid.sum(1, keepdim=True)
    upstream_rows = torch.where(valid, 1.0 / n, 0.0).flatten()  # d loss / d loss_rows, NaN for the padding rows
    upstream_rows[valid.flatten().logical_not()] = torch.nan
    _, _, grads, *expected = _linear_grads(hidden, weight, bias, target.flatten(), upstream_rows, reduction="none",
                                           chunk_size=8)  # fmt: skip
    assert all(bool(g.isfinite().all()) for g in grads)
    _assert_linear_grads_like_torch(grads, *expected, target.flatten())


@pytest.mark.torch_compile
@pytest.mark.torch_dynamo
@pytest.mark.skipif(not HAS_CUSTOM_OP, reason="torch.library.custom_op needs torch >= 2.4")
@pytest.mark.parametrize("every_row_ignored", [False, True], ids=["some-ignored", "all-ignored"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_compiled_backward(reduction, every_row_ignored, device):
    """Under torch.compile the reduced backward is plain torch ops: ignored rows stay 0 there too,
    and with every row ignored so do the weight and bias gradients."""
    logits, target = _logits(6, 20, torch.float32, device)
    if every_row_ignored:
        target[:] = -100
    hidden, weight, bias, _ = _linear_inputs(6, 8, 20, torch.float32, device, [])

    def step(x, h, w, b):
        return nx.cross_entropy(x, target, reduction=reduction) + nx.linear_cross_entropy(
            h, w, target, b, reduction=reduction, chunk_size=4
        )

    torch._dynamo.reset()
    inputs = [t.clone().requires_grad_(True) for t in (logits, hidden, weight, bias)]
    loss = torch.compile(step, backend="aot_eager", fullgraph=True)(*inputs)
    upstream = torch.tensor(float("nan"), device=device)
    grads = torch.autograd.grad(loss, inputs, upstream)

    def torch_step(x, h, w, b, compute):
        return torch_cross_entropy(x, target, reduction=reduction, compute=compute) + torch_cross_entropy(
            F.linear(h, w, b), target, reduction=reduction, compute=compute
        )

    _, expected, low = _torch_grads(torch_step, [logits, hidden, weight, bias], upstream)
    if every_row_ignored:
        assert all(torch.equal(g, torch.zeros_like(g)) for g in (*grads, *expected))
    assert_gradient_like_torch(grads[0], expected[0], low[0], target == -100, "dlogits")
    _assert_linear_grads_like_torch(grads[1:], expected[1:], low[1:], target)
