"""How stable fused-gemm's tuner picks are, and whether its ranking of candidates holds over time.

    python3 lab/gpu/gemm_pick_stability.py [M K N]      (default 16384 2048 8192, plain forward)

1. Every TMA candidate the tuner would time for the product, each pinned (as gemm_kernel_ab.py
   pins them), and cuBLAS beside them: REPEATS times the tuner's own timer over all of them
   (ops.tuning.replay_rounds: CUDA-graph replays, interleaved rounds, the median), with the
   GPU's SM clock, power and temperature (nvidia-smi) before each repetition. A ranking that
   changes between repetitions while the clocks move says the pick depends on the GPU's state.
2. The tuner itself, TUNINGS times from a fresh plan: its picks.
A lab tool for the GPU runs recorded in NOTES.md: it prints tables and changes nothing.
"""

from __future__ import annotations

import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

from fused_gemm._compat import multiprocessor_count
from fused_gemm.kernels.configs import tma_candidates
from fused_gemm.kernels.matmul_tma import _matmul_tma_kernel
from fused_gemm.ops import launch, tuning
from lab import gemm_config_name, gemm_operands

REPEATS = 6
TUNINGS = 4


def _gpu_state() -> str:
    query = "--query-gpu=clocks.sm,power.draw,temperature.gpu"
    out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.strip()


def _pinned(config, a, b, c):
    configs = [config]

    def call():
        _matmul_tma_kernel.configs = configs  # the plan re-resolves its one candidate (no timing)
        launch.launch_matmul(a, b, c, split=1)

    return call


def main(m: int, k: int, n: int) -> None:
    print(torch.cuda.get_device_name(), f"{m}x{k}x{n} plain forward, bf16")
    a, w, b, _, c, _ = gemm_operands(m, k, n)
    all_configs = list(_matmul_tma_kernel.configs)
    candidates = tma_candidates(all_configs, m, n, 1, 2, 0, False, 2, a.device)
    names = [gemm_config_name(launch.config_launch_kwargs(config)) for config in candidates] + ["cuBLAS"]
    launches = [_pinned(config, a, b, c) for config in candidates] + [lambda: F.linear(a[0], w)]
    try:
        for call in launches:
            call()  # compile outside the captures
        table = []
        for _ in range(REPEATS):
            state = _gpu_state()
            samples = tuning.replay_rounds(launches, tuning.ROUNDS)
            table.append((state, [statistics.median(times) for times in samples]))
    finally:
        _matmul_tma_kernel.configs = all_configs
    print("| repetition (sm MHz, W, C) | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for state, ms in table:
        best = min(ms[:-1])
        cells = [f"**{t:.4f}**" if t == best else f"{t:.4f}" for t in ms]
        print(f"| {state} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nthe tuner, {TUNINGS} fresh tunings:")
    for _ in range(TUNINGS):
        launch._tma_plan.cache_clear()
        launch.launch_matmul(a, b, c, split=1)
        plan = launch.tma_plan(a, b, c)
        picked = next(cfg for cfg in all_configs if launch.config_launch_kwargs(cfg) == plan.meta)
        print(f"  {gemm_config_name(launch.config_launch_kwargs(picked))} ({_gpu_state()})", flush=True)
    print(f"(SMs: {multiprocessor_count(a.device)})")


if __name__ == "__main__":
    main(*(int(arg) for arg in sys.argv[1:4]) if len(sys.argv) > 3 else (16384, 2048, 8192))
