"""GraphedModel: the CUDA-graph training step.

On the CPU, its logic (what it captures and under which autocast state, when it falls back to
the eager model, what it refuses) with torch.cuda.make_graphed_callables replaced by a stand-in
that runs the module eagerly; on a GPU, real graphs against eager steps.
"""

import pytest
import torch

from tritonformer import TorchTransformer, TransformerConfig, cuda_graph
from tritonformer.cuda_graph import GraphedModel, check_graphable
from tritonformer.train import Trainer, TrainSettings

SMALL = dict(vocab_size=256, n_layer=2, n_head=2, d_model=32, d_ff=64, max_seq_len=32)


class FakeCapture:
    """Stands in for make_graphed_callables: records how it was called, returns the module (eager)."""

    def __init__(self):
        self.calls = []

    def __call__(self, module, sample_args, num_warmup_iters, allow_unused_input):
        self.calls.append(
            dict(
                sample_args=sample_args,
                warmup=num_warmup_iters,
                allow_unused=allow_unused_input,
                autocast=torch.is_autocast_enabled("cpu"),
                autocast_dtype=torch.get_autocast_dtype("cpu"),
                cache=torch.is_autocast_cache_enabled(),
            )
        )
        return module


@pytest.fixture
def fake_capture(monkeypatch):
    fake = FakeCapture()
    monkeypatch.setattr(cuda_graph, "make_graphed_callables", fake)
    monkeypatch.setattr(GraphedModel, "_check_device", lambda self, idx: None)  # the CPU stands in for CUDA
    return fake


def loss_and_grads(forward, model, idx, targets):
    model.zero_grad(set_to_none=True)
    _, loss = forward(idx, targets)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize(
    "fused_loss",
    # the twin's chunked loss is checkpointed
    [pytest.param(False, id="logits"), pytest.param(True, id="fused_loss", marks=pytest.mark.torch_dynamo)],
)
def test_captures_the_body_once_and_computes_the_models_loss(fake_capture, fused_loss):
    torch.manual_seed(0)
    model = TorchTransformer(TransformerConfig(**SMALL, fused_loss=fused_loss, tie_embeddings=False))
    graphed = GraphedModel(model, warmup=2)
    for _ in range(2):  # a new batch each step, through the one capture
        idx, targets = torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16))
        loss, grads = loss_and_grads(graphed, model, idx, targets)
        expected, expected_grads = loss_and_grads(model, model, idx, targets)
        torch.testing.assert_close(loss, expected, rtol=0, atol=0)
        assert grads.keys() == expected_grads.keys()
        for name in grads:
            torch.testing.assert_close(grads[name], expected_grads[name], rtol=0, atol=0, msg=name)
    assert len(fake_capture.calls) == 1 and graphed.captured and graphed.shape == (2, 16)
    call = fake_capture.calls[0]
    (static_idx,) = call["sample_args"]
    assert static_idx.shape == (2, 16) and static_idx.dtype == torch.int64
    assert call["warmup"] == 2 and call["allow_unused"]  # the untied head's weight is not in the body
    assert not call["autocast"]


def test_captures_under_the_callers_autocast_without_its_cache(fake_capture):
    model = TorchTransformer(TransformerConfig(**SMALL))
    graphed = GraphedModel(model)
    idx = torch.randint(0, 256, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the CPU stands in for CUDA here
        assert torch.is_autocast_cache_enabled()
        loss, _ = loss_and_grads(graphed, model, idx, idx)
        expected, _ = loss_and_grads(model, model, idx, idx)
        assert torch.is_autocast_cache_enabled()  # restored after the capture
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    (call,) = fake_capture.calls
    assert call["autocast"] and call["autocast_dtype"] == torch.bfloat16 and not call["cache"]
    assert graphed.amp == torch.bfloat16


def test_eval_and_no_grad_run_the_eager_model(fake_capture):
    model = TorchTransformer(TransformerConfig(**SMALL))
    graphed = GraphedModel(model)
    idx = torch.randint(0, 256, (1, 8))
    model.eval()
    logits, loss = graphed(idx)
    assert logits.shape == (1, 8, 256) and loss is None
    model.train()
    with torch.no_grad():
        torch.testing.assert_close(graphed(idx, idx)[1], model(idx, idx)[1])
    assert not fake_capture.calls and not graphed.captured


def test_refuses_another_shape_accumulated_grads_and_another_autocast(fake_capture):
    model = TorchTransformer(TransformerConfig(**SMALL))
    graphed = GraphedModel(model)
    idx = torch.randint(0, 256, (2, 16))
    graphed(idx, idx)[1].backward()  # .grad now set: the next step must start from zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match=r"embed\.weight\.grad is set: .*zero_grad\(set_to_none=True\)"):
        graphed(idx, idx)
    model.zero_grad(set_to_none=True)
    with pytest.raises(ValueError, match=r"captured for idx of shape \(2, 16\); got \(2, 8\)"):
        graphed(idx[:, :8], idx[:, :8])
    with torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(ValueError, match="captured under autocast dtype None; this call runs under torch.float16"):
            graphed(idx, idx)
    with pytest.raises(TypeError, match="idx must be an int64"):
        graphed(idx.float(), idx)


def test_bad_models_and_settings():
    with pytest.raises(ValueError, match=r"CUDA graphs need dropout=0 and attention_dropout=0 \(got 0.1, 0.0\)"):
        GraphedModel(TorchTransformer(TransformerConfig(**SMALL, dropout=0.1)))
    with pytest.raises(TypeError, match="must be a Transformer or TorchTransformer, got Linear"):
        check_graphable(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        GraphedModel(TorchTransformer(TransformerConfig(**SMALL)), warmup=0)
    if not torch.cuda.is_available():
        graphed = GraphedModel(TorchTransformer(TransformerConfig(**SMALL)))
        with pytest.raises(ValueError, match="CUDA graphs need a CUDA device; idx is on cpu"):
            graphed(torch.zeros(1, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="choose cuda_graph or compile, not both"):
        TrainSettings(cuda_graph=True, compile=True)


@pytest.mark.torch_dynamo
def test_trainer_refuses_cuda_graph_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the refusal is for CPU runs")
    settings = TrainSettings(model="torch", cuda_graph=True, device="cpu", out_dir=str(tmp_path), overrides=SMALL)
    with pytest.raises(ValueError, match="cuda_graph needs a CUDA device; this run is on cpu"):
        Trainer(settings, log=lambda *_: None)


# --------------------------------------------------------------------------------------------
# On a GPU: real graphs
# --------------------------------------------------------------------------------------------


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected.double()).norm() / expected.double().norm().clamp_min(1e-30))


@pytest.mark.gpu(reason="CUDA graphs are captured and replayed on a CUDA GPU")
@pytest.mark.torch_dynamo  # the trainer's AdamW step imports torch._dynamo
@pytest.mark.parametrize("model", ["triton", "torch"])
def test_graphed_steps_match_eager_steps(model, tmp_path, require_kernels):
    """Three optimizer steps on new batches: the same losses, gradients and weights as eager steps.

    The kernels and their autotuned configs are the same in both runs; only atomics' order may
    differ (the attention backward's dq), so gradients and weights may differ by 1e-3 relative and
    the later losses by one ulp of their dtype: a stale input
    buffer, a gradient lost or counted twice would be off by far more."""
    common = dict(
        model=model, preset="tiny-llama", steps=3, batch_size=4, seq_len=64, eval_interval=100, sample_tokens=0,
        dtype="bf16", device="cuda", grad_clip=0.0,
    )  # fmt: skip
    require_kernels(TransformerConfig.preset("tiny-llama"))
    runs = []
    for graph in (False, True):
        trainer = Trainer(TrainSettings(**common, cuda_graph=graph, out_dir=str(tmp_path / str(graph))), log=print)
        losses, grads = [], []
        for _ in range(3):
            x, y = trainer.batch("train", trainer.batches)
            with trainer.autocast():
                _, loss = trainer.forward(x, y)
            loss.backward()
            losses.append(loss.detach())
            grads.append({n: p.grad.clone() for n, p in trainer.model.named_parameters()})
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
        assert isinstance(trainer.forward, GraphedModel) == graph and (not graph or trainer.forward.captured)
        runs.append((losses, grads, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}))
    (eager_losses, eager_grads, eager_weights), (graph_losses, graph_grads, graph_weights) = runs
    for step in range(3):
        assert relative_error(graph_losses[step], eager_losses[step]) <= torch.finfo(eager_losses[0].dtype).eps, step
        for name, g in eager_grads[step].items():
            assert relative_error(graph_grads[step][name], g) <= 1e-3, (step, name)
    for name, w in eager_weights.items():
        assert relative_error(graph_weights[name], w) <= 1e-3, name


@pytest.mark.gpu(reason="CUDA graphs are captured and replayed on a CUDA GPU")
@pytest.mark.torch_dynamo  # the trainer's AdamW step imports torch._dynamo
def test_train_command_with_cuda_graph(tmp_path, require_kernels):
    require_kernels(TransformerConfig.preset("tiny"))
    settings = TrainSettings(
        preset="tiny", steps=30, batch_size=8, seq_len=64, eval_interval=30, eval_iters=2, sample_tokens=16,
        warmup_steps=5, cuda_graph=True, device="cuda", out_dir=str(tmp_path),
    )  # fmt: skip
    summary = Trainer(settings, log=print).run()
    (_, first), (_, last) = summary["history"][0], summary["history"][-1]
    assert last["val"] < first["val"] - 0.5  # from ln(256) = 5.5: a falling loss through the replays
