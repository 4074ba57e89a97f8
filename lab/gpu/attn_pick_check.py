"""Does Triton's autotuner pick fused-attention's fastest config? Fresh tunings against pinned timings.

    python3 lab/gpu/attn_pick_check.py

At the model shapes and two benchmark points, each of the three kernels is tuned TUNINGS times from
scratch (autotuners and launch plans dropped in between; the autotuner times each candidate alone,
one after another, as users get it), and its picks are printed. Then every candidate of that
kernel runs pinned (the other kernels at their first candidate) and all are timed together by
fused-gemm's tuner timer (CUDA-graph replays, interleaved rounds, medians), so each pick can be
set against the fastest. A lab tool for the GPU runs recorded in NOTES.md: it prints a table and
changes nothing.
"""

from __future__ import annotations

import collections
import statistics

import torch
from attn_config_sweep import attention_problem, own_plans

from fused_attention.ops import configs, launch
from fused_gemm.ops import tuning

# (B, H, S, D, causal)
SHAPES = [(8, 16, 2048, 64, True), (4, 32, 4096, 64, True), (8, 16, 2048, 128, True), (4, 16, 4096, 128, False)]
TUNINGS = 3


def _pinned(spec, tensors, kind, config, first):
    """A call of the forward or the backward with `kind` pinned to config (the other backward
    kernel at its first candidate), in launch plans of its own."""
    do, q, k, v, o, lse = tensors
    if kind == "fwd":
        return own_plans(lambda: launch.attention_fwd(q, k, v, None, None, None, spec, config))
    dkdv = config if kind == "dkdv" else first["dkdv"]
    dq = config if kind == "dq" else first["dq"]
    return own_plans(lambda: launch.attention_bwd(do, q, k, v, o, lse, None, None, None, None, spec, dkdv, dq))


def _name(config) -> str:
    return f"{config.block_m}x{config.block_n} w{config.num_warps} s{config.num_stages}"


def main() -> None:
    print(f"| shape | kernel | picks (of {TUNINGS} tunings) | fastest pinned (ms) | each pick's time / fastest |")
    print("|---|---|---|---|---|")
    for batch, heads, seqlen, head_dim, causal in SHAPES:
        spec, tensors = attention_problem(batch, heads, seqlen, head_dim, causal)
        do, q, k, v, _, _ = tensors
        seq_class = configs.length_class(seqlen)
        picks = collections.defaultdict(list)
        for _ in range(TUNINGS):
            configs.autotuned_kernel.cache_clear()
            launch.clear_plans()
            out, lse_tuned = launch.attention_fwd(q, k, v, None, None, None, spec)
            launch.attention_bwd(do, q, k, v, out, lse_tuned, None, None, None, None, spec)
            for kind in ("fwd", "dkdv", "dq"):
                tuner = configs.autotuned_kernel(kind, head_dim, True, seq_class)
                if getattr(tuner, "best_config", None) is not None:
                    picks[kind].append(configs.config_of(tuner.best_config))
        first = {kind: configs.candidate_configs(kind, head_dim, True)[0] for kind in ("dkdv", "dq")}
        label = f"B{batch} H{heads} S{seqlen} D{head_dim} {'causal' if causal else 'full'}"
        for kind in ("fwd", "dkdv", "dq"):
            candidates = configs.candidate_configs(kind, head_dim, True)
            calls = [_pinned(spec, tensors, kind, config, first) for config in candidates]
            for call in calls:
                call()
            ms = [statistics.median(t) for t in tuning.replay_rounds(calls, tuning.ROUNDS)]
            best = min(ms)
            timed = dict(zip(candidates, ms))
            fastest = candidates[ms.index(best)]
            ratios = ", ".join(f"{timed[c] / best:.3f}" for c in picks[kind]) or "-"
            chosen = ", ".join(_name(c) for c in picks[kind]) or "(one candidate: not tuned)"
            print(f"| {label} | {kind} | {chosen} | {_name(fastest)} ({best:.4f}) | {ratios} |", flush=True)
        del q, k, v, do, tensors
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
