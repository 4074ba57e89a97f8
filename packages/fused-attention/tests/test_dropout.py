"""Attention dropout's mask: its statistics, where its key comes from, and that every entry point
and the backward use the same one (the values against the fp64 reference are in test_attention
and test_varlen, with fixed seeds)."""

import pytest
import torch

from fused_attention import flash_attention, flash_attention_qkvpacked
from fused_attention.ops.attention import dropout_rng
from fused_attention.reference import dropout_keep_reference

BF16 = torch.bfloat16


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_mask_keeps_one_minus_p_without_structure(p):
    """Philox draws over (key, query, head, offset): the kept fraction is 1 - p overall and per
    row and column, and heads, batch rows and offsets get different masks."""
    words = dropout_rng(torch.device("cpu"), 99, 0).tolist()
    keep = dropout_keep_reference(words, p, 2, 3, 256, 256)
    assert abs(keep.float().mean().item() - (1 - p)) < 0.01
    assert (keep.float().mean(-1) - (1 - p)).abs().max().item() < 0.15
    assert (keep.float().mean(-2) - (1 - p)).abs().max().item() < 0.15
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])
    other_offset = dropout_keep_reference(dropout_rng(torch.device("cpu"), 99, 1).tolist(), p, 2, 3, 256, 256)
    assert (keep != other_offset).float().mean().item() > 0.1


def test_explicit_seed_words():
    """The seed's low and high 32-bit words and the offset, as the kernels read them (int32)."""
    seed = (0x89ABCDEF << 32) | 0x01234567
    words = dropout_rng(torch.device("cpu"), seed, 2**32 - 1).tolist()
    assert words == [0x01234567, 0x89ABCDEF - 2**32, -1]


pytestmark_kernels = pytest.mark.kernels


@pytestmark_kernels
def test_drawn_seed_follows_torch_manual_seed(attn, device):
    """seed=None draws the key from torch's generator of the device: torch.manual_seed repeats the
    mask, the next call draws another; the backward uses the forward's mask (checked against the
    reference with the words the generator gives)."""
    q, k, v = attn.random_qkv(1, 40, 40, 2, 2, 32, BF16, device)
    torch.manual_seed(5)
    first = flash_attention(q, k, v, causal=True, dropout_p=0.4)
    second = flash_attention(q, k, v, causal=True, dropout_p=0.4)
    torch.manual_seed(5)
    again = flash_attention(q, k, v, causal=True, dropout_p=0.4)
    assert torch.equal(first, again) and not torch.equal(first, second)
    torch.manual_seed(5)
    attn.check_attention(q, k, v, causal=True, dropout_p=0.4, seed=None)


@pytestmark_kernels
def test_seed_and_offset_select_the_mask(attn, device):
    q, k, v = attn.random_qkv(2, 33, 33, 2, 1, 64, BF16, device)
    base = flash_attention(q, k, v, dropout_p=0.2, seed=7)
    assert torch.equal(base, flash_attention(q, k, v, dropout_p=0.2, seed=7))
    assert not torch.equal(base, flash_attention(q, k, v, dropout_p=0.2, seed=7, seed_offset=1))
    assert not torch.equal(base, flash_attention(q, k, v, dropout_p=0.2, seed=8))
    # No dropout: seeds change nothing.
    assert torch.equal(flash_attention(q, k, v, seed=7), flash_attention(q, k, v))


@pytestmark_kernels
def test_packed_qkv_matches_views(attn, device):
    """flash_attention_qkvpacked draws the same mask as flash_attention on the views, forward and
    backward (its gradient written packed)."""
    q, k, v = attn.random_qkv(2, 30, 30, 4, 2, 32, BF16, device)
    qkv = torch.cat((q, k, v), dim=2).requires_grad_(True)
    views = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out = flash_attention_qkvpacked(qkv, n_kv_heads=2, causal=True, dropout_p=0.3, seed=4, seed_offset=2)
    expected = flash_attention(*views, causal=True, dropout_p=0.3, seed=4, seed_offset=2)
    assert torch.equal(out, expected)
    dout = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, qkv, dout)
    grads = torch.autograd.grad(expected, views, dout)
    assert torch.equal(dqkv, torch.cat(grads, dim=2))
