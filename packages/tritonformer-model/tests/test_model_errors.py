"""Both models refuse bad configs and inputs early, with one clear ValueError (before any kernel launch)."""

import pytest
import torch

import fused_attention._validation as attention_validation
from tritonformer import TorchTransformer, Transformer, TransformerConfig

MODELS = [pytest.param(Transformer, id="triton"), pytest.param(TorchTransformer, id="torch")]


def tiny(**options) -> TransformerConfig:
    base = dict(vocab_size=256, n_layer=1, n_head=2, d_model=32, max_seq_len=32)
    return TransformerConfig(**{**base, **options})


def test_an_unsupported_head_dim_fails_at_construction():
    config = tiny(d_model=48, n_head=4)  # head_dim 12
    assert config.head_dim not in attention_validation.SUPPORTED_HEAD_DIMS
    with pytest.raises(ValueError, match=r"head_dim=12 \(d_model=48 / n_head=4\).*head dim 12 is not supported"):
        Transformer(config)
    TorchTransformer(config)  # SDPA takes any head dim


def test_the_head_dim_check_is_the_attention_kernels_own(monkeypatch):
    """The model asks fused_attention, so a head dim the kernel comes to take is accepted without a change here."""
    config = tiny(d_model=48, n_head=4)
    monkeypatch.setattr(attention_validation, "SUPPORTED_HEAD_DIMS", (*attention_validation.SUPPORTED_HEAD_DIMS, 12))
    Transformer(config)


@pytest.mark.parametrize("model_class", MODELS)
@pytest.mark.parametrize("bad", [256, 1000, -1])
def test_token_ids_outside_the_vocabulary_are_refused(model_class, bad):
    model = model_class(tiny())
    idx = torch.randint(0, 256, (2, 8))
    idx[1, 3] = bad
    with pytest.raises(ValueError, match=rf"token id {bad} in idx is outside \[0, vocab_size=256\)"):
        model(idx)
    with pytest.raises(ValueError, match=rf"token id {bad}"):
        model.generate(idx, 1)


@pytest.mark.parametrize("model_class", MODELS)
def test_generate_refuses_an_empty_prompt_and_a_bad_temperature(model_class):
    model = model_class(tiny())
    prompt = torch.zeros(1, 4, dtype=torch.long)
    for empty in (torch.zeros(1, 0, dtype=torch.long), torch.zeros(0, 4, dtype=torch.long)):
        with pytest.raises(ValueError, match="generate needs a prompt idx of shape .* with at least one token"):
            model.generate(empty, 2)
    for temperature in (float("nan"), -0.5, float("inf")):
        with pytest.raises(ValueError, match=f"temperature must be a finite number >= 0, got {temperature}"):
            model.generate(prompt, 2, temperature=temperature)


@pytest.mark.torch_compile
def test_the_token_id_check_does_not_break_a_full_graph():
    """Under torch.compile the check (a host read) is left out rather than splitting the graph."""
    model = TorchTransformer(tiny()).eval()
    idx = torch.randint(0, 256, (2, 8))
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx)[0], model(idx)[0])


@pytest.mark.gpu("the check's CUDA path: a device-side min/max read back, and skipped while a graph is captured")
@pytest.mark.parametrize("model_class", MODELS)
def test_token_ids_are_checked_on_cuda_but_not_inside_a_graph_capture(model_class):
    model = model_class(tiny()).cuda().bfloat16().eval()
    idx = torch.randint(0, 256, (2, 8), device="cuda")
    idx[0, 0] = 300
    with pytest.raises(ValueError, match=r"token id 300 in idx is outside \[0, vocab_size=256\)"):
        model(idx)
    idx[0, 0] = 1
    with torch.no_grad():
        expected = model(idx)[0]  # also the warm-up: kernels compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = model(idx)[0]  # a host read here would fail the capture
    graph.replay()
    torch.testing.assert_close(logits, expected)


@pytest.mark.parametrize(
    "model_class",
    [pytest.param(Transformer, id="triton", marks=pytest.mark.kernels), pytest.param(TorchTransformer, id="torch")],
)
def test_the_token_id_check_can_be_turned_off_and_generate_keeps_it(model_class, device):
    device = device if model_class is Transformer else "cpu"  # the twin runs anywhere
    model = model_class(tiny()).to(device)
    model.check_token_ids = False
    calls = []
    model._check_token_ids = calls.append
    idx = torch.randint(0, 256, (2, 8), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):  # the attention kernel takes fp16/bf16
        model(idx)
        assert calls == []
        model.generate(idx, 1)
    assert len(calls) == 1  # a prompt is checked once per generate call, whatever the setting
