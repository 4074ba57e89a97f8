"""RotaryEmbedding: TE's signature, angle layout and options, caching, and the two recipes a GPT block uses."""

import inspect

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
    rope = RotaryEmbedding(dim, rotary_base=500.0, rotary_percent=rotary_percent, interleaved=interleaved)
    freqs = rope(37, offset=5)
    assert freqs.shape == (37, 1, 1, rot_dim) and freqs.dtype == torch.float32
    theta = _expected_theta(37, rot_dim, 500.0, offset=5)
    pairs = theta.repeat_interleave(2, -1) if interleaved else torch.cat((theta, theta), -1)
    # fp32: base^x, its reciprocal and the product each round once; a few ulps at 41 rad.
    assert_close_to_reference(freqs.view(37, rot_dim), pairs, atol=4 * 41 * 2**-24)


def test_te_signature_by_position_and_keyword():
    """TransformerEngine's RotaryPositionEmbedding(dim, rotary_percent, seq_len_interpolation_factor,
    pretrained_max_position_embeddings, rotary_base, interleaved), its defaults; device keyword-only."""
    te_parameters = [
        ("dim", inspect.Parameter.empty), ("rotary_percent", 1.0), ("seq_len_interpolation_factor", None),
        ("pretrained_max_position_embeddings", None), ("rotary_base", 10000.0), ("interleaved", False),
    ]  # fmt: skip
    parameters = list(inspect.signature(RotaryEmbedding).parameters.values())
    assert [(p.name, p.default) for p in parameters[:6]] == te_parameters
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in parameters[:6])
    assert [(p.name, p.kind) for p in parameters[6:]] == [("device", inspect.Parameter.KEYWORD_ONLY)]
    assert list(inspect.signature(RotaryEmbedding.forward).parameters) == ["self", "max_seq_len", "offset"]

    half = RotaryEmbedding(128, 0.5)  # TE: rotary_percent 0.5, base 10000
    assert half.rot_dim == 64 and half.rotary_base == 10000.0
    assert_close_to_reference(half(5).view(5, 64)[:, :32], _expected_theta(5, 64, 10000.0))
    positional = RotaryEmbedding(64, 0.5, 2.0, 8, 500.0, True)
    by_name = RotaryEmbedding(
        dim=64, rotary_percent=0.5, seq_len_interpolation_factor=2.0, pretrained_max_position_embeddings=8,
        rotary_base=500.0, interleaved=True,
    )  # fmt: skip
    assert positional.interleaved and positional.rot_dim == 32
    for seq_len in (10, 20):  # fixed, then dynamic scaling
        torch.testing.assert_close(positional(seq_len), by_name(max_seq_len=seq_len), rtol=0, atol=0)


def test_position_interpolation():
    """TE's rule: with both settings, positions / factor up to pretrained * factor, else * pretrained / length."""
    rope = RotaryEmbedding(32, seq_len_interpolation_factor=4.0, pretrained_max_position_embeddings=8)
    for seq_len, scale in [(10, 0.25), (32, 0.25), (40, 8 / 40)]:
        assert_close_to_reference(rope(seq_len).view(seq_len, 32)[:, :16], _expected_theta(seq_len, 32, 10000.0,
                                                                                          scale=scale))  # fmt: skip
    # pretrained alone scales nothing (as in TE)
    plain = RotaryEmbedding(32, pretrained_max_position_embeddings=8)
    assert_close_to_reference(plain(20).view(20, 32)[:, :16], _expected_theta(20, 32, 10000.0))


def test_tables_are_cached_per_length_offset_and_dtype():
    rope = RotaryEmbedding(16)
    assert rope(8) is rope(8)
    assert rope(9) is not rope(8) and rope(8, offset=1) is not rope(8)
    cos, sin = rope.cos_sin(8)
    assert rope.cos_sin(8)[0] is cos
    assert rope.cos_sin(8, dtype=torch.bfloat16)[0].dtype == torch.bfloat16
    torch.testing.assert_close(cos, rope(8).view(1, 8, 16).cos(), rtol=0, atol=0)
    torch.testing.assert_close(sin, rope(8).view(1, 8, 16).sin(), rtol=0, atol=0)


def _expected_freqs(rope, seq_len):
    """float64 angles of rope's current inv_freq and settings, rotate-half layout (S, rot_dim)."""
    positions = torch.arange(seq_len, dtype=torch.float64)
    if rope.seq_len_interpolation_factor is not None:
        positions = positions / rope.seq_len_interpolation_factor  # lengths within pretrained * factor
    theta = positions[:, None] * rope.inv_freq.cpu().double()
    return torch.cat((theta, theta), -1)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda rope: rope.double(), id="double"),
        pytest.param(lambda rope: rope.to(torch.float64), id="to-dtype"),
        pytest.param(lambda rope: rope.inv_freq.mul_(0.5), id="inv_freq-edited-in-place"),
        pytest.param(lambda rope: rope.inv_freq.copy_(torch.linspace(0.1, 1.0, 4)), id="inv_freq-copied-into"),
        pytest.param(lambda rope: setattr(rope, "inv_freq", rope.inv_freq * 3), id="inv_freq-replaced"),
        pytest.param(lambda rope: setattr(rope, "seq_len_interpolation_factor", 2.0), id="interpolation-changed"),
    ],
)
def test_cached_tables_follow_inv_freq_and_settings(change):
    """A change of what the angles depend on recomputes them (and the cos/sin tables) for a cached length."""
    rope = RotaryEmbedding(8, seq_len_interpolation_factor=4.0, pretrained_max_position_embeddings=64)
    cos_before, _ = rope.cos_sin(6)
    change(rope)
    freqs, (cos, sin) = rope(6), rope.cos_sin(6)
    expected = _expected_freqs(rope, 6)
    assert freqs.dtype == torch.promote_types(torch.float32, rope.inv_freq.dtype)
    assert_close_to_reference(freqs.view(6, 8), expected, atol=8 * 2**-24)
    torch.testing.assert_close(cos, freqs.view(1, 6, 8).cos().float(), rtol=0, atol=0)
    torch.testing.assert_close(sin, freqs.view(1, 6, 8).sin().float(), rtol=0, atol=0)
    assert cos is not cos_before


@pytest.mark.torch_dynamo  # arange on the meta device runs torch's decompositions, which import torch._dynamo
def test_cached_tables_follow_the_device():
    """.to(device) recomputes on the new device (meta: no data, the device is what is checked)."""
    rope = RotaryEmbedding(8)
    assert rope(4).device.type == "cpu" and rope.cos_sin(4)[0].device.type == "cpu"
    rope.to("meta")
    assert rope(4).device.type == "meta" and rope.cos_sin(4)[0].device.type == "meta"


def test_results_edited_in_place_are_recomputed():
    """The caches hand out their tensors: one edited by the caller is not handed out again."""
    rope = RotaryEmbedding(8)
    freqs = rope(4)
    expected = freqs.clone()
    freqs.mul_(2)
    assert torch.equal(rope(4), expected)
    cos, _ = rope.cos_sin(4)
    cos.zero_()
    assert torch.equal(rope.cos_sin(4)[0], expected.view(1, 4, 8).cos())


def test_state_dict_is_empty_and_repr():
    rope = RotaryEmbedding(64, rotary_percent=0.5)
    assert rope.state_dict() == {}  # inv_freq is derived, not saved
    assert repr(rope) == "RotaryEmbedding(dim=64, rot_dim=32, rotary_base=10000.0, interleaved=False)"


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
