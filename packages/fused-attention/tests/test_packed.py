"""flash_attention_qkvpacked: the same results as flash_attention on the packed tensor's views, and
the gradient written packed."""

import pytest
import torch

from fused_attention import alibi_slopes, flash_attention, flash_attention_qkvpacked

pytestmark = pytest.mark.kernels

BF16 = torch.bfloat16


def _packed(batch, seqlen, n_heads, n_kv_heads, head_dim, device):
    return torch.randn(batch, seqlen, n_heads + 2 * n_kv_heads, head_dim, device=device).to(BF16)


def _through_views(qkv, n_heads, n_kv_heads, **options):
    q, k, v = qkv.split((n_heads, n_kv_heads, n_kv_heads), dim=2)
    return flash_attention(q, k, v, **options)


def _output_and_grad(fn, qkv, dout):
    qkv = qkv.detach().requires_grad_(True)
    out = fn(qkv)
    (grad,) = torch.autograd.grad(out, qkv, dout)
    return out, grad


@pytest.mark.parametrize(
    "n_heads, n_kv_heads, head_dim, causal, alibi",
    [(4, 4, 64, True, False), (4, 2, 64, False, True), (6, 1, 80, True, True)],
    ids=["mha-causal", "gqa-alibi", "mqa-d80-causal-alibi"],
)
@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic-dq"])
def test_matches_flash_attention_on_views(n_heads, n_kv_heads, head_dim, causal, alibi, deterministic, device):
    """Same kernels, same plans: identical outputs and gradients (the packed gradient is dQ, dK and
    dV side by side). The atomic dQ may add in another order from run to run on a GPU, so that
    case is compared at bf16 rounding (torch.testing's bf16 default) instead of bit for bit."""
    qkv = _packed(2, 37, n_heads, n_kv_heads, head_dim, device)
    dout = torch.randn(2, 37, n_heads, head_dim, device=device).to(BF16)
    options = dict(causal=causal, deterministic=deterministic)
    if alibi:
        options["alibi_slopes"] = alibi_slopes(n_heads, device=device)
    mha = n_kv_heads * 3 == n_heads + 2 * n_kv_heads
    packed_kv = None if mha else n_kv_heads

    def packed(t):
        return flash_attention_qkvpacked(t, packed_kv, **options)

    def views(t):
        return _through_views(t, n_heads, n_kv_heads, **options)

    out, grad = _output_and_grad(packed, qkv, dout)
    expected_out, expected_grad = _output_and_grad(views, qkv, dout)
    exact = deterministic or device == "cpu"  # the interpreter runs programs one after another
    tolerance = dict(rtol=0, atol=0) if exact else {}
    torch.testing.assert_close(out, expected_out, **tolerance)
    torch.testing.assert_close(grad, expected_grad, **tolerance)
    assert grad.shape == qkv.shape and grad.is_contiguous()


def test_no_grad_and_fp32_under_autocast(device):
    """Without a gradient the forward launches alone; fp32 input is cast once to the autocast dtype."""
    qkv = _packed(1, 20, 2, 2, 32, device)
    expected = _through_views(qkv, 2, 2, causal=True)
    with torch.no_grad():
        torch.testing.assert_close(flash_attention_qkvpacked(qkv, causal=True), expected, rtol=0, atol=0)
    with torch.autocast(device, dtype=BF16):
        out = flash_attention_qkvpacked(qkv.float().requires_grad_(True), causal=True)
    assert out.dtype == BF16
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize(
    "shape, n_kv_heads, match",
    [
        ((2, 8, 64), None, "4-D"),
        ((1, 8, 4, 64), None, "not a multiple of 3"),
        ((1, 8, 6, 64), 3, "too few"),
        ((1, 8, 6, 64), 0, "n_kv_heads must be a positive int"),
        ((1, 8, 6, 64), True, "n_kv_heads must be a positive int"),
        ((1, 8, 6, 48), None, "head dim 48 is not supported"),
    ],
)
def test_bad_arguments_raise_before_launch(shape, n_kv_heads, match, device):
    qkv = torch.zeros(shape, device=device, dtype=BF16)
    with pytest.raises(ValueError, match=match):
        flash_attention_qkvpacked(qkv, n_kv_heads)
