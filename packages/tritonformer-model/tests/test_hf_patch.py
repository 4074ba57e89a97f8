"""tritonformer.hf.apply on transformers models: the same logits, loss and gradients as the unpatched model.

Tiny random configs, nothing downloaded. The patched model in bf16 (the attention kernels take
fp16/bf16) or fp32 must be at most 2x as far from the float64 unpatched model as the unpatched
model in the same dtype (gradients: RMS error, see assert_rms_close_to_reference). Each test
also counts the kernel calls, so that a silent fallback to transformers' code cannot pass.
"""

from __future__ import annotations

import collections
import copy

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, assert_rms_close_to_reference
from tritonformer_testkit.tolerance import DEFAULT_ATOL

import fused_attention
import fused_norm_xent
import fused_rope
import fused_swiglu
from fused_attention.reference import attention_reference
from tritonformer import hf, hf_kernels

transformers = pytest.importorskip(
    "transformers", reason="transformers is not importable here: the HF patch tests need it (pip install transformers)"
)

pytestmark = [pytest.mark.kernels, pytest.mark.torch_dynamo]

VOCAB, SEQ = 128, 16
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**COMMON, num_key_value_heads=2, max_position_embeddings=64),
    "mistral": lambda: transformers.MistralConfig(
        **COMMON, num_key_value_heads=2, max_position_embeddings=64, sliding_window=8
    ),
    # Layer 0 full attention, layer 1 a sliding window; q/k/v biases.
    "qwen2": lambda: transformers.Qwen2Config(
        **COMMON, num_key_value_heads=2, max_position_embeddings=64, use_sliding_window=True, sliding_window=8,
        max_window_layers=1,
    ),
    "gemma": lambda: transformers.GemmaConfig(**COMMON, num_key_value_heads=1, head_dim=16, max_position_embeddings=64),
    # Layers alternate a sliding window and full attention; both softcaps bend this model's scores and logits.
    "gemma2": lambda: transformers.Gemma2Config(
        **COMMON, num_key_value_heads=2, head_dim=16, max_position_embeddings=64, sliding_window=8,
        query_pre_attn_scalar=16, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
    ),
    # Qwen3: q/k norms on the head dim (RMSNorm modules), GQA.
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, num_key_value_heads=2, head_dim=16, max_position_embeddings=64),
    # Gemma 3's text model: q/k norms, local and global rotary bases, windows on most layers.
    "gemma3_text": lambda: transformers.Gemma3TextConfig(
        **COMMON, num_key_value_heads=2, head_dim=16, max_position_embeddings=64, sliding_window=8,
        query_pre_attn_scalar=16,
    ),
    "gpt2": lambda: transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    ),
}  # fmt: skip
# The kernels each model type reaches (GPT-2: LayerNorm, no rotary embedding or gated MLP; Gemma's
# GeGLU through swiglu_mlp with activation="gelu_tanh").
KERNELS = {
    "llama": {"rms_norm", "apply_rotary_qk", "swiglu_mlp"},
    "mistral": {"rms_norm", "apply_rotary_qk", "swiglu_mlp"},
    "qwen2": {"rms_norm", "apply_rotary_qk", "swiglu_mlp"},
    "gemma": {"rms_norm", "apply_rotary_qk", "swiglu_mlp"},
    "gemma2": {"rms_norm", "apply_rotary_qk", "swiglu_mlp"},
    "gemma3_text": {"rms_norm", "apply_rotary_qk", "swiglu_mlp"},
    "qwen3": {"rms_norm", "apply_rotary_qk", "swiglu_mlp"},
    "gpt2": {"layer_norm"},
}


def tiny_model(model_type: str, device, **overrides) -> torch.nn.Module:
    """A CausalLM with random weights, non-trivial norm weights and biases, in train mode (no dropout)."""
    config = CONFIGS[model_type]()
    for name, value in overrides.items():
        setattr(config, name, value)
    # Gemma-2's own attention is eager: where transformers picks sdpa for it (it did on a CUDA machine,
    # not on the CPU), sdpa drops attn_logit_softcapping, and the unpatched model is not Gemma-2.
    attention = {"attn_implementation": "eager"} if model_type == "gemma2" else {}
    model = transformers.AutoModelForCausalLM.from_config(config, **attention).to(device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name or ".ln_" in name:
                p.normal_(0.0, 0.2).add_(0.0 if model_type.startswith("gemma") or name.endswith("bias") else 1.0)
    return model.train()


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the calls of the kernel packages' public functions that the patches use."""
    calls = collections.Counter()
    targets = [
        (fused_attention, "flash_attention"), (fused_attention, "flash_attention_varlen"),
        (fused_norm_xent, "rms_norm"), (fused_norm_xent, "layer_norm"), (fused_norm_xent, "cross_entropy"),
        (fused_norm_xent, "linear_cross_entropy"), (fused_rope, "apply_rotary_qk"), (fused_swiglu, "swiglu_mlp"),
    ]  # fmt: skip
    for module, name in targets:
        original = getattr(module, name)

        def counted(*args, _wrapped=original, _name=name, **kwargs):
            calls[_name] += 1
            return _wrapped(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.fixture
def class_patches():
    """Undoes every class-level patch when the test ends."""
    yield
    hf.revert()


def padded_batch(device, padding):
    """input_ids, attention_mask and labels (-100 on padding). padding True: row 0 left-padded, row 1
    right-padded; "right": both rows right-padded (Gemma-2's eager float64 reference turns a fully
    masked row into NaN: its fp64 mask minimum becomes -inf in the fp32 softmax)."""
    ids = torch.randint(0, VOCAB, (2, SEQ), device=device)
    mask = torch.ones_like(ids)
    if padding == "right":
        mask[0, 13:] = 0
        mask[1, 11:] = 0
    elif padding:
        mask[0, :5] = 0
        mask[1, 11:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return ids, (mask if padding else None), labels


def run(model, ids, mask, labels, autocast=None):
    """(logits without labels, loss with labels, every parameter's gradient), under torch.autocast to
    `autocast` if given; the second forward in training."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(ids.device.type, dtype=autocast, enabled=autocast is not None):
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits
        out = model(ids, attention_mask=mask, labels=labels)
        out.loss.backward()
    return logits, out, {name: p.grad for name, p in model.named_parameters()}


def check_against_unpatched(model_type, dtype, padding, device, kernel_calls, autocast=False):
    """The patched model in `dtype` (autocast: fp32 weights under torch.autocast to `dtype`) against the
    float64 unpatched one, with the unpatched model run the same way as the bound."""
    reference = tiny_model(model_type, device)
    weights, amp = (torch.float32, dtype) if autocast else (dtype, None)
    lowp = copy.deepcopy(reference).to(weights)
    ours = copy.deepcopy(reference).to(weights)
    report = hf.apply(ours)
    assert not report.skipped, report
    ids, mask, labels = padded_batch(device, padding)
    logits64, out64, grads64 = run(reference.double(), ids, mask, labels)
    logits_lp, out_lp, grads_lp = run(lowp, ids, mask, labels, amp)
    logits, out, grads = run(ours, ids, mask, labels, amp)
    assert out.logits is None and out_lp.logits is not None  # fused linear cross-entropy: no logits in training
    valid = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()  # padded rows: unspecified
    assert_close_to_reference(logits[valid], logits64[valid], logits_lp[valid], name="logits")
    assert out.loss.dtype == out_lp.loss.dtype == torch.float32
    # The fp32 loss of a model computed in `dtype`: the slack of `dtype` (what the twin tests give the loss
    # of a bf16 model), not fp32's, which would ask a one-number comparison to be exact.
    assert_close_to_reference(out.loss, out64.loss, out_lp.loss, atol=DEFAULT_ATOL[dtype], name="loss")
    assert set(grads) == set(grads64)
    for name, grad in grads.items():
        assert_rms_close_to_reference(grad, grads64[name], grads_lp[name], name=f"{name} grad")
    expected = KERNELS[model_type] | {"linear_cross_entropy"}
    if dtype in (torch.float16, torch.bfloat16):
        expected.add("flash_attention_varlen" if padding else "flash_attention")
    assert expected <= {name for name, n in kernel_calls.items() if n}, kernel_calls


# Every attention path of the kernels: dense causal with GQA (llama), varlen for left and right padding
# with a window (mistral), varlen causal and windowed in one model with q/k/v biases (qwen2: layer 0
# full, layer 1 windowed), MHA dense and varlen (gpt2). (The dense window: the cache-geometry tests.)
BF16_CASES = [
    ("llama", False), ("mistral", True), ("qwen2", True), ("gpt2", False), ("gpt2", True), ("gemma2", False),
    ("gemma2", "right"), ("gemma3_text", True), ("qwen3", True),
]  # fmt: skip
PADDING_IDS = {False: "no-padding", True: "padding", "right": "right-padding"}


@pytest.mark.parametrize(
    "model_type, padding", [pytest.param(*case, id=f"{case[0]}-{PADDING_IDS[case[1]]}") for case in BF16_CASES]
)
def test_bf16_matches_unpatched(model_type, padding, device, kernel_calls):
    check_against_unpatched(model_type, torch.bfloat16, padding, device, kernel_calls)


@pytest.mark.parametrize("model_type", ["llama", "gemma2", "gpt2"])
def test_autocast_matches_unpatched(model_type, device, kernel_calls):
    """fp32 weights under torch.autocast(bf16), the usual training setup: an fp32 residual stream, the
    norms that feed linear layers written in bf16 (the unpatched model casts them there), q/k rotated
    from bf16 projections with fp32 cos/sin into bf16, attention and the gated MLP in bf16, an fp32
    loss; Gemma-2's post-norms and every final norm keep the unpatched model's dtype."""
    padding = "right" if model_type == "gemma2" else True
    check_against_unpatched(model_type, torch.bfloat16, padding, device, kernel_calls, autocast=True)


@pytest.mark.parametrize(
    "model_type, marked",
    [("llama", {"input_layernorm", "post_attention_layernorm"}),
     ("gemma2", {"input_layernorm", "pre_feedforward_layernorm"}), ("gpt2", {"ln_1", "ln_2"})],
)  # fmt: skip
def test_norms_that_feed_linear_layers_give_autocast_dtype(model_type, marked, device, kernel_calls):
    """apply marks the pre-attention and pre-MLP norms of each layer; under autocast those return
    bf16 (what every linear layer they feed casts to), the others the unpatched model's dtype."""
    model = tiny_model(model_type, device)
    hf.apply(model)
    norms = {name: m for name, m in model.named_modules() if "norm" in type(m).__name__.lower()}
    feeds = {name for name, m in norms.items() if getattr(m, hf_kernels.FEEDS_MATMULS, False)}
    assert {name.rpartition(".")[2] for name in feeds} == marked and len(feeds) == 2 * len(marked)
    x = torch.randn(2, 5, 64, device=device)
    for name, norm in norms.items():
        if not hasattr(norm, "weight") or norm.weight.shape != (64,):
            continue  # Gemma 2's q/k norms are absent; this loop sees the hidden-size norms only
        with torch.autocast(device, dtype=torch.bfloat16):
            got = norm(x)
        expected = torch.bfloat16 if name in feeds else torch.float32
        assert got.dtype == expected, name
    hf.revert(model)
    assert not any(getattr(m, hf_kernels.FEEDS_MATMULS, False) for m in model.modules())


@pytest.mark.parametrize("model_type", ["gemma", "gemma2", "gemma3_text", "gpt2"])
def test_fp32_matches_unpatched(model_type, device, kernel_calls):
    """fp32: the norm (Gemma's 1 + w), rotary and loss kernels in fp32; attention through sdpa (the kernels
    take fp16/bf16), given the 4-D mask rebuilt from tritonformer_mask's padding mask (Gemma: MQA), or for
    Gemma-2's softcap through the model's own eager attention on that mask made additive."""
    check_against_unpatched(
        model_type, torch.float32, "right" if model_type == "gemma2" else True, device, kernel_calls
    )
    assert not kernel_calls["flash_attention"] and not kernel_calls["flash_attention_varlen"]


# ---------------------------------------------------------------------------------------------
# The attention function alone, against sdpa given transformers' own 4-D mask for the same call.


class AttentionModule(torch.nn.Module):
    """What the attention functions read from their module."""

    def __init__(self, groups: int = 2, is_causal: bool = True):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, is_causal


def qkv(device, q_len, k_len, dtype=torch.bfloat16, heads=4, kv_heads=2, head_dim=16, batch=2):
    shapes = ((batch, heads, q_len, head_dim), (batch, kv_heads, k_len, head_dim), (batch, kv_heads, k_len, head_dim))
    return [torch.randn(shape, device=device, dtype=dtype) for shape in shapes]


def sdpa(module, q, k, v, mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, q, k, v, mask, **kwargs)[0]


def masks(device, batch, q_len, kv_length, q_offset, kv_offset, window, padding):
    """(tritonformer_mask's mask, sdpa_mask's 4-D mask) for one call of transformers' mask creation."""
    from transformers import masking_utils

    function = masking_utils.causal_mask_function
    if window is not None:
        function = masking_utils.sliding_window_causal_mask_function(window)
    args = dict(
        batch_size=batch, q_length=q_len, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
        mask_function=function, attention_mask=padding, local_size=window, device=device,
    )  # fmt: skip
    return hf_kernels.tritonformer_mask(**args), masking_utils.sdpa_mask(**args, allow_is_causal_skip=False)


# (q_offset, q_len, kv_length, kv_offset, window, padded): prefill, decode, chunked prefill after a
# cache, a static cache (unused slots past the last query), a sliding-window cache (kv_offset > 0).
CACHE_CASES = {
    "prefill-left-padding": (0, 12, 12, 0, None, True),
    "decode-left-padding": (11, 1, 12, 0, None, True),
    "chunk-after-cache": (6, 5, 11, 0, None, False),
    "static-cache": (4, 3, 16, 0, None, False),
    "static-cache-padding": (4, 3, 16, 0, None, True),
    "window-prefill-padding": (0, 12, 12, 0, 5, True),
    "window-decode": (11, 1, 12, 0, 5, True),
    "window-cache-offset": (12, 2, 6, 8, 5, False),
}


@pytest.mark.parametrize("case", list(CACHE_CASES))
def test_attention_matches_sdpa_on_cache_geometries(case, device, kernel_calls):
    q_offset, q_len, kv_length, kv_offset, window, padded = CACHE_CASES[case]
    total = q_offset + q_len
    padding = torch.ones(2, total, dtype=torch.bool, device=device)
    if padded:
        padding[0, :3] = False  # left padding of row 0
    ours_mask, sdpa_mask = masks(device, 2, q_len, kv_length, q_offset, kv_offset, window, padding)
    module = AttentionModule()
    q, k, v = qkv(device, q_len, kv_length)
    out = hf_kernels.tritonformer_attention_forward(module, q, k, v, ours_mask, scaling=0.25, sliding_window=window)[0]
    exact = sdpa(module, q.double(), k.double(), v.double(), sdpa_mask, scaling=0.25)
    lowp = sdpa(module, q, k, v, sdpa_mask, scaling=0.25)
    queries = padding[:, q_offset:total]  # rows of padded queries are unspecified
    assert_close_to_reference(out[queries], exact[queries], lowp[queries])
    assert kernel_calls["flash_attention"] + kernel_calls["flash_attention_varlen"] == 1


def test_padding_layout_is_read_once_per_mask(device, kernel_calls, monkeypatch):
    """Every layer of a forward receives the same mask object: the varlen layout (token positions,
    cu_seqlens, the launch sizes read on the host) is computed at the first layer and reused, and
    the positions are those of the mask's True entries in order."""
    padding = torch.ones(2, 12, dtype=torch.bool, device=device)
    padding[0, :3] = False
    padding[1, 9:] = False
    ours_mask, _ = masks(device, 2, 12, 12, 0, 0, None, padding)
    module = AttentionModule()
    q, k, v = qkv(device, 12, 12)
    reads = []
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t, _read=torch.Tensor.tolist: reads.append(1) or _read(t))
    first = hf_kernels.tritonformer_attention_forward(module, q, k, v, ours_mask, scaling=0.25)[0]
    second = hf_kernels.tritonformer_attention_forward(module, q, k, v, ours_mask, scaling=0.25)[0]
    assert len(reads) == 1 and torch.equal(first, second) and kernel_calls["flash_attention_varlen"] == 2
    (layout,) = vars(ours_mask)["_tritonformer_varlen"].values()
    assert torch.equal(layout.q_index, padding.flatten().nonzero().flatten())
    assert layout.cu_q.tolist() == [0, 9, 18] and (layout.max_q, layout.max_k) == (9, 9)


def test_attention_falls_back_to_sdpa(device, kernel_calls):
    """A 4-D mask, fp32 without autocast, an unsupported head dim, a window over a padding mask with a
    hole: sdpa's own result (bit for bit), no kernel launched."""
    module = AttentionModule()
    q, k, v = qkv(device, 6, 6)
    custom = torch.rand(2, 1, 6, 6, device=device) > 0.3  # non-causal, arbitrary
    assert torch.equal(
        hf_kernels.tritonformer_attention_forward(module, q, k, v, custom)[0], sdpa(module, q, k, v, custom)
    )
    q32, k32, v32 = (t.float() for t in (q, k, v))
    fp32 = hf_kernels.tritonformer_attention_forward(module, q32, k32, v32, None)[0]
    assert torch.equal(fp32, sdpa(module, q32, k32, v32, None))
    q8, k8, v8 = qkv(device, 6, 6, head_dim=8)
    assert torch.equal(
        hf_kernels.tritonformer_attention_forward(module, q8, k8, v8, None)[0], sdpa(module, q8, k8, v8, None)
    )
    padding = torch.ones(2, 6, dtype=torch.bool, device=device)
    padding[1, 2] = False  # a hole: the kernel's window would count tokens, transformers' counts positions
    ours_mask, sdpa_mask = masks(device, 2, 6, 6, 0, 0, 3, padding)
    windowed = hf_kernels.tritonformer_attention_forward(module, q, k, v, ours_mask, sliding_window=3)[0]
    assert torch.equal(windowed, sdpa(module, q, k, v, sdpa_mask))
    assert not kernel_calls
    with pytest.raises(ValueError, match="softcap"):  # sdpa's own error, for a module without eager attention
        hf_kernels.tritonformer_attention_forward(module, q32, k32, v32, None, softcap=30.0)
    with pytest.raises(ValueError, match="s_aux"):  # sdpa would ignore attention sinks
        hf_kernels.tritonformer_attention_forward(module, q, k, v, None, s_aux=torch.zeros(4))


def test_softcap_and_dropout_run_in_the_kernels(device, kernel_calls):
    """Gemma-2's softcap and attention dropout reach fused_attention: softcapped attention against the
    float64 reference, dropout with the mask the kernel draws from torch's generator (bit for bit)."""
    module = AttentionModule()
    q, k, v = qkv(device, 6, 9)
    out = hf_kernels.tritonformer_attention_forward(module, q, k, v, None, softcap=2.0)[0]
    assert kernel_calls["flash_attention"] == 1
    reference, lowp = (
        attention_reference(q, k, v, causal=True, softcap=2.0, layout="bhsd", dtype=dtype)[0].transpose(1, 2)
        for dtype in (torch.float64, torch.bfloat16)
    )  # fmt: skip
    assert_close_to_reference(out, reference, lowp)
    torch.manual_seed(3)
    dropped = hf_kernels.tritonformer_attention_forward(module, q, k, v, None, dropout=0.5)[0]
    torch.manual_seed(3)
    expected = fused_attention.flash_attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, dropout_p=0.5)
    assert torch.equal(dropped, expected)


def test_attention_dropout_of_a_patched_model(device, kernel_calls):
    """config.attention_dropout in training reaches the kernels: torch.manual_seed repeats the loss and
    its gradients, another seed changes them; in eval the model is deterministic and undropped."""
    model = tiny_model("llama", device, attention_dropout=0.3).to(torch.bfloat16)
    hf.apply(model)
    ids, _, labels = padded_batch(device, False)

    def loss_and_grad(seed):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        loss = model(ids, labels=labels).loss
        loss.backward()
        return loss.detach(), model.model.embed_tokens.weight.grad.clone()

    first, again, other = loss_and_grad(0), loss_and_grad(0), loss_and_grad(1)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])
    with torch.no_grad():
        undropped = model.eval()(ids, labels=labels).loss
        assert torch.equal(undropped, model(ids, labels=labels).loss) and not torch.equal(undropped, first[0])
    assert kernel_calls["flash_attention"] >= 5


def test_attention_fp32_under_autocast_runs_the_kernel(device, kernel_calls):
    module = AttentionModule()
    q, k, v = qkv(device, 6, 6, dtype=torch.float32)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = hf_kernels.tritonformer_attention_forward(module, q, k, v, None)[0]
        lowp = sdpa(module, q, k, v, None)
    assert out.dtype == lowp.dtype == torch.bfloat16 and kernel_calls["flash_attention"] == 1
    assert_close_to_reference(out, sdpa(module, q.double(), k.double(), v.double(), None), lowp)


# ---------------------------------------------------------------------------------------------
# Losses.

ONLY_LOSSES = dict(rms_norm=False, layer_norm=False, rope=False, swiglu=False, attention=False)


def test_cross_entropy_alone_keeps_the_logits(device, kernel_calls):
    reference = tiny_model("llama", device)
    lowp = copy.deepcopy(reference).to(torch.bfloat16)
    ours = copy.deepcopy(reference).to(torch.bfloat16)
    report = hf.apply(ours, fused_linear_cross_entropy=False, **ONLY_LOSSES)
    assert set(report.patched) == {"cross_entropy"} and ours.loss_function is hf_kernels.causal_lm_loss
    ids, _, labels = padded_batch(device, False)
    labels[0, 3:7] = -100
    out, out_lp, out64 = (model(ids, labels=labels) for model in (ours, lowp, reference.double()))
    assert torch.equal(out.logits, out_lp.logits)  # the same model up to the loss
    assert out.loss.dtype == torch.float32
    assert_close_to_reference(out.loss, out64.loss, out_lp.loss, atol=DEFAULT_ATOL[torch.bfloat16], name="loss")
    out.loss.backward()
    out_lp.loss.backward()
    grad, grad_lp = ours.lm_head.weight.grad, lowp.lm_head.weight.grad
    out64.loss.backward()
    assert_rms_close_to_reference(grad, reference.lm_head.weight.grad, grad_lp, name="lm_head grad")
    assert kernel_calls["cross_entropy"] == 1 and not kernel_calls["linear_cross_entropy"]


def test_fused_loss_only_with_labels_in_training(device, kernel_calls):
    """Eval mode or no labels: the unpatched forward (logits). Training with labels: logits=None, the loss of
    transformers' ForCausalLMLoss, num_items_in_batch, positional labels and return_dict=False included,
    and no KV cache unless asked for."""
    reference = tiny_model("llama", device, use_cache=False)
    ours = copy.deepcopy(reference)
    hf.apply(ours, cross_entropy=False, **ONLY_LOSSES)
    ids, _, labels = padded_batch(device, False)
    labels[1, :4] = -100
    ours.eval()
    reference.eval()
    evaluated = ours(ids, labels=labels)
    assert torch.equal(evaluated.logits, reference(ids).logits) and not kernel_calls
    ours.train()
    assert torch.equal(ours(ids).logits, reference(ids).logits) and not kernel_calls
    # A count other than the targets' (then sum / count differs from the mean), of the loss's magnitude.
    items = torch.tensor(int((labels[:, 1:] != -100).sum()) + 3)
    trained = ours(ids, labels=labels, num_items_in_batch=items)
    assert trained.logits is None and kernel_calls["linear_cross_entropy"] == 1
    expected, exact = (
        model(ids, labels=labels, num_items_in_batch=items).loss
        for model in (reference, copy.deepcopy(reference).double())
    )
    assert_close_to_reference(trained.loss, exact, expected)
    as_tuple = ours(ids, None, None, None, None, labels, return_dict=False)  # labels as the 6th positional
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], ours(ids, labels=labels).loss)
    ours.config.use_cache = True  # most configs' default: still no cache in a training step, unless asked
    assert ours(ids, labels=labels).past_key_values is None
    cached = ours(ids, labels=labels, use_cache=True)
    assert cached.past_key_values is not None and torch.equal(cached.loss, ours(ids, labels=labels).loss)


# ---------------------------------------------------------------------------------------------
# generate(), save_pretrained / from_pretrained.


def prompts(device):
    """Two prompts of 7 and 4 tokens, left-padded as generate() expects."""
    ids = torch.randint(1, VOCAB, (2, 7), device=device)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("model_type", ["mistral", "gemma2", "gpt2"])
def test_generate_gives_the_same_greedy_tokens(model_type, device, kernel_calls):
    """fp32 (tokens cannot flip on rounding): the cache, the left padding and Mistral's and Gemma-2's
    windows (7 + 8 tokens > 8) through the patched norms, rotary embedding, MLP and tritonformer_mask
    (Gemma-2's softcapped attention in fp32: its eager attention on the rebuilt masks)."""
    reference = tiny_model(model_type, device).eval()
    ours = copy.deepcopy(reference)
    hf.apply(ours)
    ids, mask = prompts(device)
    options = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, **options), reference.generate(ids, **options))
    assert KERNELS[model_type] <= set(kernel_calls)


@pytest.mark.parametrize("model_type, padded", [("llama", True), ("gemma2", False)])
def test_generate_bf16_logits_with_the_attention_kernels(model_type, padded, device, kernel_calls):
    """bf16 (the attention kernels' precision): each step's logits against the unpatched model's, run on
    the generated sequence in one forward (greedy tokens may flip on a bf16 near-tie, so no token check).
    Gemma-2 (softcapped attention and logits in the kernels) without padding: its eager float64
    reference turns a left-padded row into NaN (see padded_batch)."""
    reference = tiny_model(model_type, device).eval()
    lowp = copy.deepcopy(reference).to(torch.bfloat16)
    ours = copy.deepcopy(lowp)
    hf.apply(ours)
    ids, mask = prompts(device)
    if not padded:
        mask = torch.ones_like(mask)
    generated = ours.generate(
        ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
        return_dict_in_generate=True,
    )  # fmt: skip
    logits = torch.stack(generated.logits, dim=1)  # (batch, steps, vocab)
    full_mask = torch.cat([mask, torch.ones_like(generated.sequences[:, 7:])], dim=1)
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    steps = slice(6, 6 + logits.shape[1])  # position i's logits predict token i + 1
    with torch.no_grad():
        exact, lowp_logits = (
            model(generated.sequences, attention_mask=full_mask, position_ids=positions).logits[:, steps]
            for model in (reference.double(), lowp)
        )
    assert_close_to_reference(logits, exact, lowp_logits, name="generated logits")
    assert kernel_calls["flash_attention_varlen" if padded else "flash_attention"] > 0  # prompt and cached steps


def test_save_pretrained_round_trip(tmp_path, device):
    reference = tiny_model("llama", device).eval()
    ours = copy.deepcopy(reference)
    hf.apply(ours)
    ours.save_pretrained(tmp_path)
    assert hf.ATTENTION_NAME not in (tmp_path / "config.json").read_text()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).to(device).eval()
    assert loaded.config._attn_implementation == "sdpa" and not any("forward" in vars(m) for m in loaded.modules())
    state = reference.state_dict()
    assert all(torch.equal(value, state[name]) for name, value in loaded.state_dict().items())
    ids = torch.randint(0, VOCAB, (2, SEQ), device=device)
    assert torch.equal(loaded(ids).logits, reference(ids).logits)


# ---------------------------------------------------------------------------------------------
# Class-level patches, reports, preconditions, revert.


def test_apply_to_llama_patches_new_models(device, class_patches, kernel_calls):
    modeling = transformers.models.llama.modeling_llama
    original_rope = modeling.apply_rotary_pos_emb
    report = hf.apply_to_llama()
    assert set(report.patched) == {
        "rms_norm", "rope", "swiglu", "attention", "cross_entropy", "fused_linear_cross_entropy",
    } and not report.skipped  # fmt: skip
    reference = tiny_model("llama", device)
    assert reference.config._attn_implementation == hf.ATTENTION_NAME
    explicit = transformers.LlamaForCausalLM._from_config(CONFIGS["llama"](), attn_implementation="eager")
    assert explicit.config._attn_implementation == "eager"  # an explicit choice is kept
    assert hf.apply(reference).patched["rms_norm"].endswith("(patched at class level)")
    ids = torch.randint(0, VOCAB, (2, 8), device=device)
    assert reference(ids, labels=ids).logits is None and kernel_calls["linear_cross_entropy"] == 1
    assert {"rms_norm", "apply_rotary_qk", "swiglu_mlp"} <= set(kernel_calls)
    hf.revert()
    assert modeling.apply_rotary_pos_emb is original_rope
    assert tiny_model("llama", device).config._attn_implementation == "sdpa"
    assert modeling.LlamaRMSNorm.forward.__module__ == modeling.__name__


def test_apply_to_llama_marks_the_norms_that_feed_linear_layers(device, class_patches):
    hf.apply_to_llama()
    model = tiny_model("llama", device)
    feeds = {name for name, m in model.named_modules() if getattr(m, hf_kernels.FEEDS_MATMULS, False)}
    assert feeds == {f"model.layers.{i}.{n}" for i in range(2) for n in ("input_layernorm", "post_attention_layernorm")}


def test_apply_to_gpt2_patches_the_layer_norms_of_new_models(device, class_patches):
    report = hf.apply_to_gpt2(attention=False, cross_entropy=False, fused_linear_cross_entropy=False)
    assert set(report.patched) == {"layer_norm"}
    model = tiny_model("gpt2", device)
    norms = [m for m in model.modules() if type(m) is torch.nn.LayerNorm]
    assert len(norms) == 5 and all(vars(m)["forward"].__func__ is hf_kernels.layer_norm_forward for m in norms)


def test_report_and_revert(device):
    model = tiny_model("llama", device)
    report = hf.apply(model)
    text = str(report)
    assert text.startswith("tritonformer patches for llama:") and "\n  attention: config._attn_implementation" in text
    assert hf.apply(model).patched["rms_norm"].endswith("(already patched)")
    hf.revert(model)
    assert model.config._attn_implementation == "sdpa" and "_loss_function" not in vars(model)
    assert not any("forward" in vars(m) for m in model.modules())


def test_a_switch_the_model_cannot_take_is_left_alone(device):
    """Preconditions are checked before any change: a switch is applied to every module or to none."""
    model = tiny_model("llama", device, hidden_act="gelu")  # not a SwiGLU: the MLP switch cannot apply
    foreign = model.model.layers[1].input_layernorm
    foreign.forward = lambda x: x  # another patch on one RMSNorm: the rms_norm switch cannot apply
    report = hf.apply(model)
    assert "GELUActivation, not SiLU" in report.skipped["swiglu"]
    assert "already have a forward set on the instance" in report.skipped["rms_norm"]
    assert {"rope", "attention", "cross_entropy", "fused_linear_cross_entropy"} == set(report.patched)
    assert not any(
        "forward" in vars(m)
        for m in model.modules()
        if type(m).__name__ in ("LlamaMLP", "LlamaRMSNorm") and m is not foreign
    )
    gemma = hf.apply(tiny_model("gemma", device))  # GeGLU: the tanh-approximate GELU gate is fused
    assert "swiglu" in gemma.patched and not gemma.skipped


def test_unsupported_models_raise():
    bert = transformers.BertModel(
        transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32)
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"model type 'bert' \(BertModel\) is not supported by tritonformer.hf"):
        hf.apply(bert)
    with pytest.raises(TypeError, match="instantiated transformers PreTrainedModel, got Linear"):
        hf.apply(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="rope must be a bool"):
        hf.apply(tiny_model("llama", "cpu"), rope="yes")


def test_a_failing_patch_undoes_the_others(device, monkeypatch):
    model = tiny_model("llama", device)

    def refuse(name):
        raise RuntimeError("set_attn_implementation refused")

    monkeypatch.setattr(model, "set_attn_implementation", refuse)
    with pytest.raises(RuntimeError, match="refused"):
        hf.apply(model)
    assert not any("forward" in vars(m) for m in model.modules()) and "_loss_function" not in vars(model)


def test_where_kernels_cannot_run_the_original_code_runs(monkeypatch, kernel_calls):
    """A CPU model without Triton's interpreter: every patched function falls back, bit for bit."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reference = tiny_model("llama", "cpu")
    ours = copy.deepcopy(reference)
    assert not hf.apply(ours).skipped
    ids, mask, labels = padded_batch("cpu", True)
    expected, got = (model(ids, attention_mask=mask, labels=labels) for model in (reference, ours))
    assert torch.equal(got.loss, expected.loss) and torch.equal(got.logits, expected.logits) and not kernel_calls
    with torch.no_grad():
        assert torch.equal(ours(ids, attention_mask=mask).logits, reference(ids, attention_mask=mask).logits)


def test_rope_keeps_the_contract_of_apply_rotary_pos_emb(device, kernel_calls):
    """The dtype of q promoted with cos's (fp32 for fp32 q, k), and the original function for a layout
    the kernel does not take (unsqueeze_dim=2)."""
    original = transformers.models.llama.modeling_llama.apply_rotary_pos_emb
    rope = hf_kernels.make_rope(original)
    q, k, _ = qkv(device, 6, 6)
    angles = torch.rand(1, 6, 8, device=device) * 6
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    got, expected = rope(q, k, cos, sin), original(q, k, cos, sin)
    exact = original(q.double(), k.double(), cos.double(), sin.double())
    assert got[0].dtype == got[1].dtype == expected[0].dtype == torch.float32 and kernel_calls["apply_rotary_qk"] == 1
    for out, ref, lowp in zip(got, exact, expected):
        assert_close_to_reference(out, ref, lowp)
    bshd = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2)
    assert all(torch.equal(a, b) for a, b in zip(bshd, original(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 2)))
    assert kernel_calls["apply_rotary_qk"] == 1


def test_layer_norm_keeps_the_dtype_of_torch_under_autocast(device, kernel_calls):
    norm = torch.nn.LayerNorm(64, device=device, dtype=torch.bfloat16)
    x = torch.randn(2, 5, 64, device=device, dtype=torch.bfloat16)
    ours = copy.deepcopy(norm)
    ours.forward = hf_kernels.layer_norm_forward.__get__(ours)
    with torch.autocast(device, dtype=torch.bfloat16):
        got, expected = ours(x), norm(x)
    assert got.dtype == expected.dtype and kernel_calls["layer_norm"] == 1
    assert_close_to_reference(got, torch.nn.functional.layer_norm(x.double(), (64,)), expected)


def test_rope_under_autocast_keeps_the_projections_dtype(device, kernel_calls):
    """bf16 q, k with fp32 cos/sin under autocast(bf16): bf16 out (the unpatched fp32 result rounded
    once, as every attention function rounds it), and fp32 q, k keep fp32."""
    original = transformers.models.llama.modeling_llama.apply_rotary_pos_emb
    rope = hf_kernels.make_rope(original)
    q, k, _ = qkv(device, 6, 6)
    angles = torch.rand(1, 6, 8, device=device) * 6
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    with torch.autocast(device, dtype=torch.bfloat16):
        got = rope(q, k, cos, sin)
        assert [t.dtype for t in rope(q.float(), k.float(), cos, sin)] == [torch.float32] * 2
    expected = original(q, k, cos, sin)  # fp32, as the unpatched model's
    exact = original(q.double(), k.double(), cos.double(), sin.double())
    for out, ref, lowp in zip(got, exact, expected):
        assert out.dtype == torch.bfloat16
        assert_close_to_reference(out, ref, lowp.bfloat16())
