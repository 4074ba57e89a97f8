"""Convergence: Transformer against TorchTransformer from one initialization, on the default corpus.

    python -m tritonformer.convergence                 # tiny preset, 300 steps, bf16 autocast
    python -m tritonformer.convergence --preset tiny-llama --steps 500

Three runs start from the same weights and see the same batches: `Transformer` (the kernels)
and `TorchTransformer` under bf16 autocast, and `TorchTransformer` in fp32, the reference.
Eval losses (fixed batches of the validation split) are recorded every --eval-interval steps.
The Triton model tracks the twin when its largest deviation from the fp32 curve is at most
twice the bf16 twin's own largest deviation plus `SLACK` nats: the project's tolerance rule
applied to loss curves. Prints a markdown table of the curves and the verdict; exits 1 if the
Triton model does not track.
"""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional

import torch

from .config import PRESETS
from .train import Trainer, TrainSettings

# Absolute slack (nats) on top of 2x the bf16 twin's deviation: the loss curves of two bf16 runs
# whose roundings differ wander apart by about this much over a few hundred steps.
SLACK = 0.02
RUNS = (("tritonformer", "triton", "bf16"), ("torch", "torch", "bf16"), ("torch-fp32", "torch", "fp32"))


def loss_curves(
    preset: str = "tiny",
    steps: int = 300,
    batch_size: int = 16,
    seq_len: int = 64,
    eval_interval: int = 50,
    eval_iters: int = 8,
    lr: float = 3e-3,
    device: str = "auto",
    seed: int = 0,
) -> Dict[str, List[float]]:
    """{run name: validation loss at steps 0, eval_interval, ..., steps}, all from one init."""
    curves: Dict[str, List[float]] = {}
    init: Optional[dict] = None
    for name, model, dtype in RUNS:
        settings = TrainSettings(
            preset=preset, model=model, dtype=dtype, device=device, steps=steps, batch_size=batch_size,
            seq_len=seq_len, lr=lr, warmup_steps=min(20, steps // 10), eval_interval=eval_interval,
            eval_iters=eval_iters, seed=seed, sample_tokens=0, out_dir="unused",
        )  # fmt: skip
        trainer = Trainer(settings, log=lambda *_: None)
        if init is None:
            init = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        trainer.model.load_state_dict(init)
        curve = [trainer.evaluate()["val"]]
        while trainer.step < steps:
            trainer.train_step()
            if trainer.step % eval_interval == 0 or trainer.step == steps:
                curve.append(trainer.evaluate()["val"])
        curves[name] = curve
    return curves


def verdict(curves: Dict[str, List[float]]) -> Dict[str, float]:
    """Largest deviations from the fp32 curve, the bound, and whether the Triton model tracks."""
    reference = curves["torch-fp32"]
    ours = max(abs(a - b) for a, b in zip(curves["tritonformer"], reference))
    twin = max(abs(a - b) for a, b in zip(curves["torch"], reference))
    bound = 2 * twin + SLACK
    return {"tritonformer_deviation": ours, "torch_bf16_deviation": twin, "bound": bound, "tracks": ours <= bound}


def markdown(curves: Dict[str, List[float]], eval_interval: int, steps: int) -> str:
    at = [min(i * eval_interval, steps) for i in range(len(curves["torch-fp32"]))]
    lines = ["| step | " + " | ".join(curves) + " |", "|---:|" + "---:|" * len(curves)]
    for i, step in enumerate(at):
        lines.append(f"| {step} | " + " | ".join(f"{curve[i]:.4f}" for curve in curves.values()) + " |")
    v = verdict(curves)
    lines.append(
        f"\nlargest deviation from fp32: tritonformer {v['tritonformer_deviation']:.4f}, torch bf16 "
        f"{v['torch_bf16_deviation']:.4f}; bound 2 x torch + {SLACK} = {v['bound']:.4f}: "
        + ("tracks" if v["tracks"] else "DOES NOT TRACK")
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tritonformer.convergence", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", choices=list(PRESETS))
    for name, default in (("steps", 300), ("batch-size", 16), ("seq-len", 64), ("eval-interval", 50),
                          ("eval-iters", 8), ("seed", 0)):  # fmt: skip
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--device", default="auto")
    args = p.parse_args(argv)
    curves = loss_curves(
        args.preset, args.steps, args.batch_size, args.seq_len, args.eval_interval, args.eval_iters, args.lr,
        args.device, args.seed,
    )  # fmt: skip
    print(f"{args.preset}, {args.steps} steps of {args.batch_size} x {args.seq_len} tokens, lr {args.lr:g}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}\n")  # fmt: skip
    print(markdown(curves, args.eval_interval, args.steps))
    return 0 if verdict(curves)["tracks"] else 1


if __name__ == "__main__":
    sys.exit(main())
