"""flash_attention_varlen on packed batches against the per-sequence fp64 reference, interpreter-sized."""

import pytest
import torch

from fused_attention import alibi_slopes, flash_attention, flash_attention_varlen

pytestmark = pytest.mark.kernels

BF16, FP16 = torch.bfloat16, torch.float16

# (query lengths, key lengths, heads, kv heads, options, dtype); lengths include 0 and 1.
CASES = {
    "self-causal": ([1, 17, 30, 5], None, 2, 2, {"causal": True}, BF16),
    "cross-lengths": ([1, 17, 0, 30, 5], [4, 17, 3, 25, 9], 2, 2, {}, FP16),
    "causal-alibi-per-batch": ([9, 1, 33], [14, 6, 20], 2, 1, {"causal": True, "alibi": "batch"}, BF16),
    "window-gqa": ([23, 40, 2], None, 4, 1, {"window_size": (4, 2)}, FP16),
    "causal-window-alibi": ([31, 12], [35, 12], 2, 2, {"causal": True, "window_size": (6, 0), "alibi": "heads"}, BF16),
    "causal-softcap-gqa": ([1, 25, 0, 9], None, 4, 2, {"causal": True, "softcap": 2.5}, FP16),
    "cross-dropout-gqa": ([1, 25, 0, 9], [3, 20, 4, 9], 4, 2, {"dropout_p": 0.25, "seed": 21}, BF16),
}


@pytest.mark.parametrize("case", list(CASES))
def test_packed_batches(case, attn, device):
    lengths_q, lengths_k, n_heads, n_kv_heads, options, dtype = CASES[case]
    lengths_k = lengths_q if lengths_k is None else lengths_k
    options = dict(options)
    kind = options.pop("alibi", None)
    if kind == "heads":
        options["alibi_slopes"] = alibi_slopes(n_heads, device=device)
    elif kind == "batch":
        options["alibi_slopes"] = torch.rand(len(lengths_q), n_heads, device=device) + 0.05
    q = torch.randn(sum(lengths_q), n_heads, 64, device=device).to(dtype)
    k = torch.randn(sum(lengths_k), n_kv_heads, 64, device=device).to(dtype)
    v = torch.randn(sum(lengths_k), n_kv_heads, 64, device=device).to(dtype)
    cu_q, cu_k = attn.cu_seqlens(lengths_q, device), attn.cu_seqlens(lengths_k, device)
    ours = attn.check_varlen(q, k, v, cu_q, cu_k, with_dlse=dtype == BF16, **options)
    assert ours["lse"].shape == (n_heads, sum(lengths_q))


def test_matches_dense_batch(attn, device):
    """Equal lengths: the packed result is the dense result, row for row."""
    q, k, v = attn.random_qkv(3, 21, 21, 2, 2, 64, BF16, device)
    dense, dense_lse = flash_attention(q, k, v, causal=True, return_lse=True)
    cu = attn.cu_seqlens([21] * 3, device)
    packed, packed_lse = flash_attention_varlen(
        *(t.flatten(0, 1) for t in (q, k, v)), cu, cu, 21, 21, causal=True, return_lse=True
    )
    torch.testing.assert_close(packed, dense.flatten(0, 1), rtol=0, atol=0)
    torch.testing.assert_close(packed_lse, dense_lse.transpose(0, 1).flatten(1), rtol=0, atol=0)


def test_max_seqlen_larger_than_needed(attn, device):
    """max_seqlen only bounds the lengths: a generous one gives the same result."""
    q = torch.randn(25, 2, 32, device=device).to(BF16)
    cu = attn.cu_seqlens([10, 15], device)
    tight = flash_attention_varlen(q, q, q, cu, cu, 15, 15, causal=True)
    loose = flash_attention_varlen(q, q, q, cu, cu, 40, 33, causal=True)
    torch.testing.assert_close(loose, tight, rtol=0, atol=0)


@pytest.mark.parametrize("check_seqlens", [True, False])
def test_strided_offsets(attn, device, check_seqlens):
    """cu_seqlens need not be contiguous: a strided view gives the result of the offsets it holds."""
    q = torch.randn(25, 2, 32, device=device).to(BF16)
    cu = attn.cu_seqlens([10, 15], device)
    strided = torch.zeros(6, dtype=torch.int32, device=device)[::2]
    strided.copy_(cu)
    expected = flash_attention_varlen(q, q, q, cu, cu, 15, 15, causal=True)
    out = flash_attention_varlen(q, q, q, strided, strided, 15, 15, causal=True, check_seqlens=check_seqlens)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
