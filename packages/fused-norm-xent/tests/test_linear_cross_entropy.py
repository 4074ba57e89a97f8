"""linear_cross_entropy and LinearCrossEntropyLoss against the float64 reference: loss, z-loss and
the gradients of hidden, weight and bias, over several token chunks (and, for the exact weight
gradient of a low-precision weight, several vocabulary chunks)."""

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


def check(helpers, hidden, weight, target, bias=None, *, chunk_size, weight_grad="exact", **options):
    reduction = options.get("reduction", "mean")
    upstream = torch.randn(target.shape if reduction == "none" else (), device=hidden.device)
    inputs = helpers.leaves(hidden, weight, bias)

    def ours(h, w, b):
        return linear_cross_entropy(h, w, target, b, return_z_loss=True, chunk_size=chunk_size,
                                    weight_grad=weight_grad, **options)  # fmt: skip

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
    if weight_grad == "chunked" and weight.dtype != torch.float32:
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


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("weight_grad", ["exact", "fp32"])
def test_weight_grad_modes_round_once(helpers, weight_grad, reduction, device):
    """Both accurate modes against PyTorch's unchunked matmul: 64 tokens in chunks of 8 and, for
    "exact", 200 classes in chunks of 64 (the buffer's 8 x 256 elements over 64 tokens) with a
    narrower last one."""
    check(helpers, *_inputs(64, 32, 200, torch.bfloat16, device), chunk_size=8, weight_grad=weight_grad,
          reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-3)  # fmt: skip


def test_chunked_weight_grad(helpers, device):
    """weight_grad="chunked" rounds grad_weight once per chunk: compared with PyTorch doing the same."""
    check(helpers, *_inputs(64, 32, 200, torch.bfloat16, device), chunk_size=8, weight_grad="chunked")


def test_only_chunked_rounding_misses_the_unchunked_bound(device):
    """2048 tokens in 128 chunks: "exact" keeps grad_weight within 2x the error of PyTorch's
    unchunked matmul, rounding once per chunk ("chunked") does not: the bound the accurate modes
    are held to tells them apart. atol 0: the bound is then PyTorch's error alone (about 6e-5
    here, far under bf16's default atol)."""
    hidden, weight, target, _ = _inputs(2048, 16, 64, torch.bfloat16, device, bias=False)
    w64 = weight.double().requires_grad_(True)
    (expected,) = torch.autograd.grad(linear_cross_entropy_reference(hidden.double(), w64, target)[0], w64)
    w_low = weight.clone().requires_grad_(True)
    (low,) = torch.autograd.grad(torch_twin(hidden, w_low, target, None)[0], w_low)
    for mode in ("exact", "chunked"):
        w = weight.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(linear_cross_entropy(hidden, w, target, chunk_size=16, weight_grad=mode), w)
        if mode == "chunked":
            with pytest.raises(AssertionError, match="dweight"):
                assert_close_to_reference(grad, expected, low, atol=0.0, name="dweight")
        else:
            assert_close_to_reference(grad, expected, low, atol=0.0, name="dweight")


def test_memory_of_the_weight_grad_modes(device):
    """What each mode allocates, by the new tensors of every op (any device): "exact" and "chunked"
    the weight's gradient and the (chunk, V padded to 64) logits buffer and nothing else as large,
    "fp32" also the fp32 accumulator (and the gradient is its bf16 copy)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Allocations(TorchDispatchMode):
        def __init__(self, at_least):
            super().__init__()
            self.at_least, self.sizes = at_least, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not any(r.alias_info is not None for r in func._schema.returns):  # not a view, not out=
                for t in out if isinstance(out, (tuple, list)) else [out]:
                    if isinstance(t, torch.Tensor) and t.numel() >= self.at_least:
                        self.sizes.append((t.numel(), t.dtype))
            return out

    # 64 tokens in chunks of 16: a (16, 256) buffer, which the exact mode's vocabulary pass reuses
    # as (64, 64), for 200 classes in chunks of 64.
    n_tokens, hidden_size, vocab, chunk = 64, 32, 200, 16
    hidden, weight, target, _ = _inputs(n_tokens, hidden_size, vocab, torch.bfloat16, device, bias=False)
    buffer, grad = (chunk * 256, torch.bfloat16), (vocab * hidden_size, torch.bfloat16)
    accumulator = (vocab * hidden_size, torch.float32)
    expected = {"exact": [grad, buffer], "fp32": [accumulator, buffer, grad], "chunked": [grad, buffer]}
    for mode, sizes in expected.items():
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        with Allocations(at_least=chunk * 256) as allocations:
            torch.autograd.grad(linear_cross_entropy(h, w, target, chunk_size=chunk, weight_grad=mode), (h, w))
        assert allocations.sizes == sizes, (mode, allocations.sizes)


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


# bf16: grad_weight from the exact mode's vocabulary pass; fp32: accumulated in the token pass.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_all_tokens_ignored(dtype, device):
    hidden, weight, _, bias = _inputs(10, 8, 40, dtype, device)
    hidden.requires_grad_(True)
    weight.requires_grad_(True)
    target = torch.full((10,), -100, device=device)
    loss = linear_cross_entropy(hidden, weight, target, bias, chunk_size=4)
    assert loss.isnan()
    grads = torch.autograd.grad(loss, (hidden, weight))
    for grad in grads:
        assert torch.equal(grad, torch.zeros_like(grad))
    assert linear_cross_entropy(hidden, weight, target, bias, reduction="sum") == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_no_tokens(dtype, device):
    hidden, weight, target, bias = _inputs(0, 8, 40, dtype, device)
    weight.requires_grad_(True)
    loss = linear_cross_entropy(hidden, weight, target, bias)
    assert loss.isnan()
    (grad,) = torch.autograd.grad(loss, weight)
    assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize(
    "reduction, dtype, softcap, options",
    [("mean", torch.float32, 2.0, dict(label_smoothing=0.1, lse_square_scale=1e-3)),
     ("none", torch.bfloat16, 1.5, dict(label_smoothing=0.1)),
     ("sum", torch.float16, 3.0, dict(lse_square_scale=1e-2, weight_grad="chunked"))],
    ids=["mean-fp32", "none-bf16", "sum-fp16-weight-dtype-accumulation"],
)  # fmt: skip
def test_softcap(helpers, reduction, dtype, softcap, options, device):
    """33 tokens in chunks of 8 over an odd vocabulary; logits of about +-3 (bias included) on both
    sides of the cap's knee."""
    hidden, weight, target, bias = _inputs(33, 16, 301, dtype, device)
    check(helpers, hidden, weight, target, bias, chunk_size=8, reduction=reduction, softcap=softcap, **options)


def test_default_chunk_size():
    """With the vocabulary pass: N / ceil(V / H) tokens rounded up to a power of two (the logits
    buffer under twice hidden's size); without it: the largest power of two <= H."""
    assert default_chunk_size(16384, 2048, 50304, True) == 1024  # 16384 / 25 = 655.4
    assert default_chunk_size(8192, 4096, 128256, True) == 256  # 8192 / 32
    assert default_chunk_size(8192, 4096, 32000, True) == 1024  # 8192 / 8
    assert default_chunk_size(16384, 1024, 50304, True) == 512  # 16384 / 50 = 327.7
    assert default_chunk_size(16384, 100, 50304, True) == 64  # 16384 / 504 = 32.5, at least 64
    assert default_chunk_size(65536, 4096, 1000, True) == 8192  # at most 8192
    assert default_chunk_size(100, 2048, 4096, True) == 64  # 100 / 2 = 50, at least 64
    assert default_chunk_size(40, 2048, 50304, True) == 64  # the power of two covering all 40 tokens
    assert default_chunk_size(1, 2048, 50304, True) == 1
    assert default_chunk_size(16384, 2048, 50304, False) == 2048
    assert default_chunk_size(16384, 3000, 50304, False) == 2048
    assert default_chunk_size(16384, 100, 50304, False) == 256
    assert default_chunk_size(16384, 20000, 50304, False) == 8192
    assert default_chunk_size(100, 2048, 50304, False) == 128


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
@pytest.mark.parametrize("weight_grad", ["exact", "fp32", "chunked"])
def test_gpt2_vocabulary(helpers, weight_grad):
    check(helpers, *_inputs(4096, 1024, 50257, torch.bfloat16, "cuda", bias=False), chunk_size=1024,
          weight_grad=weight_grad, label_smoothing=0.1)  # fmt: skip


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
    for weight_grad in ("exact", "fp32", "chunked"):
        # 1024 tokens with the vocabulary pass ("exact"), a 98.25 MiB buffer; 2048 (196.5 MiB) without.
        chunk = default_chunk_size(n_tokens, hidden_size, vocab, weight_grad == "exact")
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss = linear_cross_entropy(hidden, weight, target, weight_grad=weight_grad)
        grads = torch.autograd.grad(loss, (hidden, weight))
        peak = (torch.cuda.max_memory_allocated() - before) / mib
        grad_hidden, grad_weight = hidden.numel() * 2 / mib, weight.numel() * 2 / mib  # the bf16 gradients
        buffer = chunk * vocab * 2 / mib
        if weight_grad == "fp32":
            # The accumulator meets the buffer during the passes, then the bf16 gradient it becomes.
            expected = grad_hidden + weight.numel() * 4 / mib + max(buffer, grad_weight)
        else:
            expected = grad_hidden + grad_weight + buffer
        assert peak <= expected + 8, (weight_grad, peak, expected)
        del loss, grads
