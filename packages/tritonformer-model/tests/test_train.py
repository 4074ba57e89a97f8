"""tritonformer-train's loop: save and resume, AMP with a GradScaler, the learning-rate schedule."""

import pytest
import torch

from tritonformer import data
from tritonformer.train import Trainer, TrainSettings, cosine_lr, parse_args, parse_value, settings_from_args

SMALL = dict(n_layer=2, n_head=2, d_model=32, d_ff=64, max_seq_len=32)


def settings(tmp_path, **options) -> TrainSettings:
    base = dict(
        model="torch", steps=8, batch_size=4, seq_len=16, eval_interval=4, eval_iters=2, warmup_steps=2,
        sample_tokens=0, out_dir=str(tmp_path), overrides=dict(SMALL),
    )  # fmt: skip
    return TrainSettings(**{**base, **options})


def quiet(*_):
    pass


@pytest.mark.torch_dynamo
def test_resume_gives_the_same_next_loss(tmp_path):
    s = settings(tmp_path, overrides=dict(SMALL, dropout=0.1))  # dropout: the RNG state matters too
    first = Trainer(s, log=quiet)
    for _ in range(3):
        first.train_step()
    first.save()
    expected = [first.train_step() for _ in range(2)]
    resumed = Trainer(s, resume=True, log=quiet)
    assert resumed.step == 3
    assert [resumed.train_step() for _ in range(2)] == expected  # bit for bit


@pytest.mark.torch_dynamo
def test_run_saves_evaluates_and_samples(tmp_path):
    trainer = Trainer(settings(tmp_path, sample_tokens=20), log=quiet)
    summary = trainer.run()
    assert trainer.step == 8 and (tmp_path / "ckpt.pt").is_file()
    assert [step for step, _ in summary["history"]] == [0, 4, 8]
    assert isinstance(summary["sample"], str) and summary["sample"]
    # Resuming a finished run with more steps continues from step 8.
    more = Trainer(settings(tmp_path, steps=10), resume=True, log=quiet)
    assert more.step == 8
    more.run()
    assert more.step == 10


@pytest.mark.torch_dynamo
def test_fp16_grad_scaler_skips_an_overflowing_step_and_goes_on(tmp_path):
    trainer = Trainer(settings(tmp_path, dtype="fp16", grad_clip=1.0), log=quiet)
    assert trainer.scaler.is_enabled()
    for _ in range(2):
        trainer.train_step()
    scale = trainer.scaler.get_scale()
    weight = trainer.model.blocks[0].mlp.fc1.weight
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    hook = weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))  # one overflowing step
    trainer.train_step()
    hook.remove()
    assert trainer.scaler.get_scale() == scale / 2  # the scaler backed off
    for name, p in trainer.model.named_parameters():  # and the optimizer step was skipped
        assert torch.equal(p, before[name]), name
    losses = [trainer.train_step() for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(weight, before["blocks.0.mlp.fc1.weight"])  # training went on


@pytest.mark.torch_dynamo
def test_bf16_autocast_trains(tmp_path):
    trainer = Trainer(settings(tmp_path, dtype="bf16"), log=quiet)
    assert not trainer.scaler.is_enabled()
    losses = [trainer.train_step() for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))


def test_cosine_schedule():
    s = TrainSettings(steps=100, warmup_steps=10, lr=1e-3)
    assert cosine_lr(0, s) == pytest.approx(1e-4)
    assert cosine_lr(9, s) == pytest.approx(1e-3)
    assert cosine_lr(100, s) == pytest.approx(1e-4)
    assert cosine_lr(55, s) == pytest.approx(5.5e-4)


def test_data_sources(tmp_path):
    default = data.load_data()
    assert default.vocab_size == 256 and len(default.train) > 100_000 and "standard library" in default.description
    text = tmp_path / "tiny.txt"
    text.write_text("héllo world\n" * 50)
    from_text = data.load_data(str(text))
    assert from_text.decode(list(from_text.train[:6])) == "héllo"
    tokens = torch.randint(0, 50000, (5000,), dtype=torch.int32).numpy().astype("uint16")
    tokens.tofile(tmp_path / "train.bin")
    tokens[:600].tofile(tmp_path / "val.bin")
    folder = data.load_data(str(tmp_path))
    assert len(folder.train) == 5000 and len(folder.val) == 600 and folder.vocab_size == int(tokens.max()) + 1
    single = data.load_data(str(tmp_path / "train.bin"))
    assert len(single.train) + len(single.val) == 5000
    x, y = data.get_batch(single.train, 3, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(FileNotFoundError, match="no such data file"):
        data.load_data(str(tmp_path / "missing.txt"))


@pytest.mark.torch_dynamo
def test_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="unknown model='jax'"):
        TrainSettings(model="jax")
    with pytest.raises(ValueError, match="seq_len=64 exceeds the model's max_seq_len=32"):
        Trainer(settings(tmp_path, seq_len=64), log=quiet)
    with pytest.raises(ValueError, match="unknown TransformerConfig option"):
        Trainer(settings(tmp_path, overrides={"n_heads": 2}), log=quiet)


def test_command_line_parsing():
    args = parse_args(["--preset", "tiny-llama", "--set", "dropout=0.1", "fused_loss=true", "--steps", "5"])
    s = settings_from_args(args)
    assert s.preset == "tiny-llama" and s.steps == 5 and s.overrides == {"dropout": 0.1, "fused_loss": True}
    assert [parse_value(v) for v in ("3", "0.5", "False", "none", "rope")] == [3, 0.5, False, None, "rope"]
