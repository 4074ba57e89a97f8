"""Bad input raises a clear TypeError/ValueError naming the argument, before any launch.

These tests launch nothing, so they run on every machine and Triton (the device check comes last:
valid shapes on the wrong device are the only ones that reach it).
"""

import pytest
import torch

from fused_attention import (
    FlashAttention,
    MultiheadSelfAttention,
    alibi_slopes,
    flash_attention,
    flash_attention_qkvpacked,
    flash_attention_varlen,
)
from fused_attention._runtime.compat import KERNEL_DEVICE_TYPE

BF16 = torch.bfloat16


def qkv(batch=2, seqlen=8, heads=4, kv_heads=4, head_dim=64, dtype=BF16, device="meta"):
    return (
        torch.empty(batch, seqlen, heads, head_dim, dtype=dtype, device=device),
        torch.empty(batch, seqlen, kv_heads, head_dim, dtype=dtype, device=device),
        torch.empty(batch, seqlen, kv_heads, head_dim, dtype=dtype, device=device),
    )


def test_rejects_fp32_with_a_hint():
    with pytest.raises(TypeError, match=r"^q has dtype torch.float32; supported: float16, bfloat16 \(cast to"):
        flash_attention(*qkv(dtype=torch.float32))


def test_rejects_non_tensor_and_integer_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"^k must be a torch.Tensor, got list"):
        flash_attention(q, [1.0], v)
    with pytest.raises(TypeError, match=r"^v has dtype torch.int32"):
        flash_attention(q, k, v.to(torch.int32))


def test_rejects_mixed_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"^k has dtype torch.float16 but q has torch.bfloat16"):
        flash_attention(q, k.half(), v)


@pytest.mark.parametrize("head_dim", [8, 48, 100, 512])
def test_rejects_unsupported_head_dims(head_dim):
    with pytest.raises(ValueError, match=rf"^head dim {head_dim} is not supported; supported: 16, 32, 64, 80"):
        flash_attention(*qkv(head_dim=head_dim))


def test_rejects_mismatched_heads_and_shapes():
    with pytest.raises(ValueError, match=r"^q has 6 heads and k/v have 4"):
        flash_attention(*qkv(heads=6, kv_heads=4))
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^v has head dim 32 but q and k have 64"):
        flash_attention(q, k, v[..., :32])
    with pytest.raises(ValueError, match=r"^q has head dim 32 but k has 64"):
        flash_attention(q[..., :32], k, v)
    with pytest.raises(ValueError, match=r"^v must have k's shape"):
        flash_attention(q, k, v[:, :5])
    with pytest.raises(ValueError, match=r"^q, k and v must share the batch size, got 2, 1, 1"):
        flash_attention(q, k[:1], v[:1])
    with pytest.raises(ValueError, match=r"^q must be 4-D \(B, H, S, D\) for layout='bhsd'"):
        flash_attention(q[0], k, v, layout="bhsd")


def test_rejects_bad_options():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^layout must be 'bshd' or 'bhsd', got 'sbhd'"):
        flash_attention(q, k, v, layout="sbhd")
    with pytest.raises(TypeError, match=r"^window_size must be a pair of ints"):
        flash_attention(q, k, v, window_size=(4,))
    with pytest.raises(ValueError, match=r"^window_size entries must be >= -1"):
        flash_attention(q, k, v, window_size=(-2, 0))
    with pytest.raises(TypeError, match=r"^causal must be a bool"):
        flash_attention(q, k, v, causal=1)
    with pytest.raises(ValueError, match=r"^softmax_scale must be positive and finite, got -0.5"):
        flash_attention(q, k, v, softmax_scale=-0.5)
    with pytest.raises(TypeError, match=r"^softmax_scale must be a float or None"):
        flash_attention(q, k, v, softmax_scale="0.1")
    with pytest.raises(TypeError, match=r"^deterministic must be a bool, got int"):
        flash_attention(q, k, v, deterministic=1)


@pytest.mark.parametrize("scale", [1e-45, 1e-39, 2.4e38, 1e300])
def test_rejects_softmax_scale_outside_fp32(scale):
    """The kernels scale in fp32: a scale that is 0, subnormal or infinite there is refused."""
    with pytest.raises(ValueError, match=r"^softmax_scale must lie in the fp32 range \[8.15e-39, 2.36e\+38\], got"):
        flash_attention(*qkv(), softmax_scale=scale)


@pytest.mark.parametrize(
    "softcap, error, message",
    [
        (-1.0, ValueError, r"^softcap=-1.0 must be a finite number in \[0.0, inf\]"),
        (float("nan"), ValueError, r"^softcap=nan must be a finite number"),
        (float("inf"), ValueError, r"^softcap=inf must be a finite number"),
        (1e-40, ValueError, r"^softcap must be 0 or lie in \[1.18e-38, 2.36e\+38\] \(fp32 range\), got 1e-40"),
        ("1", TypeError, r"^softcap must be a float, got str"),
    ],
)
def test_rejects_bad_softcap(softcap, error, message):
    q, k, v = qkv()
    with pytest.raises(error, match=message):
        flash_attention(q, k, v, softcap=softcap)
    with pytest.raises(error, match=message):
        flash_attention_varlen(
            q[0], k[0], v[0], torch.tensor([0, 8], dtype=torch.int32, device="meta"),
            torch.tensor([0, 8], dtype=torch.int32, device="meta"), 8, 8, softcap=softcap,
        )  # fmt: skip
    with pytest.raises(error, match=message):
        FlashAttention(softcap=softcap)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"dropout_p": 1.0}, ValueError, r"^dropout_p=1.0 must be a finite number in \[0.0, 1.0\)"),
        ({"dropout_p": -0.1}, ValueError, r"^dropout_p=-0.1 must be a finite number"),
        ({"dropout_p": True}, TypeError, r"^dropout_p must be a float, got bool"),
        ({"dropout_p": 0.1, "seed": -1}, ValueError, r"^seed=-?[0-9]+ must be"),
        ({"dropout_p": 0.1, "seed": 2**63}, ValueError, r"^seed=-?[0-9]+ must be"),
        ({"dropout_p": 0.1, "seed": 1.5}, TypeError, r"^seed must be an int"),
        ({"dropout_p": 0.1, "seed": 3, "seed_offset": 2**32}, ValueError, r"^seed_offset=-?[0-9]+ must be"),
        ({"seed_offset": -1}, ValueError, r"^seed_offset=-?[0-9]+ must be"),
    ],
)
def test_rejects_bad_dropout_options(options, error, message):
    q, k, v = qkv()
    with pytest.raises(error, match=message):
        flash_attention(q, k, v, **options)
    if "seed" in options or "seed_offset" in options:  # checked first (the packed checks see the device early)
        with pytest.raises(error, match=message):
            flash_attention_qkvpacked(torch.empty(2, 8, 12, 64, dtype=BF16, device="meta"), **options)


def test_rejects_zero_kv_heads():
    with pytest.raises(ValueError, match=r"^k and v have 0 heads: at least one key/value head is needed"):
        flash_attention(*qkv(heads=0, kv_heads=0))
    with pytest.raises(ValueError, match=r"^k and v have 0 heads"):
        flash_attention(*qkv(kv_heads=0))


@pytest.mark.kernels
@pytest.mark.parametrize("packed", [False, True], ids=["flash_attention", "qkvpacked"])
def test_cached_checks_still_reject(packed, device):
    """The checks' outcome is cached with the plan of each argument combination; an equal-comparing
    argument of the wrong type (1 for True, (True, 0) for (1, 0)) is still rejected after the valid
    one passed."""
    q, k, v = (t.normal_() for t in qkv(batch=1, seqlen=3, heads=2, kv_heads=2, head_dim=16, device=device))
    valid = dict(causal=True, softmax_scale=1.0, window_size=(1, 0), deterministic=False, softcap=1.0)

    def call(**options):
        if packed:
            return flash_attention_qkvpacked(torch.cat((q, k, v), dim=2), **options)
        return flash_attention(q, k, v, layout="bshd", **options)

    for _ in range(2):  # builds the plan, then finds it
        call(**valid)
    bad_options = [("causal", 1), ("softmax_scale", True), ("window_size", (True, 0)), ("deterministic", 0),
                   ("softcap", True)]  # fmt: skip
    for name, bad in bad_options:
        with pytest.raises(TypeError, match=rf"^{name} must be"):
            call(**dict(valid, **{name: bad}))


def test_rejects_bad_alibi_slopes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"^alibi_slopes has dtype torch.bfloat16; supported: float32"):
        flash_attention(q, k, v, alibi_slopes=torch.ones(4, dtype=BF16, device="meta"))
    with pytest.raises(ValueError, match=r"^alibi_slopes must have shape \(4,\) or \(2, 4\), got \(3,\)"):
        flash_attention(q, k, v, alibi_slopes=torch.ones(3, device="meta"))


def test_rejects_wrong_device_last():
    """Valid tensors on a device the kernels do not run on (meta here; CPU without the interpreter)."""
    with pytest.raises(ValueError, match=r"^q is on meta"):
        flash_attention(*qkv())
    other = "meta" if KERNEL_DEVICE_TYPE == "cpu" else "cpu"
    q, k, v = qkv(device=other)
    with pytest.raises(ValueError, match=rf"^q is on {other}"):
        flash_attention(q, k, v)


def _varlen(lengths_q=(3, 5), lengths_k=(4, 4), heads=2, device="cpu"):
    q = torch.empty(sum(lengths_q), heads, 64, dtype=BF16, device=device)
    k = torch.empty(sum(lengths_k), heads, 64, dtype=BF16, device=device)
    cu_q = torch.tensor([0, lengths_q[0], sum(lengths_q)], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, lengths_k[0], sum(lengths_k)], dtype=torch.int32, device=device)
    return q, k, k.clone(), cu_q, cu_k


def test_varlen_rejects_mismatched_cu_seqlens():
    q, k, v, cu_q, cu_k = _varlen()
    with pytest.raises(TypeError, match=r"^cu_seqlens_q has dtype torch.int64; supported: int32"):
        flash_attention_varlen(q, k, v, cu_q.long(), cu_k, 5, 4)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k must be 1-D with batch \+ 1 >= 2 entries"):
        flash_attention_varlen(q, k, v, cu_q, cu_k[:1], 5, 4)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q holds 2 sequences but cu_seqlens_k holds 1"):
        flash_attention_varlen(q, k, v, cu_q, cu_k[::2], 5, 8)
    with pytest.raises(ValueError, match=r"^q must be 3-D \(total, H, D\)"):
        flash_attention_varlen(q[None], k, v, cu_q, cu_k, 5, 4)
    with pytest.raises(TypeError, match=r"^max_seqlen_k must be an int"):
        flash_attention_varlen(q, k, v, cu_q, cu_k, 5, 4.0)
    with pytest.raises(TypeError, match=r"^return_lse must be a bool, got int"):
        flash_attention_varlen(q, k, v, cu_q, cu_k, 5, 4, return_lse=1)
    with pytest.raises(TypeError, match=r"^check_seqlens must be a bool, got str"):
        flash_attention_varlen(q, k, v, cu_q, cu_k, 5, 4, check_seqlens="no")
    with pytest.raises(TypeError, match=r"^return_lse must be a bool, got str"):
        flash_attention(*qkv(), return_lse="no")


@pytest.mark.kernels
def test_varlen_checks_offset_values(device):
    """check_seqlens reads the offsets back (on the kernels' device: the device check comes first)."""
    q, k, v, cu_q, cu_k = _varlen(device=device)

    def offsets(*values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    with pytest.raises(ValueError, match=r"^cu_seqlens_q must rise from 0 to the packed length 8, got 0 ... 7"):
        flash_attention_varlen(q, k, v, offsets(0, 3, 7), cu_k, 5, 4)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k must rise .* \(decreasing somewhere\)"):
        flash_attention_varlen(q, k, v, cu_q, offsets(0, 9, 8), 5, 9)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q has a sequence of length 5 > max_seqlen 4"):
        flash_attention_varlen(q, k, v, cu_q, cu_k, 4, 4)


@pytest.mark.parametrize("check_seqlens", [False, True])
def test_varlen_device_check_comes_last(check_seqlens):
    """The offsets are read back (check_seqlens) only once every tensor is known to be on the kernels' device."""
    q, k, v, cu_q, cu_k = _varlen(device="meta")
    with pytest.raises(ValueError, match=r"^q is on meta"):
        flash_attention_varlen(q, k, v, cu_q, cu_k, 5, 4, check_seqlens=check_seqlens)


@pytest.mark.kernels
@pytest.mark.parametrize("check_seqlens", [False, True])
@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_varlen_offsets_on_another_device(name, check_seqlens, device):
    """Offsets on a device other than q's (meta: no data to read back) are named, not read."""
    q, k, v, cu_q, cu_k = _varlen(device=device)
    offsets = {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}
    offsets[name] = offsets[name].to("meta")
    with pytest.raises(ValueError, match=rf"^{name} is on meta; the kernels run on"):
        flash_attention_varlen(q, k, v, *offsets.values(), 5, 4, check_seqlens=check_seqlens)


def test_packed_arguments():
    """flash_attention_qkvpacked names qkv in its type, dtype and device errors."""
    with pytest.raises(TypeError, match=r"^qkv must be a torch.Tensor, got list"):
        flash_attention_qkvpacked([1.0])
    with pytest.raises(TypeError, match=r"^qkv has dtype torch.int32; supported: float16, bfloat16"):
        flash_attention_qkvpacked(torch.zeros(1, 8, 6, 64, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match=r"^qkv is on meta"):
        flash_attention_qkvpacked(torch.zeros(1, 8, 6, 64, dtype=BF16, device="meta"))
    with pytest.raises(ValueError, match=r"^qkv packs 2 heads: at least 3 are needed"):
        flash_attention_qkvpacked(torch.zeros(1, 8, 2, 64, dtype=BF16, device="meta"), n_kv_heads=1)


def test_module_and_helper_arguments():
    with pytest.raises(ValueError, match=r"^d_model=100 must be a multiple of n_head=8"):
        MultiheadSelfAttention(100, 8)
    with pytest.raises(ValueError, match=r"^n_head=8 must be a multiple of n_kv_head=3"):
        MultiheadSelfAttention(128, 8, 3)
    with pytest.raises(ValueError, match=r"^layout must be 'bshd' or 'bhsd'"):
        FlashAttention(layout="bsh")
    with pytest.raises(TypeError, match=r"^deterministic must be a bool"):
        FlashAttention(deterministic="yes")
    with pytest.raises(TypeError, match=r"^deterministic must be a bool"):
        MultiheadSelfAttention(128, 8, deterministic=None)
    with pytest.raises(ValueError, match=r"^n_head=0 must be >= 1"):
        MultiheadSelfAttention(128, 0)
    with pytest.raises(TypeError, match=r"^n_head must be an int, got float"):
        MultiheadSelfAttention(128, 2.0)
    with pytest.raises(ValueError, match=r"^d_model=0 must be >= 1"):
        MultiheadSelfAttention(0, 1)
    with pytest.raises(ValueError, match=r"^n_kv_head=0 must be >= 1"):
        MultiheadSelfAttention(128, 8, 0)
    with pytest.raises(ValueError, match=r"^head dim 8 is not supported"):
        MultiheadSelfAttention(64, 8)
    with pytest.raises(ValueError, match=r"^softmax_scale must be positive and finite, got nan"):
        MultiheadSelfAttention(128, 8, softmax_scale=float("nan"))
    with pytest.raises(ValueError, match=r"^softmax_scale must be positive and finite, got inf"):
        FlashAttention(softmax_scale=float("inf"))
    module = MultiheadSelfAttention(128, 2, device="meta", dtype=BF16)
    for x in (torch.empty(8, 128, device="meta", dtype=BF16), torch.empty(2, 8, 64, device="meta", dtype=BF16)):
        with pytest.raises(ValueError, match=r"^x must be a \(B, S, d_model=128\) tensor, got \("):
            module(x)
    with pytest.raises(ValueError, match=r"^n_heads=0 must be >= 1"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match=r"^n_heads must be an int"):
        alibi_slopes(4.0)
