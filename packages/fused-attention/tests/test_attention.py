"""flash_attention forward and every gradient against the fp64 reference, interpreter-sized.

Each check runs our kernels (allocations poisoned), the fp64 reference and the low-precision
twin (see _helpers.py) on fresh random inputs and compares out, lse, dq, dk and dv. The
interpreter runs small blocks (configs.INTERPRETER_CONFIGS), so these shapes span several query
and key blocks, ragged tails, and both the masked and the fully visible loop ranges.
"""

import pytest
import torch

from fused_attention import alibi_slopes

pytestmark = pytest.mark.kernels

FP16, BF16 = torch.float16, torch.bfloat16

# (batch, seqlen_q, seqlen_k, heads, kv heads, head dim, options, dtypes): each mask/bias/length case
# once, the first three in both dtypes, the others alternating so that cases with the same
# mask/bias flags share a dtype (every kernel specialization is a compile when the suite runs on a
# GPU; sizes are not specialized, so equal flags, dtype and head dim share one).
BOTH = (FP16, BF16)
CASES = {
    "plain": (2, 37, 50, 2, 2, 64, {}, BOTH),
    "causal-short-q": (2, 37, 50, 2, 1, 64, {"causal": True}, BOTH),
    "alibi-causal": (2, 45, 45, 4, 2, 64, {"causal": True, "alibi": "heads"}, BOTH),
    "causal-long-q-empty-rows": (1, 50, 20, 2, 2, 64, {"causal": True}, (FP16,)),
    "causal-aligned-blocks": (1, 64, 64, 2, 2, 32, {"causal": True}, (BF16,)),
    # Causal grids run block-major in groups of 8 batch-heads: 18 query (8 + 8 + 2) and 9 KV (8 + 1).
    "causal-head-groups": (3, 40, 40, 6, 3, 32, {"causal": True}, (BF16,)),
    "length-1": (3, 1, 1, 2, 1, 64, {"causal": True}, (FP16,)),
    "decode-q1": (2, 1, 33, 2, 2, 64, {"causal": True}, (BF16,)),
    "one-key": (2, 33, 1, 2, 2, 64, {}, (FP16,)),
    "alibi-per-batch": (2, 30, 41, 2, 2, 64, {"alibi": "batch"}, (BF16,)),
    # Blocks far below and far above the diagonal (ALiBi's rank-1 form) beside near ones: in the
    # forward here, in the dK/dV kernel's causal range with a longer sequence.
    "alibi-far-both-sides": (1, 100, 40, 2, 1, 64, {"alibi": "batch"}, (BF16,)),
    "alibi-far-causal": (1, 130, 130, 2, 1, 32, {"causal": True, "alibi": "batch"}, (BF16,)),
    "alibi-sliding-window": (1, 50, 50, 2, 2, 64, {"causal": True, "window_size": (9, 0), "alibi": "heads"}, (FP16,)),
    "window-both-sides": (1, 40, 47, 2, 2, 64, {"window_size": (5, 3)}, (BF16,)),
    "window-right-only": (1, 33, 33, 2, 2, 64, {"window_size": (-1, 4)}, (FP16,)),
    "window-left-only": (1, 33, 40, 2, 1, 64, {"window_size": (6, -1)}, (BF16,)),
    "window-empty-rows": (1, 60, 20, 2, 2, 64, {"window_size": (2, 1)}, (BF16,)),
    "window-one-key-q": (1, 33, 1, 2, 2, 64, {"window_size": (5, 3)}, (FP16,)),
    "softmax-scale": (1, 29, 35, 2, 2, 64, {"softmax_scale": 0.3, "causal": True}, (FP16,)),
    # Full range of 4 query blocks, 3 key blocks: the middle one starts its query loop mid-range
    # (atomic dQ), the last one is ragged (all its query blocks masked).
    "full-rotated-start": (1, 70, 80, 2, 1, 32, {}, (BF16,)),
    # Softcapped scores (Gemma-2): caps of 2 and 3 bend unit-variance scores far from linear.
    "softcap-causal": (2, 37, 50, 2, 1, 64, {"causal": True, "softcap": 2.0}, BOTH),
    "softcap-alibi-far-both-sides": (1, 100, 40, 2, 1, 64, {"alibi": "batch", "softcap": 3.0}, (FP16,)),
    "softcap-sliding-window": (1, 40, 47, 2, 2, 64, {"window_size": (5, 3), "softcap": 50.0}, (BF16,)),
    # Dropout with fixed seeds (the reference regenerates the kernels' Philox mask), across the
    # masked, fully visible and ALiBi-far loops.
    "dropout-causal": (2, 37, 50, 2, 1, 64, {"causal": True, "dropout_p": 0.3, "seed": 11}, BOTH),
    "dropout-softcap-alibi-far": (
        1,
        100,
        40,
        2,
        1,
        64,
        {"alibi": "batch", "softcap": 3.0, "dropout_p": 0.1, "seed": 2**40 + 5},
        (BF16,),
    ),  # fmt: skip
    "dropout-window": (1, 40, 47, 2, 2, 64, {"window_size": (5, 3), "dropout_p": 0.5, "seed": 3}, (FP16,)),
}
DTYPE_IDS = {FP16: "fp16", BF16: "bf16"}


def _options(options: dict, batch: int, n_heads: int, device) -> dict:
    options = dict(options)
    kind = options.pop("alibi", None)
    if kind == "heads":
        options["alibi_slopes"] = alibi_slopes(n_heads, device=device)
    elif kind == "batch":
        options["alibi_slopes"] = torch.rand(batch, n_heads, device=device) + 0.05
    return options


@pytest.mark.parametrize(
    "case, dtype",
    [pytest.param(case, dtype, id=f"{case}-{DTYPE_IDS[dtype]}") for case in CASES for dtype in CASES[case][-1]],
)
def test_masks_bias_and_lengths(case, dtype, attn, device):
    batch, seqlen_q, seqlen_k, n_heads, n_kv_heads, head_dim, options, _ = CASES[case]
    q, k, v = attn.random_qkv(batch, seqlen_q, seqlen_k, n_heads, n_kv_heads, head_dim, dtype, device)
    attn.check_attention(q, k, v, with_dlse=True, **_options(options, batch, n_heads, device))


@pytest.mark.parametrize(
    "head_dim, dtype, options",
    [
        (16, FP16, {"causal": True}),
        (32, BF16, {}),
        (80, FP16, {"causal": True, "alibi": "heads"}),
        (96, BF16, {"window_size": (7, 2)}),
        (128, BF16, {"causal": True}),
        (160, FP16, {"alibi": "heads"}),
        (192, BF16, {"causal": True}),
        (256, FP16, {"causal": True, "window_size": (5, 0)}),
    ],
    ids=lambda x: f"d{x}" if isinstance(x, int) else None,
)
def test_head_dims(head_dim, dtype, options, attn, device):
    q, k, v = attn.random_qkv(1, 20, 26, 2, 1, head_dim, dtype, device)
    attn.check_attention(q, k, v, **_options(options, 1, 2, device))


@pytest.mark.parametrize(
    "n_heads, n_kv_heads, seqlen, options",
    [(8, 1, 24, {"causal": True}), (32, 1, 9, {}), (8, 2, 21, {"causal": True, "alibi": "heads"})],
    ids=["gqa-8to1", "mqa-32to1", "gqa-4to1-alibi"],
)
def test_grouped_query_heads(n_heads, n_kv_heads, seqlen, options, attn, device):
    """dK/dV sum over the query heads that share a kv head (reduced in registers, no atomics)."""
    q, k, v = attn.random_qkv(2, seqlen, seqlen + 3, n_heads, n_kv_heads, 32, BF16, device)
    attn.check_attention(q, k, v, **_options(options, 2, n_heads, device))


@pytest.mark.parametrize("options", [{}, {"causal": True, "alibi": "heads"}], ids=["plain", "causal-alibi"])
def test_sdpa_layout(options, attn, device):
    q, k, v = attn.random_qkv(2, 33, 40, 4, 2, 64, FP16, device, layout="bhsd")
    ours = attn.check_attention(q, k, v, layout="bhsd", **_options(options, 2, 4, device))
    assert ours["out"].shape == q.shape and ours["out"].is_contiguous()


def test_packed_qkv_views_without_copies(attn, device):
    """q, k, v as strided views of one (B, S, 3, H, D) projection, in both layouts."""
    qkv = torch.randn(2, 30, 3, 4, 64, device=device).to(BF16)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    attn.check_attention(q, k, v, causal=True)
    attn.check_attention(*(t.transpose(1, 2) for t in (q, k, v)), layout="bhsd")


def test_non_contiguous_inputs(attn, device):
    """Sliced batch/positions/heads, and a head dim with stride 2 (the one case that is copied)."""
    big = torch.randn(3, 50, 6, 128, device=device).to(FP16)
    q = big[1:, 5:40, 1:5, :64]
    k = big[:2, 10:50, ::3, 64:]
    v = big[:2, :40, 2:4, 64:]
    attn.check_attention(q, k, v, causal=True)
    strided = torch.randn(2, 24, 2, 128, device=device).to(FP16)[..., ::2]
    attn.check_attention(strided, strided.flip(1), strided, window_size=(4, 4))


def test_lse_gradient_and_values(attn, device):
    """return_lse gives fp32 (B, H, S_q); a gradient through the LSE reaches q and k."""
    q, k, v = attn.random_qkv(2, 26, 31, 2, 2, 64, BF16, device)
    ours = attn.check_attention(q, k, v, with_dlse=True, causal=True, window_size=(6, 0))
    assert ours["lse"].dtype == torch.float32 and ours["lse"].shape == (2, 2, 26)


def test_rows_that_see_no_key(attn, device):
    """Causal with S_q > S_k: the first S_q - S_k queries see nothing: out 0, lse -inf, zero grads."""
    q, k, v = attn.random_qkv(1, 40, 15, 2, 2, 64, FP16, device)
    ours = attn.check_attention(q, k, v, causal=True)
    empty = slice(0, 25)
    assert torch.all(ours["out"][:, empty] == 0)
    assert torch.all(ours["lse"][:, :, empty] == -float("inf"))
    assert torch.all(ours["dq"][:, empty] == 0)


@pytest.mark.parametrize(
    "batch, seqlen_q, seqlen_k, n_heads, n_kv_heads, head_dim, options",
    [
        (2, 37, 50, 4, 2, 64, {"causal": True, "alibi": "heads"}),
        (1, 70, 80, 2, 1, 32, {"window_size": (20, 9)}),
        (1, 50, 20, 2, 2, 128, {"causal": True}),
        (1, 100, 90, 2, 1, 32, {"alibi": "batch"}),
        (1, 100, 90, 2, 1, 32, {"alibi": "batch", "softcap": 3.0}),
        (2, 37, 50, 2, 1, 64, {"causal": True, "softcap": 2.0}),
        (2, 37, 50, 4, 2, 64, {"causal": True, "dropout_p": 0.2, "seed": 9}),
    ],
    ids=[
        "gqa-causal-alibi",
        "window",
        "empty-rows-d128",
        "alibi-far-both-sides",
        "softcap-alibi-far",
        "softcap-causal",
        "gqa-dropout-causal",
    ],  # fmt: skip
)
def test_deterministic_backward(batch, seqlen_q, seqlen_k, n_heads, n_kv_heads, head_dim, options, attn, device):
    """deterministic=True: dQ from its own kernel (no atomics), as checked as the default path."""
    q, k, v = attn.random_qkv(batch, seqlen_q, seqlen_k, n_heads, n_kv_heads, head_dim, BF16, device)
    attn.check_attention(q, k, v, with_dlse=True, deterministic=True, **_options(options, batch, n_heads, device))


@pytest.mark.filterwarnings("ignore:overflow encountered in exp2")  # the interpreter, in lanes it then discards
def test_very_negative_scores_with_ragged_keys(attn, device):
    """Every score about -200 (LSE far below 0) and a ragged last key block: the missing keys' zero
    rows would score 0, whose exp2(0 - LSE) overflows; they must not reach dQ (as inf * 0)."""
    q = torch.full((1, 40, 2, 32), 6.0, device=device).to(BF16)
    k = torch.full((1, 45, 2, 32), -6.0, device=device).to(BF16)
    v = torch.randn(1, 45, 2, 32, device=device).to(BF16)
    ours = attn.check_attention(q, k, v)
    assert torch.isfinite(ours["dq"]).all()


def test_softcap_saturated_scores(attn, device):
    """Scores in the hundreds against a cap of 1: every tanh saturates (its derivative underflows
    towards 0), and out, lse and the gradients stay finite and match the reference."""
    q, k, v = attn.random_qkv(1, 33, 40, 2, 1, 32, FP16, device)
    ours = attn.check_attention(q * 16, k * 16, v, causal=True, softcap=1.0)
    assert all(torch.isfinite(ours[name]).all() for name in ("out", "lse", "dq", "dk", "dv"))
