"""A/B of fused-attention's ALiBi kernels: the package against copies of its source, configs pinned.

    python3 lab/gpu/attn_alibi_ab.py old=/path/to/src [v2=/path/to/other/src ...]

Each copy is a `src` directory holding a `fused_attention` package (e.g. `git archive` of an
earlier commit); it is imported under its own module name beside the package, so every variant
runs in one process, with the package without ALiBi as the yardstick. At D = 128 (H = 16) and
D = 64 (H = 32), B = 4, S = 4096, causal, ALiBi with the standard slopes: the forward and the
backward at the configs the autotuner picked in run 115, pinned, every variant of one config
timed together by fused-gemm's tuner timer (CUDA-graph replays, interleaved rounds, medians). A
lab tool for the GPU runs recorded in NOTES.md: it prints a table and changes nothing.
"""

from __future__ import annotations

import importlib
import statistics
import sys

import torch
from attn_config_sweep import attention_problem

from fused_attention import alibi_slopes
from fused_attention.ops import launch
from fused_attention.ops.configs import KernelConfig
from fused_gemm.ops import tuning
from lab import load_package_copy

# (B, H, S, D): forward configs, backward (dK/dV, dQ) config pairs, as (BM, BN, warps, stages)
POINTS = {
    (4, 16, 4096, 128): ([(64, 64, 4, 3), (128, 128, 8, 3)], [((64, 64, 4, 2), (128, 64, 8, 3))]),
    (4, 32, 4096, 64): ([(64, 64, 4, 3), (128, 64, 4, 3)], [((64, 64, 4, 2), (64, 64, 4, 3)),
                                                           ((64, 64, 4, 2), (128, 64, 4, 3))]),
}  # fmt: skip


def _load_copy(label: str, src: str):
    """The `ops.launch` module of the fused_attention package under `src`, imported as its own package."""
    copy = load_package_copy(src, "fused_attention", label)
    return importlib.import_module(f"{copy.__name__}.ops.launch")


def _forward(module, tensors, slopes, spec, shape):
    """A call of `module`'s forward launcher, config pinned."""
    q, k, v = tensors[1:4]
    return lambda: module.attention_fwd(q, k, v, slopes, None, None, module.AttentionSpec(*spec),
                                        KernelConfig(*shape, True))  # fmt: skip


def _backward(module, tensors, slopes, spec, pair):
    """A call of `module`'s backward launcher, the dK/dV and dQ configs pinned."""
    dkdv, dq = (KernelConfig(*shape, True) for shape in pair)
    return lambda: module.attention_bwd(*tensors, None, slopes, None, None, module.AttentionSpec(*spec), dkdv, dq)


def main(copies) -> None:
    # name -> (launch module, with ALiBi); the package without ALiBi is the yardstick.
    variants = {"package": (launch, True), **{label: (_load_copy(label, src), True) for label, src in copies},
                "no ALiBi": (launch, False)}  # fmt: skip
    names = list(variants)
    print("| point | direction | config | " + " | ".join(f"{n} ms" for n in names) + " | "
          + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |")  # fmt: skip
    print("|---|---|---|" + "---:|" * (2 * len(names) - 1))
    for (batch, heads, seqlen, head_dim), (fwd_configs, bwd_configs) in POINTS.items():
        slopes = alibi_slopes(heads, device="cuda")
        spec, tensors = attention_problem(batch, heads, seqlen, head_dim, True, slopes)
        point = f"B{batch} H{heads} S{seqlen} D{head_dim} causal"
        cases = [(m, slopes, spec) if alibi else (m, None, spec._replace(has_alibi=False))
                 for m, alibi in variants.values()]  # fmt: skip
        rows = [("fwd", shape, [_forward(m, tensors, s, sp, shape) for m, s, sp in cases]) for shape in fwd_configs]
        rows += [("bwd", pair, [_backward(m, tensors, s, sp, pair) for m, s, sp in cases]) for pair in bwd_configs]
        for direction, config, calls in rows:
            outputs = [call() for call in calls]
            for name, output in zip(names[1:-1], outputs[1:-1]):
                first, other = outputs[0][0].float(), output[0].float()  # O, or dQ
                err = ((other - first).norm() / first.norm()).item()
                if not err < 1e-2:
                    print(f"  {name} differs from the package at {direction} {config}: {err:.2e}", flush=True)
            times = [statistics.median(t) for t in tuning.replay_rounds(calls, tuning.ROUNDS)]
            print(f"| {point} | {direction} | {config} | " + " | ".join(f"{t:.4f}" for t in times) + " | "
                  + " | ".join(f"{t / times[0]:.3f}" for t in times[1:]) + " |", flush=True)  # fmt: skip
        del tensors, rows
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main([arg.split("=", 1) for arg in sys.argv[1:]])
