"""TransformerConfig: defaults, presets, and clear errors for bad options."""

import pytest

from tritonformer import PRESETS, TorchTransformer, Transformer, TransformerConfig


def test_derived_defaults():
    c = TransformerConfig(d_model=96, n_head=6)
    assert c.n_kv_head == 6 and c.head_dim == 16 and c.d_ff == 384
    swiglu = TransformerConfig(d_model=2048, n_head=16, mlp="swiglu")
    assert swiglu.d_ff == 5632  # 8/3 * 2048 rounded up to 256: TinyLlama's width
    # Defaulted options follow a replaced option; explicit ones stay.
    assert c.replace(n_head=3).n_kv_head == 3
    assert c.replace(d_model=48).d_ff == 192
    assert c.replace(n_kv_head=2).replace(n_head=4).n_kv_head == 2


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_valid(name):
    config = TransformerConfig.preset(name)
    assert config.num_params(matmul_only=False) >= config.num_params(matmul_only=True) > 0


@pytest.mark.parametrize(
    "name, millions", [("160M", 160), ("410M", 410), ("840M", 840), ("1.4B", 1400), ("llama-1.4B", 1400)]
)
def test_size_presets_have_their_parameter_counts(name, millions):
    config = TransformerConfig.preset(name)
    assert abs(config.num_params(matmul_only=False) / 1e6 - millions) / millions < 0.04


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(tie_embeddings=False, use_linear_bias=False, qkv_bias=False),
        dict(position="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=1, tie_embeddings=False),
        dict(position="alibi", mlp="swiglu", use_linear_bias=True, d_ff=40),
    ],
)
def test_counts_from_the_config_match_the_models(options):
    config = TransformerConfig(vocab_size=100, n_layer=2, n_head=2, d_model=32, max_seq_len=16, **options)
    for model_class in (TorchTransformer, Transformer):
        model = model_class(config)
        for matmul_only in (True, False):
            assert config.num_params(matmul_only) == model.num_params(matmul_only)
        n = config.num_params(matmul_only=True)
        assert model.flops_per_token(16) == 6 * n + 12 * 2 * 32 * 16


def test_attn_bias_and_linear_bias_flags():
    assert TransformerConfig.preset("410M").use_linear_bias is False
    alibi = TransformerConfig.preset("410M", attn_bias=True, use_linear_bias=True)
    assert alibi.position == "alibi" and alibi.attn_bias and alibi.use_linear_bias
    assert TransformerConfig.preset("410M", attn_bias=False).position == "learned"


def test_round_trip_through_a_dict():
    config = TransformerConfig.preset("tiny-llama", dropout=0.1)
    assert TransformerConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(d_model=100, n_head=3), ValueError, "d_model=100 is not divisible by n_head=3"),
        (dict(n_head=12, n_kv_head=5), ValueError, "n_head=12 is not divisible by n_kv_head=5"),
        (dict(position="sinusoidal"), ValueError, "unknown position='sinusoidal'"),
        (dict(norm="batchnorm"), ValueError, "unknown norm='batchnorm'"),
        (dict(mlp="geglu"), ValueError, "unknown mlp='geglu'"),
        (dict(gelu_approximate="erf"), ValueError, "unknown gelu_approximate='erf'"),
        (dict(n_layer=0), ValueError, "n_layer must be positive"),
        (dict(loss_chunk_size=0), ValueError, "loss_chunk_size must be positive"),
        (dict(d_model=64.0), TypeError, "d_model must be an int"),
        (dict(vocab_size=True), TypeError, "vocab_size must be an int"),
        (dict(dropout=1.0), ValueError, "dropout must be a probability"),
        (dict(norm_eps=0), ValueError, "norm_eps must be a finite number > 0, got 0"),
        (dict(norm_eps=-1e-5), ValueError, "norm_eps must be a finite number > 0, got -1e-05"),
        (dict(norm_eps=float("inf")), ValueError, "norm_eps must be a finite number > 0, got inf"),
        (dict(norm_eps=float("nan")), ValueError, "norm_eps must be a finite number > 0, got nan"),
        (dict(norm_eps=True), ValueError, "norm_eps must be a finite number > 0, got True"),
        (dict(rope_base=float("inf")), ValueError, "rope_base must be a finite number > 1, got inf"),
        (dict(dropout=float("nan")), ValueError, "dropout must be a probability"),
        (dict(attention_dropout=-0.1), ValueError, "attention_dropout must be a probability"),
        (dict(tie_embeddings="yes"), TypeError, "tie_embeddings must be a bool"),
        (dict(ignore_index=3), ValueError, "ignore_index=3 must be an int outside"),
        (dict(d_model=60, n_head=4, position="rope"), ValueError, "head_dim=15 must be even"),
    ],
)
def test_bad_options_raise_clear_errors(options, error, message):
    with pytest.raises(error, match=message.replace("(", r"\(").replace("[", r"\[")):
        TransformerConfig(**options)


def test_unknown_option_names():
    with pytest.raises(TypeError, match="n_heads"):
        TransformerConfig(n_heads=4)
    with pytest.raises(ValueError, match="unknown TransformerConfig option.*n_heads"):
        TransformerConfig.from_dict({"n_heads": 4})
    with pytest.raises(ValueError, match="unknown preset 'gpt5'"):
        TransformerConfig.preset("gpt5")
    with pytest.raises(ValueError, match="unknown mlp='gelu2'"):
        TransformerConfig.preset("tiny").replace(mlp="gelu2")


def test_missing_kernel_api_is_named(monkeypatch):
    """A config whose kernel API is not exported raises NotImplementedError naming it (no launch)."""
    import fused_rope

    monkeypatch.delattr(fused_rope, "apply_rotary_qk")
    with pytest.raises(NotImplementedError, match=r"fused_rope\.apply_rotary_qk \(position='rope'\)"):
        Transformer(TransformerConfig.preset("tiny", position="rope"))
    Transformer(TransformerConfig.preset("tiny"))  # a config that does not need it still builds
    TorchTransformer(TransformerConfig.preset("tiny", position="rope"))  # the PyTorch model never needs it
