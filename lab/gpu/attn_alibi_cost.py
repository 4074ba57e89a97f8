"""What ALiBi costs fused-attention's kernels: each direction with and without ALiBi, as users get it.

    python3 lab/gpu/attn_alibi_cost.py

At the benchmark's ALiBi point (D = 128, H = 16, B = 4, S = 4096, causal) and beside it (D = 64,
H = 32; D = 128 without a mask), the forward and the backward run autotuned, once with the
standard geometric slopes and once without ALiBi; the pair of one direction is timed together by
fused-gemm's tuner timer (CUDA-graph replays, interleaved rounds, medians). Run it on two versions
of the package (PYTHONPATH) on one warm machine to A/B a change of the ALiBi code: the plain rows
are the yardstick that does not move. A lab tool for the GPU runs recorded in NOTES.md: it prints
a table and changes nothing.
"""

from __future__ import annotations

import statistics

import torch
from attn_config_sweep import attention_problem

from fused_attention import alibi_slopes
from fused_attention.ops import launch
from fused_gemm.ops import tuning

# (B, H, S, D, causal)
SHAPES = [(4, 16, 4096, 128, True), (4, 32, 4096, 64, True), (4, 16, 4096, 128, False)]


def main() -> None:
    print("| shape | direction | plain ms | ALiBi ms | ALiBi TFLOP/s | ALiBi / plain time |")
    print("|---|---|---:|---:|---:|---:|")
    for batch, heads, seqlen, head_dim, causal in SHAPES:
        slopes = alibi_slopes(heads, device="cuda")
        problems = [attention_problem(batch, heads, seqlen, head_dim, causal, s) for s in (None, slopes)]
        flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
        forwards = [
            lambda spec=spec, t=t, s=s: launch.attention_fwd(t[1], t[2], t[3], s, None, None, spec)
            for (spec, t), s in zip(problems, (None, slopes))
        ]
        backwards = [
            lambda spec=spec, t=t, s=s: launch.attention_bwd(*t, None, s, None, None, spec)
            for (spec, t), s in zip(problems, (None, slopes))
        ]
        label = f"B{batch} H{heads} S{seqlen} D{head_dim} {'causal' if causal else 'full'}"
        for direction, calls, scale in (("fwd", forwards, 1.0), ("bwd", backwards, 2.5)):
            for call in calls:
                call()  # autotunes its plan
            plain_ms, alibi_ms = (statistics.median(t) for t in tuning.replay_rounds(calls, tuning.ROUNDS))
            print(f"| {label} | {direction} | {plain_ms:.4f} | {alibi_ms:.4f} | {scale * flops / alibi_ms / 1e9:.1f} | "
                  f"{alibi_ms / plain_ms:.3f} |", flush=True)  # fmt: skip
        launch.clear_plans()
        del problems, forwards, backwards
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
