"""tritonformer-train's loop: save and resume, AMP with a GradScaler, the learning-rate schedule."""

import argparse
import pathlib

import pytest
import torch

from tritonformer import bench, checkpoint, data, train
from tritonformer.train import (
    Trainer,
    TrainingDiverged,
    TrainSettings,
    cosine_lr,
    parse_args,
    parse_value,
    settings_from_args,
)

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


# --------------------------------------------------------------------------------------------
# The command line: one-line errors, resume, out-dirs, divergence, help
# --------------------------------------------------------------------------------------------

TORCH_RUN = ["--model", "torch", "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--eval-interval", "1",
             "--eval-iters", "1", "--sample-tokens", "0", "--set", "n_layer=1"]  # fmt: skip


def error_line(capsys) -> str:
    """The command's error: its last stderr line, and no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seq-len", "-5"], "argument --seq-len: must be >= 1, got -5"),
        (["--seq-len", "0"], "argument --seq-len: must be >= 1, got 0"),
        (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
        (["--batch-size", "-2"], "argument --batch-size: must be >= 1, got -2"),
        (["--lr=-1e-3"], "argument --lr: must be a finite number >= 0, got -1e-3"),
        (["--lr", "nan"], "argument --lr: must be a finite number >= 0, got nan"),
        (["--min-lr=-1"], "argument --min-lr: must be a finite number >= 0, got -1"),
        (["--weight-decay=-0.1"], "argument --weight-decay: must be a finite number >= 0, got -0.1"),
        (["--checkpoint-interval", "0"], "argument --checkpoint-interval: must be >= 1, got 0"),
        (["--device", "tpu"], "argument --device: unknown device 'tpu'; choose auto, cpu, cuda or cuda:N"),
        (["--device", "cuda:x"], "argument --device: unknown device 'cuda:x'; choose auto, cpu, cuda or cuda:N"),
        (["--set", "dropout"], "--set takes OPTION=VALUE, got 'dropout'"),
    ],
)
def test_bad_flags_are_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        train.main(["--model", "torch", *argv])
    assert exit_.value.code == 2
    assert error_line(capsys) == f"tritonformer-train: error: {message}"


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_refused_in_one_line(device, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_:
        train.main(["--model", "torch", "--device", device])
    assert exit_.value.code == 2
    assert error_line(capsys) == (
        f"tritonformer-train: error: device {device!r} needs a CUDA GPU, and torch sees none here (use cpu or auto)"
    )


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(seq_len=0), "seq_len must be an int >= 1, got 0"),
        (dict(steps=-1), "steps must be an int >= 1, got -1"),
        (dict(checkpoint_interval=0), "checkpoint_interval must be an int >= 1, got 0"),
        (dict(warmup_steps=-1), "warmup_steps must be an int >= 0, got -1"),
        (dict(lr=-1.0), "lr must be a finite number >= 0, got -1.0"),
        (dict(min_lr=float("nan")), "min_lr must be a finite number >= 0, got nan"),
        (dict(weight_decay=-0.1), "weight_decay must be a finite number >= 0, got -0.1"),
        (dict(grad_clip=float("inf")), "grad_clip must be a finite number >= 0, got inf"),
        (dict(device="gpu"), "unknown device 'gpu'; choose auto, cpu, cuda or cuda:N"),
    ],
)
def test_settings_refuse_bad_values(options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TrainSettings(**options)


def bad_data(tmp_path, kind: str) -> str:
    path = tmp_path / {"odd-bin": "tokens.bin", "empty-bin": "tokens.bin"}.get(kind, "text.txt")
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "odd-bin":
        path.write_bytes(b"\x01\x02\x03")
    elif kind == "empty-bin":
        path.write_bytes(b"")
    elif kind == "short":
        path.write_bytes(b"0123456789")
    elif kind == "directory":
        path = tmp_path / "corpus"
        path.mkdir()
    return str(path)


@pytest.mark.parametrize(
    "kind, message",
    [
        ("missing", "no such data file: {path}"),
        ("empty", "data file {path} is empty"),
        ("empty-bin", "data file {path} is empty"),
        ("odd-bin", "data file {path} has 3 bytes: not a whole number of uint16 tokens (nanoGPT .bin)"),
        (
            "short",
            "the bytes of {path}: the train split has 9 tokens, fewer than seq_len + 1 = 17 (use a "
            "smaller --seq-len or more data)",
        ),  # fmt: skip
        ("directory", "{path} is a directory without train.bin and val.bin (nanoGPT's layout)"),
    ],
)
def test_a_bad_data_file_is_one_line_naming_it(kind, message, tmp_path, capsys):
    path = bad_data(tmp_path, kind)
    assert train.main([*TORCH_RUN, "--data", path, "--out-dir", str(tmp_path / "out")]) == 1
    assert error_line(capsys) == "tritonformer-train: error: " + message.format(path=path)


def test_an_unreadable_data_file_is_one_line_naming_it(tmp_path, monkeypatch, capsys):
    path = tmp_path / "text.txt"
    path.write_text("some text\n" * 100)

    def denied(self):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "read_bytes", denied)  # as root a chmod would not stop the read
    assert train.main([*TORCH_RUN, "--data", str(path), "--out-dir", str(tmp_path / "out")]) == 1
    assert error_line(capsys) == f"tritonformer-train: error: cannot read data file {path}: Permission denied"


def test_a_bad_config_value_is_one_line(tmp_path, capsys):
    assert train.main([*TORCH_RUN, "--set", "norm_eps=inf", "--out-dir", str(tmp_path)]) == 1
    assert error_line(capsys) == "tritonformer-train: error: norm_eps must be a finite number > 0, got inf"


@pytest.mark.torch_dynamo
def test_a_damaged_checkpoint_is_refused_on_resume(tmp_path, capsys):
    run = [*TORCH_RUN, "--out-dir", str(tmp_path)]
    assert train.main(run) == 0
    path = tmp_path / "ckpt.pt"
    with open(path, "r+b") as f:  # 64 bytes in the middle, each flipped
        f.seek(path.stat().st_size // 2)
        flipped = bytes(b ^ 0xFF for b in f.read(64))
        f.seek(path.stat().st_size // 2)
        f.write(flipped)
    capsys.readouterr()
    assert train.main([*run, "--resume", "--steps", "3"]) == 1
    assert error_line(capsys) == (
        f"tritonformer-train: error: {path} is damaged: its contents do not match their sha256 checksum "
        "(truncated or overwritten)"
    )


@pytest.mark.torch_dynamo
def test_resume_says_what_it_resumes_and_refuses_another_run(tmp_path):
    Trainer(settings(tmp_path, steps=4), log=quiet).run()
    lines = []
    resumed = Trainer(settings(tmp_path, steps=6), resume=True, log=lines.append)
    assert lines == [f"resuming {tmp_path / 'ckpt.pt'}: step 4 of 6, model 'torch', preset 'tiny'"]
    assert resumed.step == 4
    path = tmp_path / "ckpt.pt"
    refusals = [
        (dict(model="triton"), f"{path} holds a run of model 'torch', not 'triton': pass --model torch to resume it"),
        (dict(preset="tiny-llama"), f"{path} holds a run of preset 'tiny', not 'tiny-llama': pass --preset tiny"),
        (dict(overrides=dict(SMALL, dropout=0.1)), f"{path} holds a model of another config: dropout=0.0 (not 0.1); "),
        (dict(overrides=dict(SMALL, d_model=64)), "another config: d_model=32 (not 64)"),
    ]
    for options, message in refusals:
        with pytest.raises(ValueError) as error:
            Trainer(settings(tmp_path, **options), resume=True, log=quiet)
        assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.torch_dynamo
def test_resuming_a_finished_run_says_it_is_complete(tmp_path, capsys):
    run = [*TORCH_RUN, "--out-dir", str(tmp_path)]
    assert train.main(run) == 0
    path = tmp_path / "ckpt.pt"
    before = path.read_bytes()
    capsys.readouterr()
    assert train.main([*run, "--resume"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        f"resuming {path}: step 2 of 2, model 'torch', preset 'tiny'",
        f"{path}: the run is already complete (step 2 of 2); pass a larger --steps to train further",
    ]
    assert path.read_bytes() == before


def test_each_model_kind_has_its_own_default_out_dir(tmp_path, monkeypatch):
    assert TrainSettings(model="torch").out_dir == str(pathlib.Path("tritonformer-run", "torch"))
    assert TrainSettings(model="triton").out_dir == str(pathlib.Path("tritonformer-run", "triton"))
    assert TrainSettings(model="torch", out_dir="mine").out_dir == "mine"
    assert (
        settings_from_args(parse_args(["--model", "torch"])).out_dir
        != settings_from_args(parse_args(["--model", "triton", "--device", "cuda"])).out_dir
    )


def test_resume_in_the_default_out_dir_points_at_the_former_shared_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tritonformer-run").mkdir()
    (tmp_path / "tritonformer-run" / "ckpt.pt").write_bytes(b"")
    assert train.main([*TORCH_RUN, "--resume"]) == 1
    expected = pathlib.Path("tritonformer-run", "torch", "ckpt.pt")
    assert error_line(capsys) == (
        f"tritonformer-train: error: no checkpoint at {expected}; tritonformer-run/ckpt.pt (the default out-dir "
        "before each model had its own) holds one: pass --out-dir tritonformer-run"
    )


@pytest.mark.torch_dynamo
def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    trainer = Trainer(settings(tmp_path, steps=8, eval_interval=2), log=quiet)

    def poison(module, args, out):  # the training forwards from step 3 on; evaluation stays finite
        return out * float("nan") if module.training and trainer.step >= 2 else out

    trainer.model.lm_head.register_forward_hook(poison)
    with pytest.raises(TrainingDiverged) as error:
        trainer.run()
    path = tmp_path / "ckpt.pt"
    assert (
        str(error.value) == f"the training loss is nan at step 3: training stopped; {path} (step 2) is left as it was"
    )
    state = checkpoint.load_checkpoint(path)
    assert state["step"] == 2 and all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.torch_dynamo
def test_weights_with_nan_are_never_saved(tmp_path):
    trainer = Trainer(settings(tmp_path), log=quiet)
    trainer.train_step()
    path = trainer.save()
    before = path.read_bytes()
    weight = trainer.model.blocks[0].mlp.fc1.weight
    weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))  # fp32: no scaler to skip the step
    trainer.train_step()
    assert not torch.isfinite(weight).all()
    with pytest.raises(TrainingDiverged, match=f"blocks.0.mlp.fc1.weight holds inf or nan after step 2, so {path}"):
        trainer.save()
    assert path.read_bytes() == before


@pytest.mark.torch_dynamo
def test_a_diverging_command_exits_non_zero_in_one_line(tmp_path, capsys):
    """A learning rate of 1e30: the first step's update sends the logits to inf, the second step's loss is nan."""
    code = train.main([*TORCH_RUN, "--lr", "1e30", "--warmup-steps", "0", "--steps", "5", "--out-dir", str(tmp_path)])
    assert code == 1
    line = error_line(capsys)
    assert line.startswith("tritonformer-train: error: the training loss is nan at step ")
    assert line.endswith(
        f"training stopped; {tmp_path / 'ckpt.pt'} (step 1) is left as it was (a lower --lr or --grad-clip, or "
        "--dtype bf16 or fp32, may help)"
    )
    state = checkpoint.load_checkpoint(tmp_path / "ckpt.pt")
    assert state["step"] == 1 and all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.parametrize("module", [train, bench], ids=["train", "bench"])
def test_help_shows_each_default_once_and_every_option_has_help(module):
    parser = module.build_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        assert action.help, f"{action.option_strings} has no help text"
        text = formatter._expand_help(action)
        assert "(default: None)" not in text and text.count("default") <= 1, (action.option_strings, text)
        if action.default not in (None, False, [], argparse.SUPPRESS):
            assert "default" in text, (action.option_strings, text)
    if module is train:
        steps = next(action for action in parser._actions if "--steps" in action.option_strings)
        assert formatter._expand_help(steps) == "optimizer steps to train to (default 300; 10 in the interpreter)"


@pytest.mark.torch_dynamo
def test_an_fp16_overflow_is_skipped_and_the_run_goes_on(tmp_path):
    """The GradScaler's case: gradients overflow (the loss is finite), the step is skipped, the run completes."""
    trainer = Trainer(settings(tmp_path, dtype="fp16"), log=quiet)
    weight = trainer.model.blocks[0].mlp.fc1.weight
    overflowed = []

    def overflow_once(grad):
        if trainer.step == 3 and not overflowed:
            overflowed.append(trainer.scaler.get_scale())
            return torch.full_like(grad, float("inf"))
        return grad

    weight.register_hook(overflow_once)
    summary = trainer.run()
    assert overflowed and trainer.step == 8 and not summary["already_complete"]
    assert trainer.scaler.get_scale() < overflowed[0]  # the scaler backed off at the skipped step
    state = checkpoint.load_checkpoint(tmp_path / "ckpt.pt")
    assert state["step"] == 8 and all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.torch_dynamo
def test_a_new_run_over_a_checkpoint_says_it_will_replace_it(tmp_path):
    Trainer(settings(tmp_path, steps=2), log=quiet).run()
    lines = []
    Trainer(settings(tmp_path), log=lines.append)
    assert lines == [
        f"note: {tmp_path / 'ckpt.pt'} exists; this new run replaces it at its first checkpoint (--resume continues it)"
    ]
