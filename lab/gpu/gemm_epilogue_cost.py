"""What fused-gemm's forward epilogue costs, by part: bias, activation math, the second store.

    python3 lab/gpu/gemm_epilogue_cost.py

For the issue's three products (bf16, x (M, K) @ w (K, N)), the TMA kernel's forward with: no
epilogue; + bias; + bias, ReLU; + bias, GELU; + bias, GELU (tanh); + bias, GELU storing z too (the
training forward). Beside them cuBLAS plain, cuBLAS with bias (F.linear) and torch's unfused
F.gelu(F.linear(x, w, b)). Timed by the tuner's own timer (ops.tuning.replay_rounds: CUDA-graph
replays under sustained load, interleaved rounds, the median). Each variant is tuned for itself
(its block shapes depend on the epilogue: the kernel may store it in halves), and its config is
named beside it.
A lab tool for the GPU runs recorded in NOTES.md: it prints a table and changes nothing.
"""

from __future__ import annotations

import statistics

import torch.nn.functional as F

from fused_gemm.kernels.common import ACTIVATION_CODES
from fused_gemm.ops import launch, tuning
from lab import gemm_config_name, gemm_operands

PRODUCTS = [(16384, 2048, 8192), (16384, 8192, 2048), (16384, 2048, 6144)]
# (label, bias, activation, store z)
VARIANTS = [
    ("plain", False, None, False),
    ("+bias", True, None, False),
    ("+bias relu", True, "relu", False),
    ("+bias gelu", True, "gelu", False),
    ("+bias gelu_tanh", True, "gelu_tanh", False),
    ("+bias gelu, z stored", True, "gelu", True),
]


def _rows(m: int, k: int, n: int):
    a, w, b, bias, c, z = gemm_operands(m, k, n)
    launches, names = [], []
    for label, has_bias, activation, store_z in VARIANTS:
        kwargs = dict(bias=bias if has_bias else None, activation=ACTIVATION_CODES[activation],
                      z=z if store_z else None, split=1)  # fmt: skip
        launch.launch_matmul(a, b, c, **kwargs)  # tunes this variant's plan
        plan = launch.tma_plan(a, b, c, kwargs["z"], kwargs["bias"], kwargs["activation"])
        names.append(f"{label} ({gemm_config_name(plan.meta)})")
        launches.append(lambda kwargs=kwargs: launch.launch_matmul(a, b, c, **kwargs))
    x = a[0]
    for label, fn in (
        ("cuBLAS plain", lambda: F.linear(x, w)),
        ("cuBLAS +bias (F.linear)", lambda: F.linear(x, w, bias)),
        ("torch +bias gelu (F.linear, F.gelu)", lambda: F.gelu(F.linear(x, w, bias))),
    ):
        names.append(label)
        launches.append(fn)
    samples = tuning.replay_rounds(launches, tuning.ROUNDS)
    ms = [statistics.median(times) for times in samples]
    plain = ms[0]
    return [(name, t, t / plain) for name, t in zip(names, ms)]


def main() -> None:
    for m, k, n in PRODUCTS:
        print(f"\n{m}x{k}x{n}")
        print("| variant (config) | ms (graph) | / our plain |")
        print("|---|---:|---:|")
        for name, t, ratio in _rows(m, k, n):
            print(f"| {name} | {t:.4f} | {ratio:.3f} |", flush=True)


if __name__ == "__main__":
    main()
