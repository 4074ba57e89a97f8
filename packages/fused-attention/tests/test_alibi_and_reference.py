"""The ALiBi slopes helper, and the reference itself against PyTorch's SDPA with an explicit mask.

No kernels: these run on every machine.
"""

import math

import pytest
import torch

from fused_attention import alibi_slopes
from fused_attention.reference import attention_reference


@pytest.mark.parametrize("n_heads", [1, 2, 8, 16, 64])
def test_alibi_slopes_power_of_two(n_heads):
    """2^(-8 i / n) for i = 1..n: the geometric sequence of the ALiBi paper."""
    expected = torch.tensor([2.0 ** (-8.0 * i / n_heads) for i in range(1, n_heads + 1)])
    torch.testing.assert_close(alibi_slopes(n_heads), expected, rtol=1e-7, atol=0)


@pytest.mark.parametrize("n_heads", [3, 6, 12, 20, 40])
def test_alibi_slopes_other_counts(n_heads):
    """The nearest lower power of two's slopes, then every other slope of the next power of two."""
    low = 2 ** int(math.log2(n_heads))
    slopes = alibi_slopes(n_heads)
    assert slopes.dtype == torch.float32 and slopes.shape == (n_heads,)
    torch.testing.assert_close(slopes[:low], alibi_slopes(low), rtol=0, atol=0)
    torch.testing.assert_close(slopes[low:], alibi_slopes(2 * low)[0::2][: n_heads - low], rtol=0, atol=0)
    assert bool((slopes > 0).all() and (slopes < 1).all())


def _explicit_bias(seqlen_q, seqlen_k, causal, window, slopes):
    """(H, S_q, S_k) additive mask written with plain loops: 0 / -inf visibility plus the ALiBi bias."""
    n_heads = 1 if slopes is None else len(slopes)
    bias = torch.zeros(n_heads, seqlen_q, seqlen_k, dtype=torch.float64)
    left, right = window
    for i in range(seqlen_q):
        for j in range(seqlen_k):
            rel = j - (i + seqlen_k - seqlen_q)
            hidden = (causal and rel > 0) or (right >= 0 and rel > right) or (left >= 0 and rel < -left)
            for h in range(n_heads):
                if hidden:
                    bias[h, i, j] = -math.inf
                elif slopes is not None:
                    bias[h, i, j] = -float(slopes[h]) * abs(rel)
    return bias


@pytest.mark.parametrize(
    "seqlen_q, seqlen_k, causal, window, alibi",
    [
        (7, 7, True, (-1, -1), False),
        (5, 9, True, (-1, -1), True),
        (9, 6, False, (2, 1), True),
        (6, 6, False, (-1, 2), False),
    ],
)
def test_reference_matches_sdpa_with_explicit_mask(seqlen_q, seqlen_k, causal, window, alibi):
    torch.manual_seed(0)
    q = torch.randn(2, 4, seqlen_q, 16, dtype=torch.float64)
    k = torch.randn(2, 4, seqlen_k, 16, dtype=torch.float64)
    v = torch.randn(2, 4, seqlen_k, 16, dtype=torch.float64)
    slopes = alibi_slopes(4) if alibi else None
    out, lse = attention_reference(q, k, v, causal, None, slopes, window, layout="bhsd")
    bias = _explicit_bias(seqlen_q, seqlen_k, causal, window, slopes)
    visible_rows = torch.isfinite(bias).any(-1)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    expected = expected.masked_fill(~visible_rows[..., None], 0.0)  # SDPA gives NaN where we define 0
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    expected_lse = torch.logsumexp(q @ k.transpose(-1, -2) / 4.0 + bias, dim=-1)
    torch.testing.assert_close(lse, expected_lse, rtol=1e-12, atol=1e-12)
