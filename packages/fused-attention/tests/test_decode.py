"""flash_attention_with_kvcache: against the per-row fp64 reference and the low-precision twin (the
project's rule), the in-place append, memory safety whatever cache_seqlens holds, the split choice,
the argument checks, and the kernels' ahead-of-time compiles. Interpreter-sized shapes, except the
GPU cases at the end."""

from __future__ import annotations

import pytest
import torch
import triton
from tritonformer_testkit import assert_close_to_reference, poisoned_allocations
from tritonformer_testkit.aot import compile_to_cubin, shared_memory_bytes
from tritonformer_testkit.runtime import triton_version

from fused_attention import alibi_slopes
from fused_attention.kernels.decode import _decode_combine_kernel, _decode_split_kernel
from fused_attention.ops.decode import (
    MAX_SPLITS,
    DecodeSpec,
    block_sizes,
    choose_splits,
    flash_attention_with_kvcache,
)
from fused_attention.reference_decode import attention_with_kvcache_reference, rotary_reference

BF16, FP16, F32 = torch.bfloat16, torch.float16, torch.float32


def make_inputs(batch, seqlen_q, n_heads, n_kv_heads, head_dim, capacity, lengths, new, dtype, device):
    """q, k_cache, v_cache, cache_seqlens, k_new, v_new (None without new) with unit-variance entries."""

    def randn(*shape):
        return torch.randn(shape, device=device).to(dtype)

    q = randn(batch, seqlen_q, n_heads, head_dim)
    k_cache, v_cache = randn(batch, capacity, n_kv_heads, head_dim), randn(batch, capacity, n_kv_heads, head_dim)
    k_new = randn(batch, seqlen_q, n_kv_heads, head_dim) if new else None
    v_new = randn(batch, seqlen_q, n_kv_heads, head_dim) if new else None
    return q, k_cache, v_cache, torch.tensor(lengths, dtype=torch.int32, device=device), k_new, v_new


def twin_out(attn, q, k_after, v_after, cache_seqlens, added, causal=True, alibi_slopes=None, window_size=(-1, -1),
             softmax_scale=None) -> torch.Tensor:  # fmt: skip
    """The FlashAttention-2 algorithm in q's dtype (conftest's lowp_twin), one batch row at a time."""
    outs = []
    for b, length in enumerate(cache_seqlens.tolist()):
        keys = slice(0, length + added)
        slopes = None if alibi_slopes is None else (alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b])
        row = attn.lowp_twin(
            q[b : b + 1], k_after[b : b + 1, keys], v_after[b : b + 1, keys], torch.zeros_like(q[b : b + 1]),
            causal=causal, softmax_scale=softmax_scale, alibi_slopes=slopes, window_size=window_size,
        )  # fmt: skip
        outs.append(row["out"])
    return torch.cat(outs)


def rope_tables(positions: int, rotary_dim: int, dtype=torch.float32, device="cpu"):
    """cos, sin (positions, rotary_dim) of the rotate-half angles pos * 10000^(-2j / rotary_dim)."""
    inv_freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inv_freq).repeat(1, 2)
    return angles.cos().to(device, dtype), angles.sin().to(device, dtype)


def assert_within_one_rounding(ours: torch.Tensor, expected: torch.Tensor, scale: float) -> None:
    """ours within one unit in the last place of expected (an fp64 result rounded once), plus the
    fp32 arithmetic's own error (2^-22 of the operands' `scale`): what 'computed in fp32 and
    rounded once' allows."""
    infinity = torch.full_like(expected, float("inf"))
    ulp = (torch.nextafter(expected.abs(), infinity) - expected.abs()).float()
    error = (ours.float() - expected.float()).abs()
    assert bool((error <= ulp + scale * 2**-22).all()), f"max error {error.max().item():.3g}"


def check_decode(attn, q, k_cache, v_cache, cache_seqlens, k_new=None, v_new=None, **options) -> torch.Tensor:
    """Run the kernel on copies of the caches (every allocation poisoned) and check the output
    under the tolerance rule and the caches: k_new/v_new at their positions (rotated keys within
    one rounding, everything else exactly), the rest kept."""
    reference_options = {name: value for name, value in options.items() if name != "num_splits"}
    expected, _, k_after, v_after = attention_with_kvcache_reference(
        q, k_cache, v_cache, cache_seqlens, k_new, v_new, **reference_options
    )
    ours_k, ours_v = k_cache.clone(), v_cache.clone()
    with poisoned_allocations():
        out = flash_attention_with_kvcache(q, ours_k, ours_v, cache_seqlens, k_new, v_new, **options)
    assert out.shape == q.shape and out.dtype == q.dtype and out.is_contiguous()
    rotary_cos, rotary_sin = reference_options.pop("rotary_cos", None), reference_options.pop("rotary_sin", None)
    if rotary_cos is None:
        assert torch.equal(ours_k, k_after), "the key cache after the append"
    else:
        new_rows = torch.zeros(k_cache.shape[:2], dtype=torch.bool, device=k_cache.device)
        for b, length in enumerate(cache_seqlens.tolist()):
            new_rows[b, length : length + q.shape[1]] = True
        assert torch.equal(ours_k[~new_rows], k_after[~new_rows]), "the key cache outside the appended rows"
        assert_within_one_rounding(ours_k[new_rows], k_after[new_rows], k_new.abs().max().item())
        positions = cache_seqlens.long()[:, None] + torch.arange(q.shape[1], device=q.device)
        q = rotary_reference(q, positions, rotary_cos, rotary_sin)
        k_after = ours_k  # the twin attends to the keys the kernel rotated
    assert torch.equal(ours_v, v_after), "the value cache after the append"
    added = 0 if k_new is None else q.shape[1]
    twin = twin_out(attn, q, k_after, v_after, cache_seqlens, added, **reference_options)
    assert_close_to_reference(out, expected, twin, name="out")
    return out


# (batch, S_q, heads, kv heads, head dim, S_max, lengths, new keys, options, dtype). Lengths include
# 0, 1, odd ones and S_max (the full cache, or full after the append).
# fmt: off
CASES = {
    "decode-gqa4-odd-full": (3, 1, 8, 2, 32, 150, [37, 1, 149], True, {}, BF16),
    "decode-mha-auto-splits": (1, 1, 2, 2, 64, 200, [123], True, {}, FP16),
    "decode-mqa-no-new-full": (2, 1, 4, 1, 128, 70, [70, 1], False, {"num_splits": 2}, BF16),
    "decode-empty-caches": (2, 1, 4, 4, 16, 20, [0, 0], True, {"num_splits": 3}, FP16),
    "sq3-causal-alibi": (2, 3, 4, 4, 16, 90, [0, 61], True, {"alibi": "heads", "num_splits": 2}, FP16),
    "sq3-no-new-short-rows": (2, 3, 4, 2, 32, 80, [2, 77], False, {"num_splits": 3}, BF16),
    "window-alibi-per-row": (2, 1, 4, 2, 64, 160, [5, 140], True,
                             {"window_size": (20, 0), "alibi": "rows", "num_splits": 4}, FP16),
    "noncausal-window-d80": (2, 3, 2, 1, 80, 64, [33, 50], True,
                             {"causal": False, "window_size": (7, 1), "num_splits": 2}, BF16),
    "rows-over-one-block": (1, 3, 32, 1, 16, 40, [20], True, {"softmax_scale": 0.3}, BF16),
    "d256-group16-row-blocks": (1, 3, 32, 2, 256, 70, [45], True, {}, BF16),
    "rotary-gqa4-full": (3, 1, 8, 2, 64, 150, [37, 1, 149], True, {"rotary": (64, torch.float32)}, BF16),
    "rotary-partial-sq3-splits": (2, 3, 4, 2, 32, 80, [0, 61], True,
                                  {"rotary": (16, torch.float32), "num_splits": 3}, FP16),
    "rotary-d80-bf16-tables-window": (2, 2, 4, 4, 80, 64, [5, 62], True,
                                      {"rotary": (80, BF16), "window_size": (9, 0)}, BF16),
}
# fmt: on


@pytest.mark.kernels
@pytest.mark.parametrize("case", list(CASES))
def test_against_the_reference(case, attn, device):
    batch, seqlen_q, n_heads, n_kv_heads, head_dim, capacity, lengths, new, options, dtype = CASES[case]
    options = dict(options)
    kind = options.pop("alibi", None)
    if kind == "heads":
        options["alibi_slopes"] = alibi_slopes(n_heads, device=device)
    elif kind == "rows":  # small slopes: keys at the window's far edge still weigh
        options["alibi_slopes"] = 0.1 * torch.rand(batch, n_heads, device=device) + 0.01
    if "rotary" in options:  # tables with a few positions past the cache
        rotary_dim, table_dtype = options.pop("rotary")
        options["rotary_cos"], options["rotary_sin"] = rope_tables(capacity + 5, rotary_dim, table_dtype, device)
    inputs = make_inputs(batch, seqlen_q, n_heads, n_kv_heads, head_dim, capacity, lengths, new, dtype, device)
    check_decode(attn, *inputs, **options)


@pytest.mark.kernels
def test_split_counts_agree(attn, device):
    """One split (the output written directly) and several (partials and the combine kernel) both
    meet the rule, and they differ (else the split path was never taken)."""
    q, k_cache, v_cache, lengths, k_new, v_new = make_inputs(1, 1, 4, 2, 32, 130, [129], True, BF16, device)
    outs = [check_decode(attn, q, k_cache, v_cache, lengths, k_new, v_new, num_splits=n) for n in (1, 3)]
    assert not torch.equal(outs[0], outs[1])


@pytest.mark.kernels
def test_strided_views_and_appending_token_by_token(attn, device):
    """q, k_new and v_new as strided views of one fused projection (B, S, H + 2 H_kv, D), the caches
    views of a larger buffer; appending one token at a time equals appending them at once."""
    heads, kv_heads, head_dim = 4, 2, 32
    qkv = torch.randn(2, 3, heads + 2 * kv_heads, head_dim, device=device).to(BF16)
    q, k_new, v_new = qkv.split([heads, kv_heads, kv_heads], dim=2)
    buffer = torch.randn(2, 2, 40, kv_heads, head_dim, device=device).to(BF16)
    k_cache, v_cache = buffer[0], buffer[1]
    lengths = torch.tensor([9, 30], dtype=torch.int32, device=device)
    check_decode(attn, q, k_cache, v_cache, lengths, k_new, v_new)
    at_once_k, at_once_v = k_cache.clone(), v_cache.clone()
    flash_attention_with_kvcache(q, at_once_k, at_once_v, lengths, k_new, v_new)
    for i in range(3):
        flash_attention_with_kvcache(q[:, i : i + 1], k_cache, v_cache, lengths + i, k_new[:, i : i + 1],
                                     v_new[:, i : i + 1])  # fmt: skip
    assert torch.equal(k_cache, at_once_k) and torch.equal(v_cache, at_once_v)


@pytest.mark.kernels
def test_lengths_outside_the_cache_stay_inside_it(attn, device):
    """Lengths below 0 or past S_max - S_q are clamped into the cache: nothing outside the caches is
    read or written (guard bands around them keep their values), and each row's output is the
    clamped length's."""
    capacity, guard, seqlen_q = 30, 8, 2
    buffer = torch.randn(2, 3, capacity + 2 * guard, 2, 16, device=device).to(FP16)
    k_cache, v_cache = buffer[0, :, guard : guard + capacity], buffer[1, :, guard : guard + capacity]
    before = buffer.clone()
    q = torch.randn(3, seqlen_q, 2, 16, device=device).to(FP16)
    k_new, v_new = (torch.randn(3, seqlen_q, 2, 16, device=device).to(FP16) for _ in range(2))
    lengths = torch.tensor([-5, capacity + 7, 10], dtype=torch.int32, device=device)
    clamped = lengths.clamp(0, capacity - seqlen_q)
    expected, _, k_after, v_after = attention_with_kvcache_reference(q, k_cache, v_cache, clamped, k_new, v_new)
    out = flash_attention_with_kvcache(q, k_cache, v_cache, lengths, k_new, v_new, num_splits=2)
    assert torch.equal(buffer[:, :, :guard], before[:, :, :guard])
    assert torch.equal(buffer[:, :, guard + capacity :], before[:, :, guard + capacity :])
    assert torch.equal(k_cache, k_after) and torch.equal(v_cache, v_after)
    twin = twin_out(attn, q, k_after, v_after, clamped, seqlen_q)
    assert_close_to_reference(out, expected, twin, name="out")


@pytest.mark.kernels
def test_empty_shapes(device):
    """No query, no batch row or no cache position: no launch, or a launch that reads nothing."""
    for batch, seqlen_q, capacity, new in ((2, 0, 8, True), (0, 1, 8, True), (2, 1, 0, False)):
        q, k_cache, v_cache, lengths, k_new, v_new = make_inputs(
            batch, seqlen_q, 2, 1, 16, capacity, [3] * batch, new, FP16, device
        )
        out = flash_attention_with_kvcache(q, k_cache, v_cache, lengths, k_new, v_new)
        assert out.shape == q.shape
        if out.numel():  # no key in an empty cache: zeros
            assert bool((out == 0).all())


@pytest.mark.kernels
def test_autocast_casts_fp32_queries(device):
    q, k_cache, v_cache, lengths, k_new, v_new = make_inputs(1, 1, 2, 2, 16, 20, [7], True, BF16, device)
    expected = flash_attention_with_kvcache(q, k_cache.clone(), v_cache.clone(), lengths, k_new, v_new)
    with torch.autocast(device, dtype=BF16):
        out = flash_attention_with_kvcache(q.float(), k_cache, v_cache, lengths, k_new.float(), v_new.float())
    assert out.dtype == BF16
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.kernels
@pytest.mark.torch_compile
def test_torch_compile_fullgraph(device):
    """The launcher is a custom op mutating the caches: one graph, the same output and caches."""
    q, k_cache, v_cache, lengths, k_new, v_new = make_inputs(2, 1, 4, 2, 16, 24, [3, 11], True, FP16, device)
    eager_k, eager_v = k_cache.clone(), v_cache.clone()
    expected = flash_attention_with_kvcache(q, eager_k, eager_v, lengths, k_new, v_new)

    def step(q, k_cache, v_cache, lengths, k_new, v_new):
        return flash_attention_with_kvcache(q, k_cache, v_cache, lengths, k_new, v_new)

    out = torch.compile(step, backend="eager", fullgraph=True)(q, k_cache, v_cache, lengths, k_new, v_new)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert torch.equal(k_cache, eager_k) and torch.equal(v_cache, eager_v)


# ---------------------------------------------------------------------------------------------
# The split count


def test_one_split_when_the_programs_fill_the_gpu():
    assert choose_splits(programs=128, capacity=8192, block_n=64, sm_count=132) == 1
    assert choose_splits(programs=106, capacity=8192, block_n=64, sm_count=132) == 1  # >= 80 % of the SMs


def test_a_single_sequence_is_split_to_fill_the_gpu():
    splits = choose_splits(programs=8, capacity=8192, block_n=64, sm_count=132)  # batch 1, 8 kv heads
    assert 0.85 * 132 <= 8 * splits <= 132  # one wave on at least 85 % of the SMs


def test_splits_never_outnumber_the_cache_blocks():
    assert choose_splits(programs=1, capacity=1000, block_n=64, sm_count=132) == 16  # one block each
    assert choose_splits(programs=1, capacity=0, block_n=64, sm_count=132) == 1
    assert choose_splits(programs=1, capacity=10**6, block_n=64, sm_count=132) <= MAX_SPLITS


def test_short_caches_are_not_split_where_the_combine_costs_more():
    assert choose_splits(programs=1, capacity=100, block_n=64, sm_count=132) == 1  # two blocks
    assert choose_splits(programs=16, capacity=768, block_n=64, sm_count=132) == 6  # 2 blocks each, one wave


def test_block_sizes_pack_the_query_group():
    spec = DecodeSpec(1, 1, 32, 4, 128, 4096, 0.1, -1, 0, False, True, 0, 0)
    assert block_sizes(spec) == (16, 64)  # 8 query heads padded to 16 rows
    assert block_sizes(spec._replace(seqlen_q=12)) == (64, 64)  # 96 rows in two blocks
    assert block_sizes(spec._replace(head_dim=256)) == (16, 32)


# ---------------------------------------------------------------------------------------------
# Argument checks: one line naming the argument, before any launch (meta tensors: nothing runs).


def meta_inputs(**changes):
    args = dict(
        q=torch.empty(2, 1, 4, 64, dtype=BF16, device="meta"),
        k_cache=torch.empty(2, 32, 2, 64, dtype=BF16, device="meta"),
        v_cache=torch.empty(2, 32, 2, 64, dtype=BF16, device="meta"),
        cache_seqlens=torch.empty(2, dtype=torch.int32, device="meta"),
        k_new=torch.empty(2, 1, 2, 64, dtype=BF16, device="meta"),
        v_new=torch.empty(2, 1, 2, 64, dtype=BF16, device="meta"),
    )
    args.update(changes)
    return args


def meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


BAD_ARGUMENTS = [
    (dict(q=meta(2, 1, 4, 64, dtype=torch.float32)), TypeError, r"^q has dtype torch.float32; supported"),
    (dict(q=meta(2, 4, 64)), ValueError, r"^q must have 4 dims, \(B, S_q, H, D\); got shape \(2, 4, 64\)"),
    (dict(k_cache=[0.0]), TypeError, r"^k_cache must be a torch.Tensor, got list"),
    (dict(v_cache=meta(2, 32, 2, 64, dtype=FP16)), TypeError, r"^v_cache has dtype torch.float16 but q has torch.bf"),
    (dict(k_cache=meta(32, 2, 64)), ValueError, r"^k_cache must have 4 dims, \(B, S_max, H_kv, D\)"),
    (dict(k_cache=meta(3, 32, 2, 64)), ValueError, r"^k_cache has batch 3 but q has 2"),
    (dict(v_cache=meta(2, 31, 2, 64)), ValueError, r"^v_cache must have k_cache's shape"),
    (dict(k_cache=meta(2, 64, 32, 2).transpose(1, 3)), ValueError, r"^k_cache must have a unit-stride head dim"),
    (dict(q=meta(2, 1, 5, 64)), ValueError, r"^q has 5 heads and k/v have 2"),
    (
        dict(q=meta(2, 1, 4, 48), k_cache=meta(2, 32, 2, 48), v_cache=meta(2, 32, 2, 48)),
        ValueError,
        r"^head dim 48 is not supported",
    ),
    (dict(cache_seqlens=meta(2, dtype=torch.int64)), TypeError, r"^cache_seqlens has dtype torch.int64"),
    (
        dict(cache_seqlens=meta(2, 1, dtype=torch.int32)),
        ValueError,
        r"^cache_seqlens has shape \(2, 1\) but must have \w+ \(2,\)",
    ),
    (dict(v_new=None), ValueError, r"^k_new and v_new must be given together, got k_new alone"),
    (dict(k_new=meta(2, 1, 4, 64)), ValueError, r"^k_new has shape \(2, 1, 4, 64\) but must have \w+ \(2, 1, 2, 64\)"),
    (dict(v_new=meta(2, 1, 2, 64, dtype=FP16)), TypeError, r"^v_new has dtype torch.float16 but q has torch.bf"),
    (
        dict(q=meta(2, 40, 4, 64), k_new=meta(2, 40, 2, 64), v_new=meta(2, 40, 2, 64)),
        ValueError,
        r"^k_new holds 40 positions but the cache only 32",
    ),
]


@pytest.mark.parametrize("changes, error, message", BAD_ARGUMENTS)
def test_bad_arguments_are_named(changes, error, message):
    with pytest.raises(error, match=message):
        flash_attention_with_kvcache(**meta_inputs(**changes))


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(causal=1), TypeError, r"^causal must be a bool, got int"),
        (dict(window_size=(3,)), TypeError, r"^window_size must be a pair of ints"),
        (dict(window_size=(-2, 0)), ValueError, r"^window_size entries must be >= -1"),
        (dict(alibi_slopes=meta(3)), TypeError, r"^alibi_slopes has dtype torch.bfloat16"),
        (dict(alibi_slopes=meta(3, dtype=torch.float32)), ValueError, r"^alibi_slopes must have shape \(4,\)"),
        (dict(softmax_scale=0.0), ValueError, r"^softmax_scale must be positive and finite"),
        (dict(num_splits=65), ValueError, r"^num_splits=65 must be <= 64"),
        (dict(num_splits=True), TypeError, r"^num_splits must be an int, got bool"),
        (dict(rotary_cos=meta(40, 64, dtype=F32)), ValueError, r"^rotary_cos and rotary_sin must be given together, "
         "got rotary_cos alone"),
        (dict(rotary_cos=meta(40, 64, dtype=torch.int32), rotary_sin=meta(40, 64, dtype=torch.int32)), TypeError,
         r"^rotary_cos has dtype torch.int32"),
        (dict(rotary_cos=meta(1, 40, 64, dtype=F32), rotary_sin=meta(1, 40, 64, dtype=F32)), ValueError,
         r"^rotary_cos must have 2 dims, \(positions, rotary_dim\)"),
        (dict(rotary_cos=meta(40, 64, dtype=F32), rotary_sin=meta(40, 32, dtype=F32)), ValueError,
         r"^rotary_sin must have rotary_cos's shape \(40, 64\), got \(40, 32\)"),
        (dict(rotary_cos=meta(40, 63, dtype=F32), rotary_sin=meta(40, 63, dtype=F32)), ValueError,
         r"^rotary_cos has 63 columns; expected an even rotary_dim from 2 to the head dim 64"),
        (dict(rotary_cos=meta(40, 80, dtype=F32), rotary_sin=meta(40, 80, dtype=F32)), ValueError,
         r"^rotary_cos has 80 columns"),
        (dict(rotary_cos=meta(31, 64, dtype=F32), rotary_sin=meta(31, 64, dtype=F32)), ValueError,
         r"^rotary_cos has 31 positions but the cache has 32 \(k_cache's dim 1\)"),
    ],
)  # fmt: skip
def test_bad_options_are_named(options, error, message):
    with pytest.raises(error, match=message):
        flash_attention_with_kvcache(**meta_inputs(), **options)


def test_rotary_needs_the_new_keys():
    tables = dict(rotary_cos=meta(40, 64, dtype=F32), rotary_sin=meta(40, 64, dtype=F32))
    with pytest.raises(ValueError, match=r"^rotary_cos and rotary_sin rotate the new queries and keys: give k_new"):
        flash_attention_with_kvcache(**meta_inputs(k_new=None, v_new=None), **tables)


def test_the_device_check_comes_last():
    with pytest.raises(ValueError, match=r"^q is on meta"):
        flash_attention_with_kvcache(**meta_inputs())


@pytest.mark.kernels
def test_inputs_that_require_grad_are_refused_before_any_launch(device):
    q, k_cache, v_cache, lengths, k_new, v_new = make_inputs(1, 1, 2, 2, 16, 8, [3], True, BF16, device)
    before = k_cache.clone()
    with pytest.raises(ValueError, match=r"^flash_attention_with_kvcache is not differentiable"):
        flash_attention_with_kvcache(q.requires_grad_(), k_cache, v_cache, lengths, k_new, v_new)
    assert torch.equal(k_cache, before)


# ---------------------------------------------------------------------------------------------
# Ahead-of-time compiles (sm_80, sm_90): each head-dim class, both dtypes, one split and several,
# every flag, query groups of 1 to 8 heads.


def _type(name: str, dtype: str) -> str:
    if name in ("slopes_ptr", "cos_ptr", "sin_ptr", "o_part_ptr", "lse_part_ptr"):
        return "*fp32"
    if name == "cache_seqlens_ptr":
        return "*i32"
    if name.endswith("_ptr"):
        return f"*{dtype}"
    return "fp32" if name == "softmax_scale" else "i32"


# (head dim, dtype, arch, group, S_q, N_SPLITS, HAS_NEW, HAS_LEFT, HAS_RIGHT, ALIBI, ROTARY_DIM)
SPLIT_KERNELS = [
    (64, "bf16", 90, 4, 1, 16, True, False, True, False, 64),
    (64, "fp16", 80, 1, 1, 1, True, False, True, True, 0),
    (128, "bf16", 80, 8, 1, 8, True, True, True, False, 128),
    (128, "fp16", 90, 1, 4, 1, False, False, False, False, 0),
    (80, "bf16", 90, 2, 3, 4, True, True, False, True, 32),
    (256, "fp16", 90, 8, 1, 32, True, False, True, True, 0),
    (256, "bf16", 80, 4, 2, 1, True, True, True, False, 256),
]


@pytest.mark.aot
@pytest.mark.parametrize(
    "head_dim, dtype, arch, group, seqlen_q, n_splits, has_new, has_left, has_right, alibi, rotary_dim", SPLIT_KERNELS
)
def test_split_kernel_compiles(head_dim, dtype, arch, group, seqlen_q, n_splits, has_new, has_left, has_right, alibi,
                               rotary_dim):  # fmt: skip
    spec = DecodeSpec(1, seqlen_q, 8 * group, 8, head_dim, 4096, 0.1, -1, 0, alibi, has_new, rotary_dim, n_splits)
    block_m, block_n = block_sizes(spec)
    constexprs = dict(
        HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n,
        N_SPLITS=n_splits, HAS_NEW=has_new, HAS_LEFT=has_left, HAS_RIGHT=has_right, ALIBI=alibi,
        ROTARY_DIM=rotary_dim, UPCAST=False,
    )  # fmt: skip
    kernel = _decode_split_kernel
    signature = {name: _type(name, dtype) for name in kernel.arg_names if name not in constexprs}
    compile_to_cubin(kernel, signature=signature, constexprs=constexprs, arch=arch, num_warps=4, num_stages=3)


@pytest.mark.aot
@pytest.mark.parametrize("arch", [80, 90])
def test_rotary_adds_no_pipeline_stages_of_shared_memory(arch):
    """The new keys' loop (with the rotary tables' tiles) is not software-pipelined: rotary needs
    less extra shared memory than one K/V block, where pipelined stages of its tiles took 145 KB."""
    if triton_version() < (3, 0):
        pytest.skip("the compile metadata that gives the shared memory is Triton 3's")
    constexprs = dict(HEAD_DIM=128, BLOCK_D=128, GROUP=1, BLOCK_M=16, BLOCK_N=64, N_SPLITS=7, HAS_NEW=True,
                      HAS_LEFT=False, HAS_RIGHT=True, ALIBI=False, UPCAST=False)  # fmt: skip
    signature = {name: _type(name, "bf16") for name in _decode_split_kernel.arg_names if name not in constexprs}
    signature.pop("ROTARY_DIM")
    plain, rotary = (
        shared_memory_bytes(_decode_split_kernel, signature=signature, constexprs=dict(constexprs, ROTARY_DIM=dim),
                            arch=arch)
        for dim in (0, 128)
    )  # fmt: skip
    assert rotary < plain + 2 * 64 * 128 * 2, (plain, rotary)


@pytest.mark.aot
@pytest.mark.parametrize("head_dim, dtype, arch, n_splits", [(64, "bf16", 90, 16), (128, "fp16", 80, 5),
                                                             (256, "bf16", 80, 64), (80, "fp16", 90, 2)])  # fmt: skip
def test_combine_kernel_compiles(head_dim, dtype, arch, n_splits):
    block_s, block_d = triton.next_power_of_2(n_splits), triton.next_power_of_2(head_dim)
    constexprs = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, N_SPLITS=n_splits, BLOCK_S=block_s, UPCAST=False)
    kernel = _decode_combine_kernel
    signature = {name: _type(name, dtype) for name in kernel.arg_names if name not in constexprs}
    compile_to_cubin(kernel, signature=signature, constexprs=constexprs, arch=arch,
                     num_warps=max(1, min(4, block_s * block_d // 256)), num_stages=3)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# GPU: production shapes (long caches, many splits, big batches), against the fp32 reference.


@pytest.mark.gpu("cache lengths in the thousands and head dim 128: too slow for the interpreter")
@pytest.mark.parametrize(
    "batch, n_heads, n_kv_heads, capacity, seqlen_q, window, rotary_dim",
    [(1, 32, 8, 8192, 1, (-1, -1), 128), (16, 32, 32, 4096, 1, (-1, -1), 0), (4, 16, 2, 2048, 4, (256, 0), 64)],
)
def test_production_shapes_on_the_gpu(attn, batch, n_heads, n_kv_heads, capacity, seqlen_q, window, rotary_dim):
    lengths = torch.randint(1, capacity - seqlen_q + 1, (batch,)).tolist()
    lengths[0] = capacity - seqlen_q
    inputs = make_inputs(batch, seqlen_q, n_heads, n_kv_heads, 128, capacity, lengths, True, BF16, "cuda")
    options = dict(window_size=window, alibi_slopes=alibi_slopes(n_heads, device="cuda"))
    if rotary_dim:
        options["rotary_cos"], options["rotary_sin"] = rope_tables(capacity, rotary_dim, device="cuda")
    check_decode(attn, *inputs, **options)
