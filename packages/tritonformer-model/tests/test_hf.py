"""Hugging Face GPT-2 weights in our models: the same logits and loss (small random GPT2Config, no download)."""

import pytest
import torch

from tritonformer import TorchTransformer, TransformerConfig
from tritonformer.hf import config_from_gpt2, convert_gpt2_state_dict, from_gpt2

transformers = pytest.importorskip(
    "transformers",
    reason="transformers is not importable here: the GPT-2 interop tests need it (pip install transformers)",
)


def _gpt2_blocker():
    """None when transformers can load its GPT-2 model code, else why not. Its lazy import pulls
    in torch's compiler hints, which fail beside Triton 2.2 (no triton.backends)."""
    try:
        transformers.GPT2LMHeadModel  # noqa: B018 (the attribute access is the lazy import)
    except ImportError as error:
        return f"transformers cannot import GPT2LMHeadModel here: {error.__cause__ or error}"
    return None


GPT2_BLOCKER = _gpt2_blocker()
pytestmark = pytest.mark.skipif(GPT2_BLOCKER is not None, reason=str(GPT2_BLOCKER))

VOCAB = 256


def small_gpt2(**options):
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=48, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, **options,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # non-zero biases and norm parameters, so a misplaced one shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.normal_(0.0, 0.1)
    return model


def check_logits_and_loss(ours, hf, idx):
    with torch.no_grad():
        expected = hf(idx, labels=idx)  # HF shifts the labels inside
        logits, _ = ours(idx)
        _, loss = ours(idx[:, :-1], idx[:, 1:])
    torch.testing.assert_close(logits, expected.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, expected.loss, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("activation", ["gelu_new", "gelu", "relu"])
def test_torch_twin_matches_gpt2(activation):
    hf = small_gpt2(activation_function=activation)
    ours = from_gpt2(hf, TorchTransformer).eval()
    assert ours.config.mlp == ("relu" if activation == "relu" else "gelu")
    check_logits_and_loss(ours, hf, torch.randint(0, VOCAB, (2, 32)))


def test_state_dict_of_a_gpt2_model_without_head():
    hf = small_gpt2()
    body = hf.transformer.state_dict()  # GPT2Model: no "transformer." prefix, no lm_head
    config = config_from_gpt2(hf.config)
    ours = from_gpt2(body, TorchTransformer, config=config).eval()
    check_logits_and_loss(ours, hf, torch.randint(0, VOCAB, (3, 17)))


def test_conv1d_weights_are_transposed():
    hf = small_gpt2()
    converted = convert_gpt2_state_dict(hf.state_dict(), config_from_gpt2(hf.config))
    c_fc = hf.transformer.h[1].mlp.c_fc.weight  # Conv1D: (in, out)
    assert c_fc.shape == (48, 192) and converted["blocks.1.mlp.fc1.weight"].shape == (192, 48)
    torch.testing.assert_close(converted["blocks.1.mlp.fc1.weight"], c_fc.t())


def test_clear_errors():
    hf = small_gpt2()
    with pytest.raises(ValueError, match="pass config="):
        from_gpt2(hf.state_dict(), TorchTransformer)
    with pytest.raises(ValueError, match="unexpected GPT-2 state_dict key 'transformer.h.0.attn.rotary'"):
        convert_gpt2_state_dict({"transformer.h.0.attn.rotary": torch.zeros(1)}, TransformerConfig.preset("gpt2"))
    with pytest.raises(ValueError, match="activation_function='swish'"):
        config_from_gpt2(transformers.GPT2Config(activation_function="swish"))
    with pytest.raises(ValueError, match="do not fit this config"):
        from_gpt2(hf, TorchTransformer, config=config_from_gpt2(hf.config, d_ff=96))
