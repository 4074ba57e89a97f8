"""Transformer (kernel packages) against TorchTransformer (plain PyTorch) from one state_dict.

Component by component as the kernels land, then the whole model: logits, loss and every
gradient, for each option combination, under the project's rule (error against float64 at
most 2x PyTorch's own in the same precision). Tiny shapes: these run in the interpreter.
"""

import pytest
import torch
from tritonformer_testkit import dtype_params

from tritonformer import TransformerConfig, model, torch_model

pytestmark = pytest.mark.kernels


def tiny(**options) -> TransformerConfig:
    base = dict(vocab_size=256, n_layer=2, n_head=4, d_model=32, max_seq_len=32)
    return TransformerConfig(**{**base, **options})


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("dtype", dtype_params())
def test_swiglu_mlp(bias, dtype, device, check_twins):
    config = tiny(mlp="swiglu", d_ff=80, use_linear_bias=bias)
    reference = torch_model.SwiGLUMLP(config).to(device)
    for p in reference.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    ours = model.SwiGLUMLP(config).to(device)
    check_twins(ours, reference, [torch.randn(2, 7, 32, device=device)], dtype)


@pytest.mark.parametrize("activation", ["gelu-tanh", "gelu-exact", "relu"])
def test_mlp(activation, device, check_twins):
    mlp, approximate = ("relu", "tanh") if activation == "relu" else ("gelu", activation.split("-")[1])
    config = tiny(mlp=mlp, gelu_approximate=approximate.replace("exact", "none"), d_ff=48)
    reference = torch_model.MLP(config).to(device)
    for p in reference.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    check_twins(model.MLP(config).to(device), reference, [torch.randn(2, 5, 32, device=device)], torch.bfloat16)


class WithPositions(torch.nn.Module):
    """An attention module fed its model's position tables (they are a model-level input)."""

    def __init__(self, attn, owner):
        super().__init__()
        self.attn, self.owner = attn, [owner]

    def forward(self, x):
        return self.attn(x, self.owner[0].position_tables(x.shape[1], x.device))


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(dict(position="learned"), id="mha"),
        pytest.param(dict(position="rope", n_kv_head=2), id="rope-gqa"),
        pytest.param(dict(position="alibi", n_kv_head=1, qkv_bias=False), id="alibi-mqa"),
    ],
)
def test_attention(options, device, check_twins, require_kernels):
    config = tiny(d_model=64, **options)  # head_dim 16, the smallest the attention kernel takes
    require_kernels(config)
    ref_model, our_model = torch_model.TorchTransformer(config), model.Transformer(config)
    reference = WithPositions(ref_model.blocks[0].attn, ref_model).to(device)
    for p in reference.parameters():
        torch.nn.init.normal_(p, 0.0, 0.2)
    ours = WithPositions(our_model.blocks[0].attn, our_model).to(device)
    check_twins(ours, reference, [torch.randn(2, 19, 64, device=device)], torch.bfloat16)


class LossOf(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, idx, targets):
        return self.lm(idx, targets)[1]


class LogitsOf(LossOf):
    def forward(self, idx):
        return self.lm(idx)[0]


# head_dim 16 (the smallest the attention kernel takes); GQA with groups of 2 is in test_attention.
WHOLE_MODELS = [
    pytest.param(dict(), id="gpt2"),
    pytest.param(
        dict(
            position="rope",
            norm="rmsnorm",
            mlp="swiglu",
            d_ff=64,
            n_kv_head=1,
            use_linear_bias=False,
            qkv_bias=False,
            tie_embeddings=False,
            fused_loss=True,
        ),
        id="llama-mqa-fused_loss",
        marks=pytest.mark.torch_dynamo,  # the twin's chunked loss is checkpointed
    ),  # fmt: skip
    pytest.param(
        # loss_chunk_size: the fused loss in several chunks of tokens (the default is one here).
        dict(position="alibi", mlp="relu", fused_loss=True, loss_chunk_size=24),
        id="alibi-relu-fused_loss",
        marks=pytest.mark.torch_dynamo,
    ),
]


@pytest.mark.parametrize("options", WHOLE_MODELS)
def test_whole_model_logits_loss_and_gradients(options, twins, device, check_twins):
    """bf16: the loss and all its gradients; without fused_loss also the logits and the gradients
    through them (the fused_loss configs use the same head and cross-entropy for their logits)."""
    config = tiny(n_head=2, **options)
    ours, reference = twins(config)
    with torch.no_grad():  # biases and norm parameters away from their 0 / 1 init, so a misplaced one shows
        for p in reference.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    idx, targets = torch.randint(0, 256, (2, 16), device=device), torch.randint(0, 256, (2, 16), device=device)
    targets[0, :5] = -100
    check_twins(LossOf(ours), LossOf(reference), [idx, targets], torch.bfloat16)
    if not config.fused_loss:
        check_twins(LogitsOf(ours), LogitsOf(reference), [idx], torch.bfloat16)
