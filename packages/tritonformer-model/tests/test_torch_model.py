"""TorchTransformer, the plain-PyTorch twin: its behaviour and its pieces against naive formulas."""

import math

import pytest
import torch
import torch.nn.functional as F

import fused_attention
from tritonformer import TorchTransformer, TransformerConfig, positions

VOCAB = 256


def tiny(**options) -> TransformerConfig:
    base = dict(vocab_size=VOCAB, n_layer=2, n_head=4, d_model=32, max_seq_len=32)
    return TransformerConfig(**{**base, **options})


VARIANTS = [
    pytest.param(dict(), id="gpt2"),
    pytest.param(dict(position="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=2, use_linear_bias=False), id="llama"),
    pytest.param(dict(position="alibi", mlp="relu", tie_embeddings=False, qkv_bias=False), id="alibi-relu"),
    pytest.param(dict(position="rope", n_kv_head=1, gelu_approximate="none"), id="rope-mqa"),
]


def naive_attention(attn, x):
    """softmax(q k^T / sqrt(D) + ALiBi + causal mask) v with explicit loops over heads, in float64."""
    c = attn.config
    B, S, _ = x.shape
    H, Hkv, D = c.n_head, c.n_kv_head, c.head_dim
    qkv = F.linear(x.double(), attn.qkv.weight.double(), None if attn.qkv.bias is None else attn.qkv.bias.double())
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.view(B, S, H, D), k.view(B, S, Hkv, D), v.view(B, S, Hkv, D)
    pos = torch.arange(S, dtype=torch.float64)
    if c.position == "rope":
        # cos and sin in fp32 as the model keeps them (TransformerEngine's fp32 freqs), then exact.
        inv_freq = c.rope_base ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)
        angle = pos.float()[:, None] * inv_freq[None, :]  # (S, D/2)
        cos, sin = angle.cos().double()[:, None], angle.sin().double()[:, None]

        def rotate(t):  # pairs (j, j + D/2)
            a, b = t[..., : D // 2], t[..., D // 2 :]
            return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

        q, k = rotate(q), rotate(k)
    slopes = positions.alibi_slopes(H)
    out = torch.empty(B, S, H, D, dtype=torch.float64)
    for h in range(H):
        g = h // (H // Hkv)
        scores = q[:, :, h] @ k[:, :, g].transpose(1, 2) / math.sqrt(D)  # (B, S, S)
        if c.position == "alibi":
            scores = scores - slopes[h] * (pos[:, None] - pos[None, :])
        scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        out[:, :, h] = scores.softmax(-1) @ v[:, :, g]
    y = out.reshape(B, S, H * D)
    return F.linear(y, attn.proj.weight.double(), None if attn.proj.bias is None else attn.proj.bias.double())


@pytest.mark.parametrize("options", VARIANTS)
def test_attention_matches_the_naive_formula(options):
    model = TorchTransformer(tiny(**options)).double()
    attn = model.blocks[0].attn
    for p in attn.parameters():  # non-zero biases too
        torch.nn.init.normal_(p, 0.0, 0.3)
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    out = attn(x, model.position_tables(19, x.device))
    torch.testing.assert_close(out, naive_attention(attn, x), rtol=1e-10, atol=1e-10)


def test_alibi_slopes_are_the_standard_ones():
    assert positions.alibi_slopes(8) == [2.0 ** (-i) for i in range(1, 9)]
    assert positions.alibi_slopes(4) == [2.0 ** (-2 * i) for i in range(1, 5)]
    # 12 heads: the 8 slopes of 8 heads, then every other slope of 16 heads.
    assert positions.alibi_slopes(12) == positions.alibi_slopes(8) + positions.alibi_slopes(16)[0::2][:4]
    for n in (1, 2, 3, 5, 8, 12, 16, 20, 32, 40):
        expected = torch.tensor(positions.alibi_slopes(n), dtype=torch.float32)
        torch.testing.assert_close(positions.alibi_slopes_tensor(n), expected, rtol=1e-6, atol=0)
        # and fused_attention's helper gives the same slopes
        torch.testing.assert_close(fused_attention.alibi_slopes(n), expected, rtol=1e-6, atol=0)


def test_rope_scores_depend_only_on_relative_position():
    D = 16
    cos, sin = positions.rope_cos_sin(40, D, 10000.0)
    q, k = torch.randn(1, 1, 1, D, dtype=torch.float64), torch.randn(1, 1, 1, D, dtype=torch.float64)
    qs = positions.apply_rope(q.expand(1, 40, 1, D), cos, sin)[0, :, 0]  # (40, D)
    ks = positions.apply_rope(k.expand(1, 40, 1, D), cos, sin)[0, :, 0]
    # Equal up to the fp32 cos/sin the angles are kept in.
    torch.testing.assert_close(qs[10] @ ks[7], qs[35] @ ks[32], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(qs[0] @ ks[0], q.flatten() @ k.flatten())


@pytest.mark.parametrize("options", VARIANTS)
def test_loss_is_the_mean_cross_entropy_of_the_logits(options):
    model = TorchTransformer(tiny(**options))
    idx, targets = torch.randint(0, VOCAB, (3, 20)), torch.randint(0, VOCAB, (3, 20))
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 20, VOCAB)
    torch.testing.assert_close(loss, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1)))
    logits_only, none = model(idx)
    assert none is None
    torch.testing.assert_close(logits_only, logits)


@pytest.mark.parametrize("options", VARIANTS)
def test_causal(options):
    """Changing a later token changes no earlier logit."""
    model = TorchTransformer(tiny(**options))
    idx = torch.randint(0, VOCAB, (2, 24))
    changed = idx.clone()
    changed[:, 15] = (changed[:, 15] + 1) % VOCAB
    before, after = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(before[:, :15], after[:, :15])
    assert not torch.allclose(before[:, 15:], after[:, 15:])


def test_ignore_index_targets_carry_no_loss():
    model = TorchTransformer(tiny())
    idx, targets = torch.randint(0, VOCAB, (2, 16)), torch.randint(0, VOCAB, (2, 16))
    masked = targets.clone()
    masked[:, :5] = -100
    logits, loss = model(idx, masked)
    torch.testing.assert_close(loss, F.cross_entropy(logits[:, 5:].reshape(-1, VOCAB), targets[:, 5:].reshape(-1)))


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.torch_dynamo
def test_fused_loss_gives_the_same_loss_and_gradients_without_logits(tie):
    config = tiny(tie_embeddings=tie)
    plain, fused = TorchTransformer(config), TorchTransformer(config.replace(fused_loss=True))
    fused.load_state_dict(plain.state_dict())
    idx, targets = torch.randint(0, VOCAB, (3, 20)), torch.randint(0, VOCAB, (3, 20))
    targets[0, :7] = -100
    _, loss = plain(idx, targets)
    loss.backward()
    h = fused.hidden_states(idx).flatten(0, 1)
    # Chunks of 7 tokens (9 chunks, the last partial), as a large vocabulary would get.
    chunked = fused.linear_cross_entropy(h, targets.flatten(), chunk_tokens=7)
    torch.testing.assert_close(chunked, loss)
    logits, fused_loss = fused(idx, targets)
    assert logits is None
    fused_loss.backward()
    torch.testing.assert_close(fused_loss, loss)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_tied_and_untied_heads():
    tied = TorchTransformer(tiny())
    assert tied.lm_head.weight is tied.embed.weight
    untied = TorchTransformer(tiny(tie_embeddings=False))
    assert untied.lm_head.weight is not untied.embed.weight
    # The state_dict of the tied model loads into a fresh tied model and gives the same logits.
    copy = TorchTransformer(tiny())
    copy.load_state_dict(tied.state_dict())
    idx = torch.randint(0, VOCAB, (2, 8))
    torch.testing.assert_close(copy(idx)[0], tied(idx)[0])


@pytest.mark.parametrize("options", VARIANTS[:2])
@pytest.mark.torch_dynamo
def test_activation_checkpointing_gives_the_same_loss_and_gradients(options):
    plain = TorchTransformer(tiny(dropout=0.1, **options))
    checkpointed = TorchTransformer(tiny(dropout=0.1, activation_checkpointing=True, **options))
    checkpointed.load_state_dict(plain.state_dict())
    idx, targets = torch.randint(0, VOCAB, (2, 16)), torch.randint(0, VOCAB, (2, 16))
    torch.manual_seed(1)
    _, loss = plain(idx, targets)
    loss.backward()
    torch.manual_seed(1)  # the same dropout masks; checkpointing replays them in backward
    _, loss_ckpt = checkpointed(idx, targets)
    loss_ckpt.backward()
    torch.testing.assert_close(loss_ckpt, loss)
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_dropout_only_in_training():
    model = TorchTransformer(tiny(dropout=0.5))
    idx = torch.randint(0, VOCAB, (2, 16))
    assert not torch.equal(model(idx)[0], model(idx)[0])
    model.eval()
    torch.testing.assert_close(model(idx)[0], model(idx)[0], rtol=0, atol=0)


def test_init():
    config = tiny(tie_embeddings=False)
    model = TorchTransformer(config)
    # Residual projections get 0.02 / sqrt(2 L), the rest 0.02; biases 0, norm weights 1.
    assert abs(model.blocks[0].attn.proj.weight.std().item() - 0.02 / math.sqrt(4)) < 0.003
    assert abs(model.blocks[0].mlp.fc1.weight.std().item() - 0.02) < 0.002
    assert abs(model.lm_head.weight.std().item() - 0.02) < 0.002
    assert torch.all(model.blocks[1].mlp.fc2.bias == 0) and torch.all(model.norm_f.weight == 1)
    llama = TorchTransformer(tiny(mlp="swiglu", d_ff=128, use_linear_bias=True))
    assert abs(llama.blocks[0].mlp.w_down.std().item() - 0.02 / math.sqrt(4)) < 0.003
    assert abs(llama.blocks[0].mlp.w_gate.std().item() - 0.02) < 0.002
    assert torch.all(llama.blocks[0].mlp.b_up == 0)


def test_swiglu_mlp_formula():
    config = tiny(mlp="swiglu", d_ff=80, use_linear_bias=True)
    mlp = TorchTransformer(config).blocks[0].mlp.double()
    for p in mlp.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    x = torch.randn(3, 5, 32, dtype=torch.float64)
    gate, up = x @ mlp.w_gate + mlp.b_gate, x @ mlp.w_up + mlp.b_up
    expected = (gate * torch.sigmoid(gate) * up) @ mlp.w_down + mlp.b_down
    torch.testing.assert_close(mlp(x), expected)


def test_generate():
    model = TorchTransformer(tiny())
    prompt = torch.randint(0, VOCAB, (2, 5))
    out = model.generate(prompt, 40)  # past max_seq_len (32): the context is cropped
    assert out.shape == (2, 45) and torch.equal(out[:, :5], prompt)
    assert model.training  # the mode is restored
    greedy = model.generate(prompt, 3, temperature=0)
    model.eval()
    with torch.no_grad():
        first = model(prompt)[0][:, -1].argmax(-1)
    assert torch.equal(greedy[:, 5], first)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(
        model.generate(prompt, 6, top_k=5, generator=g1), model.generate(prompt, 6, top_k=5, generator=g2)
    )


def test_bad_inputs():
    model = TorchTransformer(tiny())
    with pytest.raises(ValueError, match="sequence length 33 exceeds max_seq_len=32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(TypeError, match="idx must be an int64"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="idx must be \\(batch, seq_len\\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="targets has shape"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        model.generate(torch.zeros(1, 4, dtype=torch.long), 2, top_k=0)
