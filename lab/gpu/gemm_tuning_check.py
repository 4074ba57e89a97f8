"""Does fused-gemm's tuner (ops.tuning) pick the same config twice, and how close to the best?

    python3 lab/gpu/gemm_tuning_check.py [TUNINGS]

For each product (the issue's three forwards, and the GPT-2 410M layer's four at 16k tokens):
tunes it TUNINGS times (default 3; a fresh config list each time, so the plan re-tunes), then
times each distinct pick and cuBLAS together by the tuner's own timer (ops.tuning.replay_rounds:
CUDA-graph replays under sustained load, interleaved rounds, the median). A lab tool for the GPU
runs recorded in NOTES.md; prints a table, changes nothing.
"""

from __future__ import annotations

import statistics
import sys

import torch.nn.functional as F

from fused_gemm.kernels.configs import tma_configs
from fused_gemm.kernels.matmul_tma import _matmul_tma_kernel
from fused_gemm.ops import launch, tuning
from lab import gemm_config_name, gemm_operands

PRODUCTS = {
    "16384x2048x8192": (16384, 2048, 8192),
    "16384x8192x2048": (16384, 8192, 2048),
    "16384x2048x6144": (16384, 2048, 6144),
    "410M qkv": (16384, 1024, 3072),
    "410M fc1": (16384, 1024, 4096),
    "410M fc2": (16384, 4096, 1024),
    "410M proj": (16384, 1024, 1024),
}


def _row(label: str, m: int, k: int, n: int, tunings: int) -> str:
    a, w, b, _, c, _ = gemm_operands(m, k, n)
    picks, configs = [], {}
    for _ in range(tunings):
        _matmul_tma_kernel.configs = tma_configs()  # a fresh list: the plan re-tunes
        launch.launch_matmul(a, b, c, split=1)
        plan = launch.tma_plan(a, b, c)
        picks.append(gemm_config_name(plan.meta))
        configs[picks[-1]] = (plan.meta, plan.grid, plan.blocks)

    def with_pick(state):
        def call():
            plan.meta, plan.grid, plan.blocks = state  # replays keep what the capture launched
            launch.launch_matmul(a, b, c, split=1)

        return call

    names = [*configs, "cuBLAS"]
    launches = [*(with_pick(state) for state in configs.values()), lambda: F.linear(a, w)]
    samples = tuning.replay_rounds(launches, tuning.ROUNDS)  # the tuner's own timer
    ms = {name: statistics.median(times) for name, times in zip(names, samples)}
    cublas = ms.pop("cuBLAS")
    times = ", ".join(f"{name} {value:.3f}" for name, value in ms.items())
    return f"| {label} | {', '.join(picks)} | {times} | {cublas:.3f} | {cublas / min(ms.values()):.2f} |"


def main(tunings: int) -> None:
    print(f"| product | picks over {tunings} tunings | ms of each pick (graph) | cuBLAS ms | cuBLAS / best pick |")
    print("|---|---|---|---:|---:|")
    for label, (m, k, n) in PRODUCTS.items():
        print(_row(label, m, k, n, tunings), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
