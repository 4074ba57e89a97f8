"""generate() through the KV cache: the cached tokens against recomputing the full context, the
twins against each other, sampling options, eos, per-row prompt lengths, cropping past max_seq_len.

Greedy tokens are compared tie-aware: bf16 logits carry errors of about a tenth of a logit here, so
where two tokens' logits lie that close a correct run may pick either. A token may differ from the
reference's only where the reference's own logits put the two within the observed error; any other
difference fails. The cached logits themselves are held to the project's rule (against the float64
twin, with the twin in the same low precision as the bound).
"""

from __future__ import annotations

import copy

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference

from tritonformer import TorchTransformer, Transformer, TransformerConfig, generation
from tritonformer.generation import filter_top_p, sample_next_token

PROMPT = 7

MODELS = {
    "gpt2": dict(),
    "llama-mqa": dict(position="rope", norm="rmsnorm", mlp="swiglu", n_kv_head=1, tie_embeddings=False),
    "alibi-relu": dict(position="alibi", mlp="relu"),
}


def tiny(**options) -> TransformerConfig:
    # head_dim 16: the smallest head dim the attention kernels take.
    base = dict(vocab_size=256, n_layer=2, n_head=2, d_model=32, max_seq_len=64)
    return TransformerConfig(**{**base, **options})


def spread(model: torch.nn.Module, std: float = 0.3) -> torch.nn.Module:
    """Weights far from GPT-2's init (matrices N(0, std), biases N(0, 0.1)): the logits spread over
    a few units and depend on the context, so a wrong cache or position changes the tokens (at the
    init they mostly repeat the last token)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, std)
            elif not name.endswith("weight"):  # a bias (norm weights stay 1)
                p.normal_(0.0, 0.1)
    return model


def make_models(config: TransformerConfig, dtype: torch.dtype, device, require_kernels):
    """(Transformer, TorchTransformer in `dtype`, TorchTransformer in float64), one state_dict."""
    require_kernels(config)
    ours = spread(Transformer(config), 0.3 * (32 / config.d_model) ** 0.5).to(device)
    reference = TorchTransformer(config).to(device)
    reference.load_state_dict(ours.state_dict())
    return ours.to(dtype).eval(), copy.deepcopy(reference).to(dtype).eval(), reference.double().eval()


def generate_recording(model, prompt, steps, **options):
    """(tokens, fp32 logits (B, steps, V) of every sampled position) of model.generate."""
    recorded = []
    hook = model.lm_head.register_forward_hook(lambda module, args, out: recorded.append(out.float()))
    try:
        out = model.generate(prompt, steps, **options)
    finally:
        hook.remove()
    return out, torch.stack(recorded, dim=1)


def full_logits(model, tokens) -> torch.Tensor:
    """fp32 logits (B, S, V) of one forward over tokens: every position's context recomputed."""
    with torch.no_grad():
        return model(tokens)[0].float()


def assert_greedy(tokens, logits, slack, name) -> None:
    """tokens (B, n) are the argmax of logits (B, n, V) wherever the argmax leads its runner-up
    (the chosen token) by more than `slack` ((B, n) or a number): a near-tie may go either way."""
    best = logits.argmax(-1)
    lead = logits.gather(-1, best[..., None])[..., 0] - logits.gather(-1, tokens[..., None])[..., 0]
    wrong = lead > slack
    assert not bool(wrong.any()), (
        f"{name}: {int(wrong.sum())} tokens are not the greedy choice, e.g. at (row, step) "
        f"{tuple(wrong.nonzero()[0].tolist())}: lead {float(lead[wrong][0]):.4f} of the greedy token"
    )


def assert_same_until_a_near_tie(ours, theirs, exact_logits, slack, name) -> int:
    """Row by row, ours == theirs (B, n) up to the first step where they differ; there the exact
    logits must put the two tokens within `slack` (both greedy up to rounding), after which the
    contexts differ and the comparison stops. Returns the number of steps compared."""
    compared = 0
    for row in range(ours.shape[0]):
        differ = (ours[row] != theirs[row]).nonzero()
        stop = int(differ[0]) if len(differ) else ours.shape[1]
        compared += stop
        if stop < ours.shape[1]:
            logits = exact_logits[row, stop]
            gap = float((logits[ours[row, stop]] - logits[theirs[row, stop]]).abs())
            assert gap <= slack, f"{name}: row {row} step {stop}: tokens differ where the logits are {gap:.4f} apart"
    return compared


def check_cached_greedy(ours, lowp, exact, prompt, steps) -> torch.Tensor:
    """Greedy generate of `ours` against its own full forward (the uncached computation of every
    step, on the same context) and its cached logits against float64 under the project's rule."""
    out, cached = generate_recording(ours, prompt, steps, temperature=0)
    assert out.shape == (prompt.shape[0], prompt.shape[1] + steps) and torch.equal(out[:, : prompt.shape[1]], prompt)
    positions = slice(prompt.shape[1] - 1, out.shape[1] - 1)  # the positions predicting the new tokens
    recomputed = full_logits(ours, out)[:, positions]
    exact = full_logits(exact, out)[:, positions]
    assert_close_to_reference(cached, exact, full_logits(lowp, out)[:, positions], name="cached logits")
    # A token may be the runner-up only where the cached and recomputed logits disagree by the lead.
    slack = 2 * (cached - recomputed).abs().amax(-1)
    assert_greedy(out[:, prompt.shape[1] :], recomputed, slack, "cached tokens against the full forward")
    return out


@pytest.mark.kernels
@pytest.mark.parametrize("name", list(MODELS))
def test_cached_greedy_tokens_are_those_of_recomputing_the_context(name, device, require_kernels):
    ours, lowp, exact = make_models(tiny(**MODELS[name]), torch.bfloat16, device, require_kernels)
    prompt = torch.randint(0, 256, (2, PROMPT), device=device)
    out = check_cached_greedy(ours, lowp, exact, prompt, 12)
    assert len(set(out[:, PROMPT:].flatten().tolist())) > 4  # the context matters: not one token repeated


@pytest.mark.kernels
def test_cached_generate_equals_the_uncached_loop(device, require_kernels):
    """The literal uncached loop (a forward over the whole context per token) gives the same tokens."""
    ours, _, exact = make_models(tiny(**MODELS["llama-mqa"]), torch.bfloat16, device, require_kernels)
    prompt = torch.randint(0, 256, (2, PROMPT), device=device)
    out, cached = generate_recording(ours, prompt, 6, temperature=0)
    uncached = prompt
    for _ in range(6):
        uncached = torch.cat((uncached, full_logits(ours, uncached)[:, -1].argmax(-1, keepdim=True)), dim=1)
    exact_logits = full_logits(exact, out)[:, PROMPT - 1 : -1]
    slack = 2 * (cached - exact_logits).abs().max()
    assert assert_same_until_a_near_tie(out[:, PROMPT:], uncached[:, PROMPT:], exact_logits, slack, "uncached") > 0


@pytest.mark.kernels
def test_the_twins_generate_the_same_tokens_for_64_steps(device, require_kernels):
    """Transformer and TorchTransformer (bf16, one state_dict), greedy, 64 steps past a prompt of 7
    in a context of 64: the same tokens up to a genuine bf16 near-tie."""
    ours, lowp, exact = make_models(tiny(n_layer=1, max_seq_len=72), torch.bfloat16, device, require_kernels)
    prompt = torch.randint(0, 256, (1, PROMPT), device=device)
    out, cached = generate_recording(ours, prompt, 64, temperature=0)
    theirs, their_cached = generate_recording(lowp, prompt, 64, temperature=0)
    exact_logits = full_logits(exact, out)[:, PROMPT - 1 : -1]
    error = (cached - exact_logits).abs().max()
    compared = assert_same_until_a_near_tie(out[:, PROMPT:], theirs[:, PROMPT:], exact_logits, 2 * error, "twins")
    assert compared >= 16  # a tie in the first steps would leave the twins' match untested
    assert_close_to_reference(cached, exact_logits, full_logits(lowp, out)[:, PROMPT - 1 : -1], name="cached logits")


@pytest.mark.parametrize("name", list(MODELS))
def test_the_twin_cache_matches_its_full_forward(name):
    """TorchTransformer's SDPA cache in fp32: 40 greedy steps, logits as the full forward's."""
    model = spread(TorchTransformer(tiny(**MODELS[name]))).eval()
    prompt = torch.randint(0, 256, (2, PROMPT))
    out, cached = generate_recording(model, prompt, 40, temperature=0)
    recomputed = full_logits(model, out)[:, PROMPT - 1 : -1]
    torch.testing.assert_close(cached, recomputed, rtol=1e-4, atol=1e-4)
    assert_greedy(out[:, PROMPT:], recomputed, 2e-4, "twin cached tokens")


@pytest.mark.gpu("compiled kernels launched directly after their first call, a cache split three ways")
def test_cached_generate_on_the_gpu(require_kernels):
    config = TransformerConfig(
        vocab_size=512, n_layer=4, n_head=8, n_kv_head=2, d_model=512, max_seq_len=512, position="rope",
        norm="rmsnorm", mlp="swiglu", tie_embeddings=False,
    )  # fmt: skip
    ours, lowp, exact = make_models(config, torch.bfloat16, "cuda", require_kernels)
    check_cached_greedy(ours, lowp, exact, torch.randint(0, 512, (4, 100), device="cuda"), 64)


# ---------------------------------------------------------------------------------------------
# Per-row prompt lengths


def test_rows_of_different_lengths_decode_as_if_alone():
    """Right-padded prompts of 7, 1 and 4 tokens (the padding holds any ids) give each row the
    tokens it gets alone, followed by padding."""
    for name in MODELS:
        model = spread(TorchTransformer(tiny(**MODELS[name]))).eval()
        lengths = [7, 1, 4]
        prompt = torch.randint(0, 256, (3, 7))
        out = model.generate(prompt, 9, temperature=0, prompt_lengths=lengths, pad_token_id=255)
        assert out.shape == (3, 16)
        for row, n in enumerate(lengths):
            alone = model.generate(prompt[row : row + 1, :n], 9, temperature=0)
            assert torch.equal(out[row, : n + 9], alone[0]), name
            assert bool((out[row, n + 9 :] == 255).all()), name


@pytest.mark.kernels
def test_rows_of_different_lengths_through_the_kernels(device, require_kernels):
    """Transformer: each row's tokens are the greedy ones of its own full forward (its positions,
    RoPE angles and cache length are its own)."""
    ours, lowp, exact = make_models(tiny(**MODELS["llama-mqa"]), torch.bfloat16, device, require_kernels)
    prompt = torch.randint(0, 256, (2, PROMPT), device=device)
    lengths = [PROMPT, 3]
    out, cached = generate_recording(ours, prompt, 8, temperature=0, prompt_lengths=lengths)
    for row, n in enumerate(lengths):
        tokens = out[row : row + 1, : n + 8]
        positions = slice(n - 1, n + 7)
        recomputed = full_logits(ours, tokens)[:, positions]
        assert_close_to_reference(cached[row : row + 1], full_logits(exact, tokens)[:, positions],
                                  full_logits(lowp, tokens)[:, positions], name=f"row {row} logits")  # fmt: skip
        slack = 2 * (cached[row : row + 1] - recomputed).abs().amax(-1)
        assert_greedy(tokens[:, n:], recomputed, slack, f"row {row}")


# ---------------------------------------------------------------------------------------------
# Sampling, eos, cropping


def test_top_k_1_is_greedy_and_top_p_keeps_the_nucleus():
    model = spread(TorchTransformer(tiny())).eval()
    prompt = torch.randint(0, 256, (2, 5))
    greedy = model.generate(prompt, 10, temperature=0)
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(model.generate(prompt, 10, temperature=1.3, top_k=1, generator=generator), greedy)
    assert torch.equal(model.generate(prompt, 10, temperature=0.7, top_p=1e-6, generator=generator), greedy)
    sampled = model.generate(prompt, 10, temperature=1.0, generator=generator)
    assert not torch.equal(sampled, greedy)  # with 256 tokens a draw this far from greedy is all but certain


def test_filter_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).log_softmax(-1)  # probabilities 0.64, 0.24, 0.09, 0.03
    kept = filter_top_p(logits, 0.8).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    assert filter_top_p(logits, 0.5).isfinite().tolist() == [[True, False, False, False]]
    assert filter_top_p(logits, 1.0).isfinite().all()


def test_sampling_draws_only_allowed_tokens():
    logits = torch.randn(64, 50)
    generator = torch.Generator().manual_seed(1)
    tokens = sample_next_token(logits, 2.0, 3, None, generator)
    assert bool((logits.topk(3).indices == tokens[:, None]).any(-1).all())
    tokens = sample_next_token(logits, 1.0, None, 0.3, generator)
    nucleus = filter_top_p(logits, 0.3).isfinite()
    assert bool(nucleus.gather(1, tokens[:, None]).all())


def test_eos_finishes_a_row_and_stops_when_all_are_finished():
    model = spread(TorchTransformer(tiny())).eval()
    prompt = torch.randint(0, 256, (2, 5))
    free = model.generate(prompt, 12, temperature=0)
    eos = int(free[0, 5 + 3])  # row 0's fourth new token
    out = model.generate(prompt, 12, temperature=0, eos_token_id=eos, pad_token_id=0)
    ends = []
    for row in range(2):
        emitted = (free[row, 5:] == eos).nonzero()
        end = 5 + int(emitted[0]) + 1 if len(emitted) else free.shape[1]  # up to and with its eos
        assert torch.equal(out[row, :end], free[row, :end])
        assert bool((out[row, end:] == 0).all())  # then padding
        ends.append(end)
    assert out.shape[1] == max(ends)  # the loop stops once every row has finished
    padded_with_eos = model.generate(prompt, 12, temperature=0, eos_token_id=eos)  # pad_token_id defaults to eos
    assert bool((padded_with_eos[0, ends[0] - 1 :] == eos).all())
    alone = model.generate(prompt[:1], 12, temperature=0, eos_token_id=eos)
    assert alone.shape == (1, ends[0]) and int(alone[0, -1]) == eos


@pytest.mark.parametrize("name", list(MODELS))
def test_past_max_seq_len_the_context_is_cropped_every_step(name):
    """40 new tokens in a context of 16, from prompts of 5 and 9 tokens: the tokens of a forward
    over each row's last 16 tokens at every step."""
    model = spread(TorchTransformer(tiny(**MODELS[name], max_seq_len=16))).eval()
    prompt = torch.randint(0, 256, (2, 9))
    out = model.generate(prompt, 40, temperature=0, prompt_lengths=[5, 9])
    for row, n in enumerate([5, 9]):
        tokens = prompt[row : row + 1, :n]
        for _ in range(40):
            logits = full_logits(model, tokens[:, -16:])[:, -1]
            tokens = torch.cat((tokens, logits.argmax(-1, keepdim=True)), dim=1)
        assert torch.equal(out[row, : n + 40], tokens[0]), (name, row)


def test_a_prompt_longer_than_max_seq_len_is_cropped():
    model = spread(TorchTransformer(tiny(max_seq_len=16))).eval()
    prompt = torch.randint(0, 256, (1, 30))
    out = model.generate(prompt, 3, temperature=0)
    expected = model.generate(prompt[:, -16:], 3, temperature=0)
    assert torch.equal(out[:, 30:], expected[:, 16:])


def test_generate_restores_the_mode_and_records_no_graph():
    model = TorchTransformer(tiny())
    assert model.training
    out = model.generate(torch.randint(0, 256, (1, 4)), 3)
    assert model.training and not out.requires_grad
    assert torch.equal(model.generate(out[:, :4], 0), out[:, :4])


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(top_p=0.0), ValueError, r"top_p must be a number in \(0, 1\], got 0.0"),
        (dict(top_p=1.5), ValueError, r"top_p must be a number in \(0, 1\], got 1.5"),
        (dict(top_k=True), ValueError, r"top_k must be >= 1, got True"),
        (dict(eos_token_id=256), ValueError, r"eos_token_id must be in \[0, 256\), got 256"),
        (dict(pad_token_id=-1), ValueError, r"pad_token_id must be in \[0, 256\), got -1"),
        (dict(eos_token_id=2.0), TypeError, r"eos_token_id must be an int, got float"),
        (dict(prompt_lengths=[4]), ValueError, r"prompt_lengths must hold one int per prompt row \(2\)"),
        (dict(prompt_lengths=[4, 5]), ValueError, r"prompt_lengths must lie in \[1, 4\]"),
        (dict(prompt_lengths=[0, 4]), ValueError, r"prompt_lengths must lie in \[1, 4\]"),
        (dict(prompt_lengths=torch.ones(2)), ValueError, r"prompt_lengths must be a 1-D int tensor"),
    ],
)
def test_bad_generate_options_are_named(options, error, message):
    model = TorchTransformer(tiny())
    with pytest.raises(error, match=message):
        model.generate(torch.zeros(2, 4, dtype=torch.long), 3, **options)


def test_max_new_tokens_must_be_an_int():
    with pytest.raises(TypeError, match="max_new_tokens must be an int, got float"):
        TorchTransformer(tiny()).generate(torch.zeros(1, 4, dtype=torch.long), 3.0)


# ---------------------------------------------------------------------------------------------
# The decode step as a CUDA graph


@pytest.mark.gpu("CUDA-graph capture and replay of the decode step")
@pytest.mark.parametrize("model_class", [Transformer, TorchTransformer])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_graphed_decode_gives_the_eager_tokens(model_class, name, require_kernels):
    """Same weights, same prompts (rows of different lengths, eos): the replayed step gives every
    token of the eager loop, also across the prefill that recomputes a full cache (the graph then
    keeps reading the rewritten buffers)."""
    config = tiny(**MODELS[name])
    if model_class is Transformer:
        require_kernels(config)
    torch.manual_seed(0)
    model = spread(model_class(config)).cuda().to(torch.bfloat16).eval()
    prompt = torch.randint(0, 256, (3, 40), device="cuda")
    options = dict(temperature=0, prompt_lengths=[40, 3, 17], pad_token_id=0)
    for steps in (8, 40):  # 40: rows pass max_seq_len = 64, the cache fills and is recomputed
        eager = model.generate(prompt, steps, **options)
        graphed = model.generate(prompt, steps, cuda_graph=True, **options)
        assert torch.equal(graphed, eager), (name, steps)
    eos = int(eager[0, 41])  # a token the first row emits: it finishes there, the others go on
    assert torch.equal(
        model.generate(prompt, 20, eos_token_id=eos, cuda_graph=True, **options),
        model.generate(prompt, 20, eos_token_id=eos, **options),
    )


@pytest.mark.gpu("CUDA-graph capture and replay of the decode step")
@pytest.mark.parametrize("model_class", [Transformer, TorchTransformer])
def test_a_decode_graph_is_reused_while_its_shapes_and_parameters_are(model_class, require_kernels):
    """A second call of the same shapes replays the first call's graph and cache (same tokens as
    eager); other prompts of the same shapes too; a parameter replaced (a new address) or another
    batch size captures anew; release_decode_graph drops it."""
    config = tiny(**MODELS[sorted(MODELS)[0]])
    if model_class is Transformer:
        require_kernels(config)
    torch.manual_seed(0)
    model = spread(model_class(config)).cuda().to(torch.bfloat16).eval()
    options = dict(temperature=0, pad_token_id=0)
    prompts = [torch.randint(0, 256, (2, 20), device="cuda") for _ in range(2)]
    first = model.generate(prompts[0], 12, cuda_graph=True, **options)
    entry = generation._GRAPHS[model]
    for prompt in prompts:  # the first prompt again, then another of the same shape
        graphed = model.generate(prompt, 12, cuda_graph=True, **options)
        assert torch.equal(graphed, model.generate(prompt, 12, **options))
        assert generation._GRAPHS[model] is entry
    assert torch.equal(model.generate(prompts[0], 12, cuda_graph=True, **options), first)
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.flip(0).contiguous())
    graphed = model.generate(prompts[0], 12, cuda_graph=True, **options)
    assert generation._GRAPHS[model] is not entry and torch.equal(graphed, model.generate(prompts[0], 12, **options))
    entry = generation._GRAPHS[model]
    model.generate(prompts[0][:1], 12, cuda_graph=True, **options)
    assert generation._GRAPHS[model] is not entry
    model.release_decode_graph()
    assert model not in generation._GRAPHS


def test_the_graph_key_follows_the_parameters_and_shapes():
    """What a kept decode graph is matched on (CPU: no graph is captured here)."""
    model = TorchTransformer(tiny())
    device = torch.device("cpu")
    key = generation._graph_key(model, 2, 64, torch.int64, device)
    assert generation._graph_key(model, 2, 64, torch.int64, device) == key
    assert generation._graph_key(model, 3, 64, torch.int64, device) != key
    assert generation._graph_key(model, 2, 48, torch.int64, device) != key
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert generation._graph_key(model, 2, 64, torch.int64, device) != key
    with torch.no_grad():
        model.lm_head.weight.mul_(2)  # in place: the same storage, the graph reads the new values
    assert generation._graph_key(model, 2, 64, torch.int64, device) == key
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.clone())
    assert generation._graph_key(model, 2, 64, torch.int64, device) != key
    model.release_decode_graph()  # nothing kept: a no-op


def test_cuda_graph_is_checked_before_any_work():
    model = TorchTransformer(tiny())
    prompt = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="cuda_graph=True replays the decode step as a CUDA graph; idx is on cpu"):
        model.generate(prompt, 2, cuda_graph=True)
    with pytest.raises(TypeError, match="cuda_graph must be a bool, got int"):
        model.generate(prompt, 2, cuda_graph=1)
