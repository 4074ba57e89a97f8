"""Transformer (the kernel packages) as a user meets it: AMP, dropout, activation checkpointing,
generate, torch.compile, Hugging Face GPT-2 weights, the training loop. Interpreter-sized."""

import copy

import pytest
import torch
from tritonformer_testkit import LOW_PRECISION_DTYPES, assert_close_to_reference, dtype_params, interpreting

import fused_gemm
import fused_norm_xent
from tritonformer import Transformer, TransformerConfig
from tritonformer.train import Trainer, TrainSettings

pytestmark = pytest.mark.kernels


def tiny(**options) -> TransformerConfig:
    # head_dim 16: the smallest head dim the attention kernel takes.
    base = dict(vocab_size=256, n_layer=2, n_head=2, d_model=32, max_seq_len=32)
    return TransformerConfig(**{**base, **options})


class LogitsOf(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, idx):
        return self.lm(idx)[0]


@pytest.mark.parametrize("dtype", dtype_params(LOW_PRECISION_DTYPES))
@pytest.mark.parametrize(
    "options",
    [pytest.param(dict(), id="gpt2"), pytest.param(dict(position="rope", norm="rmsnorm", mlp="swiglu"), id="llama")],
)
def test_autocast_logits_and_gradients(options, dtype, twins, device, check_twins):
    """fp32 weights under torch.autocast: as close to float64 as PyTorch under autocast."""
    if dtype == torch.bfloat16 and interpreting():
        pytest.skip(
            "Triton's interpreter truncates fp32->bf16 casts where the GPU rounds: through a chain of bf16 kernels "
            "that doubles PyTorch's error in the fp32 gradients; bf16 autocast runs compiled on the GPU, fp16 here"
        )
    ours, reference = twins(tiny(**options))
    idx = torch.randint(0, 256, (2, 16), device=device)
    check_twins(LogitsOf(ours), LogitsOf(reference), [idx], dtype, autocast=True)


@pytest.mark.parametrize("fused_loss", [False, True], ids=["logits", "fused_loss"])
def test_autocast_loss_is_fp32(fused_loss, twins, device):
    ours, _ = twins(tiny(fused_loss=fused_loss))
    idx = torch.randint(0, 256, (2, 16), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        _, loss = ours(idx, idx)
        kernel_loss = fused_norm_xent.cross_entropy(torch.randn(2, 8, device=device).bfloat16(), idx[0, :2] % 8)
    if kernel_loss.dtype != torch.float32:
        pytest.xfail(
            f"fused_norm_xent {fused_norm_xent.__version__} returns the loss in {kernel_loss.dtype} under autocast "
            "(F.cross_entropy returns fp32 there)"
        )
    assert loss.dtype == torch.float32


LLAMA = dict(position="rope", norm="rmsnorm", mlp="swiglu")


def gradients_at(model, points, idx, dy, dtype=None):
    """{point: the gradient reaching it} for one backward of dy from model(idx)'s logits, under
    autocast to dtype (None: none). A point is "module:out" (the module's output) or "module:in"
    (its first input)."""
    modules, store, handles = dict(model.named_modules()), {}, []
    for point in points:
        name, where = point.split(":")

        def keep(tensor, point=point):
            tensor.register_hook(lambda grad: store.__setitem__(point, grad.detach().clone()))

        if where == "out":
            handles.append(modules[name].register_forward_hook(lambda module, args, out, keep=keep: keep(out)))
        else:
            handles.append(modules[name].register_forward_pre_hook(lambda module, args, keep=keep: keep(args[0])))
    model.zero_grad(set_to_none=True)
    with torch.autocast(idx.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        logits = model(idx)[0]
    logits.backward(dy.to(logits.dtype))
    for handle in handles:
        handle.remove()
    return store


def test_bias_grads_are_the_rounded_column_sums_of_their_upstream_gradients(twins, device):
    """fused_gemm's d(bias) inside the llama model, bf16 autocast: the fp64 sum over tokens of the
    gradient the layer received, rounded once to bf16 (as PyTorch's), whatever that gradient's own
    error. (The bias gradient's error against float64 is then the upstream gradient's.)"""
    ours, _ = twins(tiny(**LLAMA))
    linears = {name: m for name, m in ours.named_modules() if isinstance(m, fused_gemm.Linear) and m.bias is not None}
    linears = {name: m for name, m in linears.items() if m.activation is None}  # d(bias) = the sum of dY itself
    assert len(linears) == 4  # qkv and proj of each block
    idx = torch.randint(0, 256, (2, 16), device=device)
    dy = torch.randn(2, 16, 256, device=device, dtype=torch.float64)
    upstream = gradients_at(ours, [f"{name}:out" for name in linears], idx, dy, torch.bfloat16)
    for name, linear in linears.items():
        dc = upstream[f"{name}:out"]
        assert dc.dtype == torch.bfloat16
        column_sum = dc.double().flatten(0, -2).sum(0)  # (N,)
        half_ulp = torch.finfo(torch.bfloat16).eps / 2 * torch.exp2(torch.floor(torch.log2(column_sum.abs())))
        summation = 2.0**-20 * dc.double().abs().flatten(0, -2).sum(0)  # fp32 partial sums' slack
        error = (linear.bias.grad.double() - column_sum).abs()
        worst = int((error - half_ulp - summation).argmax())
        assert bool((error <= half_ulp + summation).all()), (
            f"{name}.bias grad: {linear.bias.grad[worst].item():.6g} at {worst}; the sum of its upstream gradient is "
            f"{column_sum[worst].item():.6g} (half a bf16 ulp: {half_ulp[worst].item():.3g})"
        )


@pytest.mark.parametrize("dtype", dtype_params(LOW_PRECISION_DTYPES))
def test_backward_chain_point_by_point(dtype, twins, device):
    """The gradient reaching each point of the llama model, in the order backward meets them, as
    close to float64 as PyTorch's (the project's rule at every point): the first point that fails
    names the component whose backward adds more error than PyTorch's."""
    if dtype == torch.bfloat16 and interpreting():
        pytest.skip(
            "Triton's interpreter truncates fp32->bf16 casts where the GPU rounds: the chain doubles PyTorch's error; "
            "bf16 autocast runs compiled on the GPU, fp16 here"
        )
    ours, reference = twins(tiny(**LLAMA))
    exact = copy.deepcopy(reference).double()
    points = ["lm_head:in"]
    for i in reversed(range(ours.config.n_layer)):
        points += [f"blocks.{i}.mlp:out", f"blocks.{i}.mlp:in", f"blocks.{i}.attn.proj:out"]
        points += [f"blocks.{i}.attn.proj:in", f"blocks.{i}.attn.qkv:out", f"blocks.{i}.attn.qkv:in"]
    idx = torch.randint(0, 256, (2, 16), device=device)
    dy = torch.randn(2, 16, 256, device=device, dtype=torch.float64)
    grads64 = gradients_at(exact, points, idx, dy)
    grads_lowp = gradients_at(reference, points, idx, dy, dtype)
    grads = gradients_at(ours, points, idx, dy, dtype)
    for point in points:
        assert_close_to_reference(grads[point], grads64[point], grads_lowp[point], name=f"gradient at {point}")


@pytest.mark.torch_dynamo
def test_dropout_is_seeded_and_replayed_by_activation_checkpointing(twins, device):
    """Residual and attention dropout: the same seed gives the same loss and gradients, with the
    block recomputed (its norm and attention kernels draw their keys again from the restored RNG)."""
    plain, twin = twins(tiny(n_layer=1, dropout=0.2, attention_dropout=0.3))  # one block, recomputed
    checkpointed = Transformer(plain.config.replace(activation_checkpointing=True)).to(device)
    checkpointed.load_state_dict(plain.state_dict())
    idx, targets = torch.randint(0, 256, (2, 16), device=device), torch.randint(0, 256, (2, 16), device=device)

    def loss_and_grads(model, seed):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        with torch.autocast(device, dtype=torch.bfloat16):
            _, loss = model(idx, targets)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss, grads = loss_and_grads(plain, 1)
    again, grads_again = loss_and_grads(checkpointed, 1)  # recomputed blocks draw the same masks
    torch.testing.assert_close(again, loss, rtol=0, atol=0)
    for g, h in zip(grads, grads_again):
        torch.testing.assert_close(h, g)
    _, other = loss_and_grads(plain, 2)
    assert not torch.equal(other[0], grads[0])  # another seed, other masks (the bf16 loss may round alike)
    plain.eval()
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        torch.testing.assert_close(plain(idx)[0], plain(idx)[0], rtol=0, atol=0)  # no dropout in eval
    # The twin drops attention weights through SDPA's dropout_p, in training only.
    with torch.no_grad():
        assert not torch.equal(twin.train()(idx)[0], twin.eval()(idx)[0])
        torch.testing.assert_close(twin(idx)[0], twin(idx)[0], rtol=0, atol=0)


def test_generate(twins, device):
    model, _ = twins(tiny(position="rope", norm="rmsnorm", mlp="swiglu"))
    prompt = torch.randint(0, 256, (2, 5), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        greedy = model.generate(prompt, 2, temperature=0)
        model.eval()
        with torch.no_grad():
            first = model(prompt)[0][:, -1].argmax(-1)
        g1, g2 = torch.Generator(device).manual_seed(0), torch.Generator(device).manual_seed(0)
        s1 = model.generate(prompt, 2, top_k=10, generator=g1)
        s2 = model.generate(prompt, 2, top_k=10, generator=g2)
    assert greedy.shape == (2, 7) and torch.equal(greedy[:, :5], prompt) and torch.equal(greedy[:, 5], first)
    assert torch.equal(s1, s2) and int(s1.max()) < 256


@pytest.mark.torch_compile
def test_torch_compile_fullgraph_matches_eager(twins, device):
    """torch.compile(fullgraph=True) traces the whole model through the kernels' custom ops."""
    if not hasattr(torch.library, "custom_op"):
        pytest.skip(f"torch {torch.__version__} has no torch.library.custom_op: the kernels are plain Functions")
    model, _ = twins(tiny(position="rope", norm="rmsnorm", mlp="swiglu", fused_loss=True))
    idx, targets = torch.randint(0, 256, (2, 16), device=device), torch.randint(0, 256, (2, 16), device=device)
    backend = "eager" if device == "cpu" else "inductor"  # the CPU interpreter runs eager graphs
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    results = []
    for fn in (model, compiled):
        model.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16):
            _, loss = fn(idx, targets)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0])
    for g_eager, g_compiled in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(g_compiled, g_eager)


@pytest.mark.torch_dynamo
def test_hugging_face_gpt2_weights(device):
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not importable here: the GPT-2 interop test needs it"
    )
    from tritonformer.hf import from_gpt2

    hf_config = transformers.GPT2Config(
        vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    ours = from_gpt2(hf, Transformer).to(device).bfloat16().eval()
    idx = torch.randint(0, 256, (2, 16))
    from tritonformer_testkit import assert_close_to_reference

    with torch.no_grad():
        exact = hf.double()(idx).logits
        lowp = hf.bfloat16()(idx).logits
        logits = ours(idx.to(device))[0]
    assert_close_to_reference(logits, exact, lowp, name="logits")


@pytest.mark.torch_dynamo
def test_training_loop_resumes_bit_exactly(tmp_path):
    settings = TrainSettings(
        model="triton", preset="tiny", steps=3, batch_size=2, seq_len=16, eval_interval=100, sample_tokens=0,
        out_dir=str(tmp_path), overrides=dict(n_layer=1, n_head=2, d_model=32, d_ff=64, dropout=0.1),
    )  # fmt: skip
    first = Trainer(settings, log=lambda *_: None)
    first.train_step()
    first.save()
    expected = first.train_step()
    resumed = Trainer(settings, resume=True, log=lambda *_: None)
    assert resumed.step == 1 and resumed.train_step() == expected


@pytest.mark.torch_dynamo
def test_fp16_grad_scaler_skips_an_overflowing_step_and_goes_on(tmp_path):
    settings = TrainSettings(
        model="triton", preset="tiny", dtype="fp16", steps=4, batch_size=2, seq_len=16, eval_interval=100,
        sample_tokens=0, out_dir=str(tmp_path), overrides=dict(n_layer=1, n_head=2, d_model=32, d_ff=64),
    )  # fmt: skip
    trainer = Trainer(settings, log=lambda *_: None)
    assert trainer.scaler.is_enabled()
    trainer.train_step()
    scale = trainer.scaler.get_scale()
    weight = trainer.model.blocks[0].attn.qkv.weight
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    hook = weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))  # this step overflows
    trainer.train_step()
    hook.remove()
    assert trainer.scaler.get_scale() == scale / 2  # the scaler backed off
    for name, p in trainer.model.named_parameters():  # and the step was skipped
        assert torch.equal(p, before[name]), name
    losses = [trainer.train_step() for _ in range(2)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(weight, before["blocks.0.attn.qkv.weight"])  # training went on
