"""RotaryEmbedding: TE's angle layout and options, caching, and the two recipes a GPT block uses."""

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference

from fused_rope import RotaryEmbedding, apply_rotary_pos_emb, apply_rotary_qk
from fused_rope.reference import rotate_half


def _expected_theta(seq_len, rot_dim, base, offset=0, scale=1.0):
    """float64 angles (S, rot_dim / 2): position * base^(-2j / rot_dim)."""
    positions = (torch.arange(seq_len, dtype=torch.float64) + offset) * scale
    return positions[:, None] * base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dim, rotary_percent, rot_dim", [(64, 1.0, 64), (64, 0.5, 32), (80, 0.3, 24)])
def test_freqs_layout_and_values(dim, rotary_percent, rot_dim, interleaved):
    rope = RotaryEmbedding(dim, base=500.0, rotary_percent=rotary_percent, interleaved=interleaved)
    freqs = rope(37, offset=5)
    assert freqs.shape == (37, 1, 1, rot_dim) and freqs.dtype == torch.float32
    theta = _expected_theta(37, rot_dim, 500.0, offset=5)
    pairs = theta.repeat_interleave(2, -1) if interleaved else torch.cat((theta, theta), -1)
    # fp32: base^x, its reciprocal and the product each round once; a few ulps at 41 rad.
    assert_close_to_reference(freqs.view(37, rot_dim), pairs, atol=4 * 41 * 2**-24)


def test_position_interpolation():
    fixed = RotaryEmbedding(32, seq_len_interpolation_factor=4.0)
    assert_close_to_reference(fixed(10).view(10, 32)[:, :16], _expected_theta(10, 32, 10000.0, scale=0.25))
    dynamic = RotaryEmbedding(32, seq_len_interpolation_factor=2.0, pretrained_max_position_embeddings=8)
    # Up to 8 * 2 positions: fixed scaling by 1/2; past it: scaled by pretrained / seq_len.
    assert_close_to_reference(dynamic(16).view(16, 32)[:, :16], _expected_theta(16, 32, 10000.0, scale=0.5))
    assert_close_to_reference(dynamic(20).view(20, 32)[:, :16], _expected_theta(20, 32, 10000.0, scale=8 / 20))


def test_tables_are_cached_per_length_offset_and_dtype():
    rope = RotaryEmbedding(16)
    assert rope(8) is rope(8)
    assert rope(9) is not rope(8) and rope(8, offset=1) is not rope(8)
    cos, sin = rope.cos_sin(8)
    assert rope.cos_sin(8)[0] is cos
    assert rope.cos_sin(8, dtype=torch.bfloat16)[0].dtype == torch.bfloat16
    torch.testing.assert_close(cos, rope(8).view(1, 8, 16).cos(), rtol=0, atol=0)
    torch.testing.assert_close(sin, rope(8).view(1, 8, 16).sin(), rtol=0, atol=0)


def test_state_dict_is_empty_and_repr():
    rope = RotaryEmbedding(64, rotary_percent=0.5)
    assert rope.state_dict() == {}  # inv_freq is derived, not saved
    assert repr(rope) == "RotaryEmbedding(dim=64, rot_dim=32, base=10000.0, interleaved=False)"


@pytest.mark.kernels
@pytest.mark.parametrize("rotary_percent", [1.0, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_gpt_block_recipes(rotary_percent, dtype, device):
    """Both recipes of the docstring on q, k (B, S, H, D) give the plain-PyTorch rotation."""
    batch, seq_len, heads, head_dim = 2, 6, 3, 16
    rope = RotaryEmbedding(head_dim, rotary_percent=rotary_percent).to(device)
    qkv = torch.randn(batch, seq_len, 3 * heads, head_dim, device=device, dtype=dtype)
    q, k = qkv[:, :, :heads], qkv[:, :, heads : 2 * heads]

    def expected(x, lowp):
        """x (B, S, H, D) rotated with cos/sin (S, 1, rot_dim): the model twin's formula."""
        freqs = rope(seq_len).view(seq_len, 1, rope.rot_dim)
        freqs, x = (freqs, x) if lowp else (freqs.double(), x.double())
        cos, sin = freqs.cos().to(x.dtype), freqs.sin().to(x.dtype)
        x_rot, x_pass = x[..., : rope.rot_dim], x[..., rope.rot_dim :]
        return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), -1)

    cos, sin = rope.cos_sin(seq_len)
    q_qk, k_qk = apply_rotary_qk(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    assert q_qk.shape == (batch, heads, seq_len, head_dim)
    freqs = rope(seq_len)
    q_te = apply_rotary_pos_emb(q, freqs, tensor_format="bshd")
    k_te = apply_rotary_pos_emb(k, freqs, tensor_format="bshd")
    for name, got, x in [("q qk", q_qk.transpose(1, 2), q), ("k qk", k_qk.transpose(1, 2), k), ("q te", q_te, q),
                         ("k te", k_te, k)]:  # fmt: skip
        assert_close_to_reference(got, expected(x, False), expected(x, True), name=name)
