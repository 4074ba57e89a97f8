"""tritonformer-train: train the GPT on the default corpus, a text file or nanoGPT .bin tokens.

    tritonformer-train                                  # the tiny preset on the standard library's source
    tritonformer-train --preset llama-410M --data data/openwebtext --steps 5000 --batch-size 8
    tritonformer-train --resume                         # continue the run in --out-dir

Checkpoints go to tritonformer-run/triton or tritonformer-run/torch (one directory per model kind)
unless --out-dir says otherwise.

On a machine without a CUDA GPU the Triton kernels run in Triton's CPU interpreter
(TRITON_INTERPRET=1, set by re-executing this command) on the `tiny` preset. Progress bar,
periodic eval loss, checkpoints (save and resume), a text sample at the end; AMP with bf16
autocast, or fp16 autocast with a GradScaler.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import sys
import time
from typing import Any, Dict, Optional

import torch

from . import checkpoint, data
from ._base import CausalLM
from ._compat import grad_scaler
from .config import PRESETS, TransformerConfig
from .progress import ProgressBar

MODELS = ("triton", "torch")
# The Triton model in Triton's CPU interpreter (no GPU): a training step of the tiny model takes
# ~10 s of CPU there (2 x 32 tokens; fused_gemm's interpreted matmuls are ~75% of it), so a short
# run of small batches at a higher learning rate, that still shows the loss falling from
# ln(256) = 5.5 to ~3.3 (measured with the twin: 10 steps of 2 x 32 at lr 6e-3 match 20 of 4 x 32
# at 3e-3). The fused loss leaves the head's matmuls to torch (not interpreted).
INTERPRETER_DEFAULTS = dict(
    steps=10, batch_size=2, seq_len=32, lr=6e-3, warmup_steps=2, eval_interval=5, eval_iters=1, sample_tokens=16
)
INTERPRETER_OVERRIDES = dict(fused_loss=True)
DTYPES = ("auto", "fp32", "bf16", "fp16")
CHECKPOINT_NAME = "ckpt.pt"
# The parent of each model kind's default out-dir (and, before it had one per kind, the out-dir of both).
DEFAULT_OUT_ROOT = "tritonformer-run"
# What may be resumed with other values than the checkpoint's: how long to train, how often to report, where to save.
RESUME_FROM_FLAGS = ("steps", "eval_interval", "eval_iters", "checkpoint_interval", "sample_tokens", "out_dir")


class TrainingDiverged(RuntimeError):
    """The loss or the weights became inf or nan: the run stops, and no checkpoint is written."""


def default_out_dir(model: str) -> str:
    """Each model kind's own directory, so that a run of one never overwrites the other's checkpoint."""
    return str(pathlib.Path(DEFAULT_OUT_ROOT) / model)


@dataclasses.dataclass
class TrainSettings:
    """What a run trains, on what, and how. Saved in each checkpoint."""

    preset: str = "tiny"
    model: str = "triton"  # "triton": Transformer on the kernel packages; "torch": TorchTransformer
    data: Optional[str] = None  # None: the standard library's source; or a text file, a .bin, a directory
    overrides: Dict[str, Any] = dataclasses.field(default_factory=dict)  # TransformerConfig options
    steps: int = 300
    batch_size: int = 16
    seq_len: Optional[int] = None  # None: the config's max_seq_len
    lr: float = 3e-3
    min_lr: Optional[float] = None  # None: lr / 10 at the end of the cosine
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dtype: str = "auto"  # auto: bf16 autocast (fp16 + GradScaler on GPUs without bf16); torch on a CPU: fp32
    device: str = "auto"
    compile: bool = False
    cuda_graph: bool = False  # replay the model's forward and backward from CUDA graphs (tritonformer.cuda_graph)
    eval_interval: int = 50
    eval_iters: int = 8
    checkpoint_interval: Optional[int] = None  # None: at each eval
    out_dir: Optional[str] = None  # None: default_out_dir(model)
    sample_tokens: int = 200
    seed: int = 1337

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"unknown model={self.model!r}; choose one of {', '.join(map(repr, MODELS))}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype={self.dtype!r}; choose one of {', '.join(map(repr, DTYPES))}")
        for name in ("steps", "batch_size", "eval_interval", "eval_iters", "seq_len", "checkpoint_interval"):
            _check_int(name, getattr(self, name), minimum=1, optional=name in ("seq_len", "checkpoint_interval"))
        for name in ("warmup_steps", "sample_tokens"):
            _check_int(name, getattr(self, name), minimum=0)
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if value is None and name == "min_lr":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        check_device_name(self.device)
        if self.cuda_graph and self.compile:
            raise ValueError("choose cuda_graph or compile, not both (torch.compile makes its own CUDA graphs)")
        if self.out_dir is None:
            self.out_dir = default_out_dir(self.model)


def _check_int(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_device_name(device: str) -> None:
    """auto, cpu, cuda or cuda:N; anything else raises a ValueError."""
    if device in ("auto", "cpu", "cuda"):
        return
    kind, _, index = str(device).partition(":")
    if kind != "cuda" or not index.isdigit():
        raise ValueError(f"unknown device {device!r}; choose auto, cpu, cuda or cuda:N")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_device(device: str) -> torch.device:
    """The torch.device of a device name; a CUDA one that torch cannot see raises a ValueError."""
    check_device_name(device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} needs a CUDA GPU, and torch sees none here (use cpu or auto)")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s) here")
    return resolved


def resolve_dtype(dtype: str, device: torch.device, model: str) -> torch.dtype:
    """auto: bf16 autocast on a GPU with bf16 (else fp16); on a CPU fp32 for the PyTorch model and
    bf16 autocast for the Triton one (its attention kernel computes in fp16/bf16 only)."""
    if dtype == "auto":
        if device.type != "cuda":
            return torch.bfloat16 if model == "triton" else torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def build_model(kind: str, config: TransformerConfig) -> CausalLM:
    """Transformer (the kernel packages) or TorchTransformer (plain PyTorch)."""
    if kind == "torch":
        from .torch_model import TorchTransformer

        return TorchTransformer(config)
    from .model import Transformer

    return Transformer(config)


def cosine_lr(step: int, settings: TrainSettings) -> float:
    """Linear warmup to lr, then a cosine down to min_lr at the last step."""
    min_lr = settings.lr / 10 if settings.min_lr is None else settings.min_lr
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    return min_lr + 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))) * (settings.lr - min_lr)


def make_optimizer(model: torch.nn.Module, settings: TrainSettings, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only (not on biases, norms)."""
    params = {id(p): p for p in model.parameters() if p.requires_grad}.values()  # a tied weight once
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95), **fused)


def check_same_run(path: pathlib.Path, state: Dict[str, Any], requested: TrainSettings) -> None:
    """Refuse to resume a checkpoint of another model kind or preset than the one asked for."""
    saved = state["settings"]
    for name, flag in (("model", "--model"), ("preset", "--preset")):
        if saved.get(name) != getattr(requested, name):
            raise ValueError(
                f"{path} holds a run of {name} {saved.get(name)!r}, not {getattr(requested, name)!r}: pass "
                f"{flag} {saved.get(name)} to resume it, or another --out-dir to start a new run"
            )


def check_same_config(path: pathlib.Path, saved: TransformerConfig, requested: TransformerConfig) -> None:
    """Refuse to resume a checkpoint whose TransformerConfig differs from the one the flags build."""
    differ = [
        f"{f.name}={getattr(saved, f.name)!r} (not {getattr(requested, f.name)!r})"
        for f in dataclasses.fields(TransformerConfig)
        if getattr(saved, f.name) != getattr(requested, f.name)
    ]
    if differ:
        raise ValueError(
            f"{path} holds a model of another config: {', '.join(differ)}; pass the same --set options to resume "
            "it, or another --out-dir to start a new run"
        )


class Trainer:
    """One training run: data, model, optimizer, AMP, checkpoints. `run()` does it all."""

    def __init__(self, settings: TrainSettings, resume: bool = False, log=print):
        self.log = log
        self.out_dir = pathlib.Path(settings.out_dir)
        self.checkpoint_path = self.out_dir / CHECKPOINT_NAME
        # Temporaries of checkpoint writes that a killed run left; a run sharing the directory writes newer ones.
        checkpoint.remove_stale_temporaries(self.checkpoint_path, before=time.time())
        state = checkpoint.load_checkpoint(self.checkpoint_path) if resume else None
        if not resume and self.checkpoint_path.exists():
            log(
                f"note: {self.checkpoint_path} exists; this new run replaces it at its first checkpoint "
                "(--resume continues it)"
            )
        requested = settings
        if state is not None:
            check_same_run(self.checkpoint_path, state, settings)
            # The run's own settings, except how long to train, how often to report and where to save.
            saved = dict(state["settings"])
            for name in RESUME_FROM_FLAGS:
                saved[name] = getattr(settings, name)
            settings = TrainSettings(**saved)
        self.settings = settings
        self.device = resolve_device(settings.device)
        self.dtype = resolve_dtype(settings.dtype, self.device, settings.model)
        self.data = data.load_data(settings.data)
        self.config = self._config(requested.preset, requested.overrides)
        if state is not None:
            check_same_config(self.checkpoint_path, TransformerConfig.from_dict(state["config"]), self.config)
        self.seq_len = self.config.max_seq_len if settings.seq_len is None else settings.seq_len
        if self.seq_len > self.config.max_seq_len:
            raise ValueError(f"seq_len={self.seq_len} exceeds the model's max_seq_len={self.config.max_seq_len}")
        self._check_data_length()

        torch.manual_seed(settings.seed)
        self.model = build_model(settings.model, self.config).to(self.device)
        # _config checked the data's largest token id against the vocabulary: no per-batch host read.
        self.model.check_token_ids = False
        self.optimizer = make_optimizer(self.model, settings, self.device)
        self.scaler = grad_scaler(self.device.type, enabled=self.dtype == torch.float16)
        self.batches = torch.Generator().manual_seed(settings.seed)
        self.step = 0
        self.saved_step: Optional[int] = None  # the step of the checkpoint on disk that this run wrote or resumed
        if state is not None:
            self._restore(state)
            self.saved_step = self.step
            self.log(
                f"resuming {self.checkpoint_path}: step {self.step} of {settings.steps}, model {settings.model!r}, "
                f"preset {settings.preset!r}"
                + (" (format 1: no checksum to verify)" if state["format_version"] == 1 else "")
            )
        self.forward = self._forward(settings)

    def _forward(self, settings: TrainSettings):
        """What a step calls: the model, compiled, or with its body replayed from CUDA graphs."""
        if settings.compile:
            return torch.compile(self.model)
        if settings.cuda_graph:
            if self.device.type != "cuda":
                raise ValueError(f"cuda_graph needs a CUDA device; this run is on {self.device}")
            from .cuda_graph import GraphedModel

            return GraphedModel(self.model)  # captures at the first training step
        return self.model

    def _config(self, preset: str, overrides: Dict[str, Any]) -> TransformerConfig:
        overrides = dict(overrides)
        if self.data.encode is not None and self.data.vocab_size == data.BYTE_VOCAB_SIZE:
            overrides.setdefault("vocab_size", data.BYTE_VOCAB_SIZE)  # byte-level text: 256 tokens
        config = TransformerConfig.preset(preset, **overrides)
        if self.data.vocab_size > config.vocab_size:
            raise ValueError(
                f"the data holds token ids up to {self.data.vocab_size - 1}, beyond vocab_size={config.vocab_size}"
            )
        return config

    def _check_data_length(self) -> None:
        for split, stream in (("train", self.data.train), ("validation", self.data.val)):
            if len(stream) < self.seq_len + 1:
                raise ValueError(
                    f"{self.data.description}: the {split} split has {len(stream):,} tokens, fewer than "
                    f"seq_len + 1 = {self.seq_len + 1} (use a smaller --seq-len or more data)"
                )

    # ----------------------------------------------------------------------------------------

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32)

    def batch(self, split: str, generator: torch.Generator):
        stream = self.data.train if split == "train" else self.data.val
        x, y = data.get_batch(stream, self.settings.batch_size, self.seq_len, generator)
        if self.device.type == "cuda":  # from pinned memory the copies do not wait for the GPU
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def train_step(self) -> float:
        """One optimizer step on one batch; returns its loss (before the step)."""
        self.model.train()
        lr = cosine_lr(self.step, self.settings)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        x, y = self.batch("train", self.batches)
        with self.autocast():
            _, loss = self.forward(x, y)
        self.scaler.scale(loss).backward()
        value = loss.item()
        if not math.isfinite(value):  # the scaler handles overflowing gradients, not a loss that is already inf/nan
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(f"the training loss is {value} at step {self.step + 1}")
        if self.settings.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.scaler.step(self.optimizer)  # skipped when the fp16 gradients overflowed
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return value

    @torch.no_grad()
    def evaluate(self) -> Dict[str, float]:
        """Mean loss over eval_iters fixed batches of each split (the same batches every time)."""
        self.model.eval()
        losses = {}
        for split in ("train", "val"):
            generator = torch.Generator().manual_seed(self.settings.seed + 1)
            total = 0.0
            for _ in range(self.settings.eval_iters):
                x, y = self.batch(split, generator)
                with self.autocast():
                    _, loss = self.forward(x, y)
                total += loss.item()
            losses[split] = total / self.settings.eval_iters
        self.model.train()
        return losses

    def sample(self, max_new_tokens: int, generator: Optional[torch.Generator] = None) -> str:
        """A continuation of the first tokens of the validation split."""
        prompt_len = max(1, min(32, self.seq_len // 2))
        prompt = torch.as_tensor(self.data.val[:prompt_len].astype("int64"), device=self.device)[None]  # (1, P)
        with self.autocast():
            out = self.model.generate(prompt, max_new_tokens, temperature=0.8, top_k=50, generator=generator)
        return self.data.decode(out[0].tolist())

    # ----------------------------------------------------------------------------------------

    def save(self, path: Optional[os.PathLike] = None) -> pathlib.Path:
        """Write the run's state to path (default: OUT_DIR/ckpt.pt); never weights that hold inf or nan."""
        path = pathlib.Path(path) if path is not None else self.checkpoint_path
        self._check_finite_weights(path)
        state = {
            "settings": dataclasses.asdict(self.settings),
            "config": self.config.to_dict(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "step": self.step,
            "batch_rng": self.batches.get_state(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        checkpoint.save_checkpoint(path, state)
        if path == self.checkpoint_path:
            self.saved_step = self.step
        return path

    def _check_finite_weights(self, path: pathlib.Path) -> None:
        named = [(name, p) for name, p in self.model.named_parameters()]
        finite = torch.stack([p.detach().isfinite().all() for _, p in named]).tolist()  # one wait for the device
        if not all(finite):
            name = named[finite.index(False)][0]
            raise TrainingDiverged(f"{name} holds inf or nan after step {self.step}, so {path} was not written")

    def _kept_checkpoint(self) -> str:
        if self.saved_step is None:
            return "no checkpoint was written"
        return f"{self.checkpoint_path} (step {self.saved_step}) is left as it was"

    def _restore(self, state: Dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.step = state["step"]
        self.batches.set_state(state["batch_rng"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)

    def run(self) -> Dict[str, Any]:
        """Train to settings.steps with progress, evals and checkpoints; a sample at the end.

        A loss or weights that become inf or nan raise TrainingDiverged, whose message says which checkpoint
        is left on disk. A run resumed at or past settings.steps says so and trains nothing ("already_complete").
        """
        s = self.settings
        if self.step >= s.steps:
            self.log(
                f"{self.checkpoint_path}: the run is already complete (step {self.step} of {s.steps}); "
                "pass a larger --steps to train further"
            )
            return {"history": [], "last_loss": float("nan"), "sample": "", "seconds": 0.0, "already_complete": True}
        self.log(self.describe())
        try:
            return self._train()
        except TrainingDiverged as error:
            raise TrainingDiverged(f"{error}: training stopped; {self._kept_checkpoint()}") from None

    def _train(self) -> Dict[str, Any]:
        s = self.settings
        tokens_per_step = s.batch_size * self.seq_len
        every = s.checkpoint_interval or s.eval_interval
        history = []
        first_eval = self.evaluate() if self.step == 0 else None
        if first_eval:
            self.log(f"step {self.step}: train loss {first_eval['train']:.4f}, val loss {first_eval['val']:.4f}")
            history.append((self.step, first_eval))
        bar = ProgressBar(s.steps, start=self.step)
        started, start_step = time.perf_counter(), self.step
        loss = float("nan")
        try:
            while self.step < s.steps:
                loss = self.train_step()
                rate = (self.step - start_step) * tokens_per_step / (time.perf_counter() - started)
                bar.update(self.step, f"loss {loss:.4f} lr {cosine_lr(self.step - 1, s):.2e} {rate:,.0f} tok/s")
                if self.step % s.eval_interval == 0 or self.step == s.steps:
                    losses = self.evaluate()
                    history.append((self.step, losses))
                    bar.write(f"step {self.step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
                if self.step % every == 0 or self.step == s.steps:
                    self.save()
        finally:
            bar.close()
        elapsed = time.perf_counter() - started
        text = self.sample(s.sample_tokens) if s.sample_tokens else ""
        if text:
            self.log(f"sample after {self.step} steps:\n{text}")
        self.log(f"checkpoint: {self.checkpoint_path}; {elapsed:.1f} s for {self.step - start_step} steps")
        return {"history": history, "last_loss": loss, "sample": text, "seconds": elapsed, "already_complete": False}

    def describe(self) -> str:
        s, c = self.settings, self.config
        name = "Transformer (Triton kernels)" if s.model == "triton" else "TorchTransformer (plain PyTorch)"
        mode = ", kernels in Triton's CPU interpreter" if s.model == "triton" and interpreting() else ""
        amp = {torch.float32: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast + GradScaler"}
        return (
            f"{name}, preset {s.preset!r}: {self.model.num_params(matmul_only=False):,} parameters "
            f"({c.n_layer} layers, d_model {c.d_model}, {c.n_head} heads, {c.position} positions, {c.norm}, "
            f"{c.mlp}); on {self.device}{mode}, {amp[self.dtype]}\n"
            f"data: {self.data.description}: {len(self.data.train):,} train / {len(self.data.val):,} val tokens\n"
            f"{s.steps} steps of {s.batch_size} x {self.seq_len} tokens, lr {s.lr:g}, "
            f"from step {self.step}"
        )


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """A --set value: an int, a float, true/false, none, or else the string."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


class HelpFormatter(argparse.HelpFormatter):
    """Each option's default shown once: the help text's own words when it names it, else "(default: X)"
    for an option that has a value by default (not for None, flags or empty lists)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not action.option_strings or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


positive_int = _at_least(1)
non_negative_int = _at_least(0)


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def device_name(text: str) -> str:
    try:
        check_device_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    defaults, interpreted = TrainSettings(), INTERPRETER_DEFAULTS
    p = argparse.ArgumentParser(prog="tritonformer-train", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter)  # fmt: skip
    p.add_argument("--preset", default=defaults.preset, choices=list(PRESETS), help="model size and architecture")
    p.add_argument("--model", default=defaults.model, choices=MODELS, help="the Triton model or its PyTorch twin")
    p.add_argument("--data", default=None, help="text file, nanoGPT .bin, or directory with train.bin/val.bin "
                   "(default: the Python standard library's source, as bytes)")  # fmt: skip
    p.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="OPTION=VALUE",
                   help="TransformerConfig options, e.g. --set dropout=0.1 fused_loss=true")  # fmt: skip
    for name, kind, what in (
        ("steps", positive_int, "optimizer steps to train to"),
        ("batch_size", positive_int, "sequences per step"),
        ("warmup_steps", non_negative_int, "steps of linear learning-rate warmup"),
        ("eval_interval", positive_int, "steps between evaluations and checkpoints"),
        ("eval_iters", positive_int, "batches per split in each evaluation"),
        ("sample_tokens", non_negative_int, "tokens sampled at the end, 0 for none"),
    ):
        default = f"default {getattr(defaults, name)}; {interpreted[name]} in the interpreter"
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=f"{what} ({default})")
    p.add_argument("--seq-len", type=positive_int, default=None,
                   help=f"tokens per sequence (default: the model's max_seq_len; {interpreted['seq_len']} in the "
                   "interpreter)")  # fmt: skip
    p.add_argument("--checkpoint-interval", type=positive_int, default=None,
                   help="steps between checkpoints (default: --eval-interval)")  # fmt: skip
    p.add_argument("--lr", type=non_negative_float, default=None,
                   help=f"peak learning rate (default {defaults.lr:g}; {interpreted['lr']:g} in the "
                   "interpreter)")  # fmt: skip
    p.add_argument("--min-lr", type=non_negative_float, default=None,
                   help="learning rate at the end of the cosine (default: lr / 10)")  # fmt: skip
    p.add_argument("--weight-decay", type=non_negative_float, default=defaults.weight_decay,
                   help="AdamW weight decay of the matrices (not of biases and norms)")  # fmt: skip
    p.add_argument("--grad-clip", type=non_negative_float, default=defaults.grad_clip,
                   help="largest gradient norm (0: no clipping)")  # fmt: skip
    p.add_argument("--dtype", default=defaults.dtype, choices=DTYPES,
                   help="auto: bf16 autocast (fp16 on GPUs without bf16; fp32 for the PyTorch model on a CPU); "
                   "fp16 uses a GradScaler")  # fmt: skip
    p.add_argument("--device", type=device_name, default=defaults.device,
                   help="auto (cuda if present and not interpreting, else cpu), cpu, cuda or cuda:N")  # fmt: skip
    p.add_argument("--seed", type=int, default=defaults.seed, help="seed of the init, the batches and dropout")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--cuda-graph", action="store_true",
                   help="replay the model's forward and backward from CUDA graphs (GPU, dropout 0)")  # fmt: skip
    p.add_argument("--out-dir", default=None,
                   help=f"where checkpoints go (default: {default_out_dir('MODEL')}, one directory per "
                   "--model)")  # fmt: skip
    p.add_argument("--resume", action="store_true",
                   help=f"continue the run in OUT_DIR/{CHECKPOINT_NAME}: --model, --preset and --set must match it; "
                   "its data, batch, schedule, dtype and seed are kept; --steps, the intervals and --sample-tokens "
                   "are the flags'")  # fmt: skip
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> TrainSettings:
    """The run's settings; a bad --set item or value raises a ValueError or TypeError."""
    overrides = {}
    for item in args.overrides:
        if "=" not in item:
            raise ValueError(f"--set takes OPTION=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        overrides[key] = parse_value(value)
    fields = {f.name for f in dataclasses.fields(TrainSettings)}
    values = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    values["overrides"] = overrides
    if values.get("model", "triton") == "triton" and runs_in_interpreter(values.get("device", "auto")):
        values = {**INTERPRETER_DEFAULTS, **values, "overrides": {**INTERPRETER_OVERRIDES, **overrides}}
    return TrainSettings(**values)


def runs_in_interpreter(device: str) -> bool:
    """The Triton model runs in the interpreter here: no CUDA GPU (or TRITON_INTERPRET=1)."""
    return interpreting() or (device in ("auto", "cpu") and not torch.cuda.is_available())


def _error(message: str) -> int:
    print(f"tritonformer-train: error: {message}", file=sys.stderr)
    return 1


def _missing_checkpoint(error: FileNotFoundError, args: argparse.Namespace) -> str:
    """The error, and where a checkpoint of the former shared default out-dir is, when there is one."""
    legacy = pathlib.Path(DEFAULT_OUT_ROOT) / CHECKPOINT_NAME
    if args.out_dir is None and legacy.is_file():
        return (
            f"{error}; {legacy} (the default out-dir before each model had its own) holds one: "
            f"pass --out-dir {legacy.parent}"
        )
    return str(error)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
        resolve_device(settings.device)
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    if settings.model == "triton" and runs_in_interpreter(settings.device) and not interpreting():
        # Triton decides when a kernel is defined whether it is interpreted: start afresh with it set.
        print("no CUDA GPU: running the Triton kernels in Triton's CPU interpreter (TRITON_INTERPRET=1)", flush=True)
        argv = sys.argv[1:] if argv is None else list(argv)
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        os.execve(sys.executable, [sys.executable, "-m", "tritonformer.train", *argv], env)
    try:
        trainer = Trainer(settings, resume=args.resume)
    except FileNotFoundError as error:
        return _error(_missing_checkpoint(error, args) if args.resume else str(error))
    except (ValueError, TypeError, OSError) as error:  # a bad config, data file or checkpoint: one line names it
        return _error(str(error))
    try:
        trainer.run()
    except TrainingDiverged as error:
        return _error(f"{error} (a lower --lr or --grad-clip, or --dtype bf16 or fp32, may help)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
