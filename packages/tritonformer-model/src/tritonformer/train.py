"""tritonformer-train: train the GPT on the default corpus, a text file or nanoGPT .bin tokens.

    tritonformer-train                                  # the tiny preset on the standard library's source
    tritonformer-train --preset llama-410M --data data/openwebtext --steps 5000 --batch-size 8
    tritonformer-train --resume                         # continue the run in --out-dir

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
    out_dir: str = "tritonformer-run"
    sample_tokens: int = 200
    seed: int = 1337

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"unknown model={self.model!r}; choose one of {', '.join(map(repr, MODELS))}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype={self.dtype!r}; choose one of {', '.join(map(repr, DTYPES))}")
        for name in ("steps", "batch_size", "eval_interval", "eval_iters"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cuda_graph and self.compile:
            raise ValueError("choose cuda_graph or compile, not both (torch.compile makes its own CUDA graphs)")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and not interpreting() else "cpu"
    return torch.device(device)


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


class Trainer:
    """One training run: data, model, optimizer, AMP, checkpoints. `run()` does it all."""

    def __init__(self, settings: TrainSettings, resume: bool = False, log=print):
        self.log = log
        self.out_dir = pathlib.Path(settings.out_dir)
        state = checkpoint.load_checkpoint(self.out_dir / CHECKPOINT_NAME) if resume else None
        if state is not None:
            # The run's own settings, except how long to train and how often to report.
            saved = dict(state["settings"])
            for name in ("steps", "eval_interval", "eval_iters", "checkpoint_interval", "sample_tokens"):
                saved[name] = getattr(settings, name)
            settings = TrainSettings(**saved)
        self.settings = settings
        self.device = resolve_device(settings.device)
        self.dtype = resolve_dtype(settings.dtype, self.device, settings.model)
        self.data = data.load_data(settings.data)
        self.config = self._config(state)
        self.seq_len = settings.seq_len or self.config.max_seq_len
        if self.seq_len > self.config.max_seq_len:
            raise ValueError(f"seq_len={self.seq_len} exceeds the model's max_seq_len={self.config.max_seq_len}")

        torch.manual_seed(settings.seed)
        self.model = build_model(settings.model, self.config).to(self.device)
        self.optimizer = make_optimizer(self.model, settings, self.device)
        self.scaler = grad_scaler(self.device.type, enabled=self.dtype == torch.float16)
        self.batches = torch.Generator().manual_seed(settings.seed)
        self.step = 0
        if state is not None:
            self._restore(state)
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

    def _config(self, state: Optional[Dict[str, Any]]) -> TransformerConfig:
        if state is not None:
            return TransformerConfig.from_dict(state["config"])
        overrides = dict(self.settings.overrides)
        if self.data.encode is not None and self.data.vocab_size == data.BYTE_VOCAB_SIZE:
            overrides.setdefault("vocab_size", data.BYTE_VOCAB_SIZE)  # byte-level text: 256 tokens
        config = TransformerConfig.preset(self.settings.preset, **overrides)
        if self.data.vocab_size > config.vocab_size:
            raise ValueError(
                f"the data holds token ids up to {self.data.vocab_size - 1}, beyond vocab_size={config.vocab_size}"
            )
        return config

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
        if self.settings.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        self.scaler.step(self.optimizer)  # skipped when the fp16 gradients overflowed
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return loss.item()

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
        prompt_len = min(32, self.seq_len // 2)
        prompt = torch.as_tensor(self.data.val[:prompt_len].astype("int64"), device=self.device)[None]  # (1, P)
        with self.autocast():
            out = self.model.generate(prompt, max_new_tokens, temperature=0.8, top_k=50, generator=generator)
        return self.data.decode(out[0].tolist())

    # ----------------------------------------------------------------------------------------

    def save(self, path: Optional[os.PathLike] = None) -> pathlib.Path:
        path = pathlib.Path(path) if path is not None else self.out_dir / CHECKPOINT_NAME
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
        return path

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
        """Train to settings.steps with progress, evals and checkpoints; a sample at the end."""
        s = self.settings
        tokens_per_step = s.batch_size * self.seq_len
        every = s.checkpoint_interval or s.eval_interval
        self.log(self.describe())
        history = []
        first_eval = self.evaluate() if self.step == 0 else None
        if first_eval:
            self.log(f"step {self.step}: train loss {first_eval['train']:.4f}, val loss {first_eval['val']:.4f}")
            history.append((self.step, first_eval))
        bar = ProgressBar(s.steps, start=self.step)
        started, start_step = time.perf_counter(), self.step
        loss = float("nan")
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
        bar.close()
        elapsed = time.perf_counter() - started
        text = self.sample(s.sample_tokens) if s.sample_tokens else ""
        if text:
            self.log(f"sample after {self.step} steps:\n{text}")
        self.log(f"checkpoint: {self.out_dir / CHECKPOINT_NAME}; {elapsed:.1f} s for {self.step - start_step} steps")
        return {"history": history, "last_loss": loss, "sample": text, "seconds": elapsed}

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


def parse_args(argv=None) -> argparse.Namespace:
    defaults = TrainSettings()
    p = argparse.ArgumentParser(
        prog="tritonformer-train",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--preset", default=defaults.preset, choices=list(PRESETS), help="model size and architecture")
    p.add_argument("--model", default=defaults.model, choices=MODELS, help="the Triton model or its PyTorch twin")
    p.add_argument("--data", default=None, help="text file, nanoGPT .bin, or directory with train.bin/val.bin "
                   "(default: the Python standard library's source, as bytes)")  # fmt: skip
    p.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="OPTION=VALUE",
                   help="TransformerConfig options, e.g. --set dropout=0.1 fused_loss=true")  # fmt: skip
    for name in ("steps", "batch_size", "warmup_steps", "eval_interval", "eval_iters", "sample_tokens"):
        default, interpreted = getattr(defaults, name), INTERPRETER_DEFAULTS[name]
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help=f"default {default}; {interpreted} in the interpreter")  # fmt: skip
    p.add_argument("--seed", type=int, default=defaults.seed)
    interpreted = INTERPRETER_DEFAULTS["seq_len"]
    p.add_argument("--seq-len", type=int, default=None,
                   help=f"tokens per sequence (default: max_seq_len; {interpreted} in the interpreter)")  # fmt: skip
    p.add_argument("--checkpoint-interval", type=int, default=None, help="steps between saves (default: eval)")
    interpreted = INTERPRETER_DEFAULTS["lr"]
    p.add_argument("--lr", type=float, default=None,
                   help=f"peak learning rate (default {defaults.lr:g}; {interpreted:g} interpreted)")  # fmt: skip
    for name in ("weight_decay", "grad_clip"):
        p.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(defaults, name))
    p.add_argument("--min-lr", type=float, default=None, help="final learning rate (default: lr / 10)")
    p.add_argument("--dtype", default=defaults.dtype, choices=DTYPES, help="fp16 uses a GradScaler")
    p.add_argument("--device", default=defaults.device, help="auto: cuda if present (and not interpreting), else cpu")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--cuda-graph", action="store_true",
                   help="replay the model's forward and backward from CUDA graphs (GPU, dropout 0)")  # fmt: skip
    p.add_argument("--out-dir", default=defaults.out_dir, help="where checkpoints go")
    p.add_argument("--resume", action="store_true", help=f"continue from OUT_DIR/{CHECKPOINT_NAME}")
    return p.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> TrainSettings:
    overrides = {}
    for item in args.overrides:
        if "=" not in item:
            raise SystemExit(f"--set takes OPTION=VALUE, got {item!r}")
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


def main(argv=None) -> int:
    args = parse_args(argv)
    settings = settings_from_args(args)
    if settings.model == "triton" and runs_in_interpreter(settings.device) and not interpreting():
        # Triton decides when a kernel is defined whether it is interpreted: start afresh with it set.
        print("no CUDA GPU: running the Triton kernels in Triton's CPU interpreter (TRITON_INTERPRET=1)", flush=True)
        argv = sys.argv[1:] if argv is None else list(argv)
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        os.execve(sys.executable, [sys.executable, "-m", "tritonformer.train", *argv], env)
    trainer = Trainer(settings, resume=args.resume)
    trainer.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
