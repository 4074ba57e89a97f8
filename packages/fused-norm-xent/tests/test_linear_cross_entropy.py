"""linear_cross_entropy and LinearCrossEntropyLoss against the float64 reference: loss, z-loss and
the gradients of hidden, weight and bias, over several token chunks."""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import assert_close_to_reference, interpreting

from fused_norm_xent import LinearCrossEntropyLoss, linear_cross_entropy
from fused_norm_xent.ops.linear_cross_entropy import default_chunk_size
from fused_norm_xent.reference import cross_entropy_reference, linear_cross_entropy_reference

pytestmark = [
    pytest.mark.kernels,
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
]


def _ce_twin(
    logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0, lse_square_scale=0.0, softcap=0.0
):
    """PyTorch's cross-entropy (+ z-loss) on low-precision logits, fp32 inside as its CUDA kernels
    (the softcap too)."""
    x = logits.float()
    if softcap:
        x = softcap * torch.tanh(x / softcap)
    loss = F.cross_entropy(
        x, target.long(), ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )
    valid = target != ignore_index
    z_rows = torch.where(valid, lse_square_scale * torch.logsumexp(x, -1).square(), 0.0)
    z = {"none": z_rows, "sum": z_rows.sum(), "mean": z_rows.sum() / valid.sum()}[reduction]
    return (loss + z).to(logits.dtype), z.to(logits.dtype)


def torch_twin(hidden, weight, target, bias, **options):
    """F.linear in the low precision, then the cross-entropy twin: the unfused PyTorch baseline."""
    loss, z_loss = _ce_twin(F.linear(hidden, weight, bias).flatten(0, -2), target.flatten(), **options)
    if options.get("reduction") == "none":
        loss, z_loss = loss.view(target.shape), z_loss.view(target.shape)
    return loss, z_loss


def check(helpers, hidden, weight, target, bias=None, *, chunk_size, fp32_accumulation=True, **options):
    reduction = options.get("reduction", "mean")
    upstream = torch.randn(target.shape if reduction == "none" else (), device=hidden.device)
    inputs = helpers.leaves(hidden, weight, bias)

    def ours(h, w, b):
        return linear_cross_entropy(h, w, target, b, return_z_loss=True, chunk_size=chunk_size,
                                    fp32_accumulation=fp32_accumulation, **options)  # fmt: skip

    (loss, z_loss), grads = helpers.forward_backward(ours, inputs, [upstream], poison=True)
    assert loss.shape == (target.shape if reduction == "none" else ())
    for g, t in zip(grads, [t for t in inputs if t is not None]):
        assert g.dtype == t.dtype and g.shape == t.shape

    def reference(h, w, b):
        return linear_cross_entropy_reference(h.flatten(0, -2), w, target.flatten(), b, **options)

    (loss_ref, z_ref), grads_ref = helpers.forward_backward(
        reference,
        helpers.as_float64(*inputs),
        [upstream.double().flatten() if reduction == "none" else upstream.double()],
    )
    lowp = helpers.leaves(hidden, weight, bias)
    (loss_low, z_low), grads_low = helpers.forward_backward(
        lambda h, w, b: torch_twin(h, w, target, b, **options), lowp, [upstream]
    )
    if not fp32_accumulation and weight.dtype != torch.float32:
        grads_low = list(grads_low)
        grads_low[1] = _chunked_weight_grad_twin(hidden, weight, target, bias, upstream, chunk_size, **options)
    names = [n for n, t in zip(["dhidden", "dweight", "dbias"], inputs) if t is not None]
    results = {"loss": (loss, loss_ref.view(loss.shape), loss_low), "z_loss": (z_loss, z_ref.view(z_loss.shape), z_low)}
    results.update({n: g for n, g in zip(names, zip(grads, grads_ref, grads_low))})
    helpers.assert_all_close(results)


def _chunked_weight_grad_twin(hidden, weight, target, bias, upstream, chunk_size, **options):
    """grad_weight as PyTorch computes it when accumulating chunk by chunk in the weight's dtype."""
    logits = F.linear(hidden, weight, bias).detach().requires_grad_(True)
    (grad_logits,) = torch.autograd.grad(_ce_twin(logits, target, **options)[0], logits, upstream)
    acc = torch.zeros_like(weight)
    for start in range(0, hidden.shape[0], chunk_size):
        acc.addmm_(grad_logits[start : start + chunk_size].t(), hidden[start : start + chunk_size])
    return acc


def _inputs(n_tokens, hidden_size, vocab, dtype, device, bias=True, ignored_every=5):
    hidden = torch.randn(n_tokens, hidden_size, device=device).to(dtype)
    weight = (torch.randn(vocab, hidden_size, device=device) / hidden_size**0.5).to(dtype)
    b = (0.5 * torch.randn(vocab, device=device)).to(dtype) if bias else None
    target = torch.randint(0, vocab, (n_tokens,), device=device)
    target[::ignored_every] = -100
    return hidden, weight, target, b


@pytest.mark.parametrize(
    "reduction, dtype",
    [("mean", torch.float32), ("sum", torch.bfloat16), ("none", torch.float16), ("mean", torch.bfloat16),
     ("none", torch.float32)],
    ids=str,
)  # fmt: skip
def test_dtypes_and_reductions(helpers, dtype, reduction, device):
    """37 tokens in chunks of 16 (the last one partial), with bias, smoothing and z-loss."""
    check(helpers, *_inputs(37, 24, 300, dtype, device), chunk_size=16, reduction=reduction, label_smoothing=0.1,
          lse_square_scale=1e-3)  # fmt: skip


@pytest.mark.parametrize("smoothing, z", [(0.0, 0.0), (0.2, 1e-2)])
def test_without_bias_and_options(helpers, smoothing, z, device):
    check(helpers, *_inputs(29, 16, 1000, torch.float32, device, bias=False), chunk_size=8,
          label_smoothing=smoothing, lse_square_scale=z)  # fmt: skip


def test_one_chunk_wide_vocabulary(helpers, device):
    """9000 classes: the chunk logits rows stream through the kernel in 8192-wide pieces."""
    check(helpers, *_inputs(6, 8, 9000, torch.bfloat16, device), chunk_size=4, reduction="none")


def test_weight_dtype_accumulation(helpers, device):
    """fp32_accumulation=False rounds grad_weight once per chunk: compared with PyTorch doing the same."""
    check(helpers, *_inputs(64, 32, 200, torch.bfloat16, device), chunk_size=8, fp32_accumulation=False)


def test_leading_dims_int32_targets_and_ignore_index(helpers, device):
    hidden, weight, target, bias = _inputs(30, 16, 120, torch.float32, device)
    target = target.masked_fill(target == -100, 7).to(torch.int32)
    check(helpers, hidden.view(5, 6, 16), weight, target.view(5, 6), bias, chunk_size=7, ignore_index=7,
          reduction="none")  # fmt: skip


def test_gradients_only_where_required(device):
    hidden, weight, target, bias = _inputs(12, 8, 50, torch.float32, device)
    weight.requires_grad_(True)
    loss = linear_cross_entropy(hidden, weight, target, bias, chunk_size=4)
    (grad,) = torch.autograd.grad(loss, weight)
    w64 = weight.detach().double().requires_grad_(True)
    (expected,) = torch.autograd.grad(linear_cross_entropy_reference(hidden, w64, target, bias)[0], w64)
    assert_close_to_reference(grad, expected, name="dweight")
    with torch.no_grad():
        no_grad_loss = linear_cross_entropy(hidden, weight, target, bias, chunk_size=4)
    assert torch.equal(no_grad_loss, loss.detach())


def test_all_tokens_ignored(device):
    hidden, weight, _, bias = _inputs(10, 8, 40, torch.float32, device)
    hidden.requires_grad_(True)
    target = torch.full((10,), -100, device=device)
    loss = linear_cross_entropy(hidden, weight, target, bias, chunk_size=4)
    assert loss.isnan()
    (grad,) = torch.autograd.grad(loss, hidden)
    assert torch.equal(grad, torch.zeros_like(grad))
    assert linear_cross_entropy(hidden, weight, target, bias, reduction="sum") == 0


def test_no_tokens(device):
    hidden, weight, target, bias = _inputs(0, 8, 40, torch.float32, device)
    weight.requires_grad_(True)
    loss = linear_cross_entropy(hidden, weight, target, bias)
    assert loss.isnan()
    (grad,) = torch.autograd.grad(loss, weight)
    assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize(
    "reduction, dtype, softcap, options",
    [("mean", torch.float32, 2.0, dict(label_smoothing=0.1, lse_square_scale=1e-3)),
     ("none", torch.bfloat16, 1.5, dict(label_smoothing=0.1)),
     ("sum", torch.float16, 3.0, dict(lse_square_scale=1e-2, fp32_accumulation=False))],
    ids=["mean-fp32", "none-bf16", "sum-fp16-weight-dtype-accumulation"],
)  # fmt: skip
def test_softcap(helpers, reduction, dtype, softcap, options, device):
    """33 tokens in chunks of 8 over an odd vocabulary; logits of about +-3 (bias included) on both
    sides of the cap's knee."""
    hidden, weight, target, bias = _inputs(33, 16, 301, dtype, device)
    check(helpers, hidden, weight, target, bias, chunk_size=8, reduction=reduction, softcap=softcap, **options)


def test_default_chunk_size():
    assert default_chunk_size(16384, 2048) == 2048
    assert default_chunk_size(16384, 4096) == 4096
    assert default_chunk_size(16384, 100) == 256
    assert default_chunk_size(100, 2048) == 128
    assert default_chunk_size(1, 2048) == 1
    assert default_chunk_size(16384, 20000) == 8192


def test_module(device):
    hidden, weight, target, bias = _inputs(20, 16, 64, torch.float32, device)
    module = LinearCrossEntropyLoss(label_smoothing=0.1, lse_square_scale=1e-3, return_z_loss=True, chunk_size=8)
    loss, z_loss = module(hidden, weight, target, bias)
    expected, expected_z = cross_entropy_reference(
        F.linear(hidden.double(), weight.double(), bias.double()), target, label_smoothing=0.1, lse_square_scale=1e-3
    )
    assert_close_to_reference(loss, expected, name="loss")
    assert_close_to_reference(z_loss, expected_z, name="z_loss")


@pytest.mark.gpu(reason="the GPT-2 vocabulary at 4096 tokens: a float64 reference of 1.6 GB")
@pytest.mark.parametrize("fp32_accumulation", [True, False])
def test_gpt2_vocabulary(helpers, fp32_accumulation):
    check(helpers, *_inputs(4096, 1024, 50257, torch.bfloat16, "cuda", bias=False), chunk_size=1024,
          fp32_accumulation=fp32_accumulation, label_smoothing=0.1)  # fmt: skip


@pytest.mark.parametrize("hidden_in_autocast_dtype", [False, True], ids=["fp32-hidden", "lowp-hidden"])
@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(torch.float16, id="fp16"),
        pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.skipif(
            interpreting(), reason="Triton's interpreter truncates fp32 -> bf16 casts: the bf16 logits gradients "
            "summed into the fp32 bias gradient are then biased, which the GPU's rounding does not do")),
    ],
)  # fmt: skip
def test_autocast_fp32_weights(dtype, hidden_in_autocast_dtype, device):
    """Under autocast (AMP: fp32 parameters, activations possibly already in the autocast dtype)
    the matmuls run in the autocast dtype, the loss is fp32 as F.cross_entropy's there, and every
    input gets its gradient in its own dtype (on the CPU when interpreting: torch.autocast("cpu")
    takes the same path)."""
    hidden, weight, target, bias = _inputs(64, 32, 100, torch.float32, device)
    if hidden_in_autocast_dtype:
        hidden = hidden.to(dtype)
    hidden, weight, bias = (t.requires_grad_(True) for t in (hidden, weight, bias))
    with torch.autocast(device, dtype=dtype):
        loss = linear_cross_entropy(hidden, weight, target, bias, chunk_size=16)
    grads = torch.autograd.grad(loss, (hidden, weight, bias))
    assert loss.dtype == torch.float32 and [g.dtype for g in grads] == [hidden.dtype] + [torch.float32] * 2
    ref_inputs = [t.detach().double().requires_grad_(True) for t in (hidden, weight, bias)]
    ref_loss = linear_cross_entropy_reference(*ref_inputs[:2], target, ref_inputs[2])[0]
    ref_grads = torch.autograd.grad(ref_loss, ref_inputs)
    with torch.autocast(device, dtype=dtype):
        low_loss = F.cross_entropy(F.linear(hidden, weight, bias).float(), target)  # autocast's fp32 loss
    low_grads = torch.autograd.grad(low_loss, (hidden, weight, bias))
    assert_close_to_reference(loss, ref_loss, low_loss, name="loss")
    for name, g, r, lo in zip(["dhidden", "dweight", "dbias"], grads, ref_grads, low_grads):
        assert_close_to_reference(g, r, lo, name=name)


@pytest.mark.gpu(reason="peak memory of the headline shape on a CUDA device")
def test_headline_memory_is_the_gradients_plus_one_chunk():
    n_tokens, hidden_size, vocab = 16384, 2048, 50304
    hidden, weight, target, _ = _inputs(n_tokens, hidden_size, vocab, torch.bfloat16, "cuda", bias=False)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    mib = 2**20
    # The first cuBLAS call of a process allocates cuBLAS' workspace (32 MiB on an H100) through
    # torch's allocator: not this function's memory, but counted if this test runs first in its
    # process (it did under pytest-xdist: 687.6 MiB against 653.5 + 8).
    torch.autograd.grad(linear_cross_entropy(hidden[:64], weight, target[:64]), (hidden, weight))
    for fp32_accumulation, chunk in ((True, 2048), (False, 1024)):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss = linear_cross_entropy(hidden, weight, target, chunk_size=chunk, fp32_accumulation=fp32_accumulation)
        grads = torch.autograd.grad(loss, (hidden, weight))
        peak = (torch.cuda.max_memory_allocated() - before) / mib
        outputs = (hidden.numel() + weight.numel()) * 2 / mib  # the two bf16 gradients
        chunk_logits = chunk * vocab * 2 / mib
        accumulator = weight.numel() * 4 / mib if fp32_accumulation else 0.0
        # fp32: the accumulator and the bf16 gradient it becomes coexist at the end (the chunk is gone).
        expected = outputs + (accumulator if fp32_accumulation else chunk_logits)
        assert peak <= expected + 8, (fp32_accumulation, peak, expected)
        del loss, grads
