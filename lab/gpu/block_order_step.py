"""A training step with fused-attention's GQA grids block-major (as shipped) and head-major, alternating.

    LAB_SET="n_kv_head=4" python3 lab/gpu/block_order_step.py PRESET:CONTEXT:BATCH PROVIDER

The head-major runs rebuild the attention plans with BLOCK_MAJOR=False forced where they are made
(ops.launch's Launch and TunedPlan); each switch clears the plans, so both orders are autotuned
afresh. Three alternating pairs of step medians. A lab tool for the GPU runs recorded in NOTES.md.
"""

from __future__ import annotations

import sys

import torch

from fused_attention.ops import launch
from lab import step_ms, warm_training_step

SHIPPED = {"Launch": launch.Launch, "TunedPlan": launch.TunedPlan}


def head_major(name):
    def build(*args, **kwargs):
        if "BLOCK_MAJOR" in kwargs:
            kwargs["BLOCK_MAJOR"] = False
        if "fixed" in kwargs:
            kwargs["fixed"] = tuple((key, False if key == "BLOCK_MAJOR" else value) for key, value in kwargs["fixed"])
        return SHIPPED[name](*args, **kwargs)

    return build


def use(order: str) -> None:
    launch.clear_plans()
    for name, cls in SHIPPED.items():
        setattr(launch, name, cls if order == "block-major" else head_major(name))


def main() -> None:
    step, _ = warm_training_step(sys.argv[1], sys.argv[2], torch.device("cuda"))
    rows = {"block-major": [], "head-major": []}
    for _ in range(3):
        for order in rows:
            use(order)
            step.fn()  # rebuilds and tunes the plans
            rows[order].append(step_ms(step.fn))
    for order, times in rows.items():
        print(f"| {sys.argv[1]} {sys.argv[2]} {order} | " + ", ".join(f"{t:.2f}" for t in times) + " ms |", flush=True)


if __name__ == "__main__":
    main()
