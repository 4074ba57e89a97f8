"""Which dQ path should fused-attention's backward take at head dim 64: atomics or the dQ kernel?

    python3 lab/gpu/attn_dq_policy.py

For the FlashAttention benchmark grid at D = 64 (hidden 2048: H = 32; 16k tokens: B = 16384 / S),
causal and not, S = 2048 .. 16384, the backward runs as users get it (configs autotuned), once
with the dQ accumulated by atomics in the dK/dV kernel and once with the separate dQ kernel
(configs.dq_atomic's thresholds forced either way). Each variant keeps its own launch plans; all
of one shape are timed together by fused-gemm's tuner timer (CUDA-graph replays, interleaved
rounds, medians). A lab tool for the GPU runs recorded in NOTES.md: it prints a table and
changes nothing.
"""

from __future__ import annotations

import statistics

import torch
from attn_config_sweep import attention_problem, own_plans

from fused_attention.ops import configs, launch
from fused_gemm.ops import tuning

LENGTHS = [2048, 4096, 8192, 16384]
HEADS, HEAD_DIM, TOKENS = 32, 64, 16384


def _backward(spec, tensors, atomic: bool):
    """A call of the backward with the dQ path forced, in its own launch plans."""
    thresholds = configs.DQ_ATOMIC_MIN_SEQLEN, configs.DQ_ATOMIC_MIN_SEQLEN_CAUSAL

    def call():
        configs.DQ_ATOMIC_MIN_SEQLEN = configs.DQ_ATOMIC_MIN_SEQLEN_CAUSAL = 0 if atomic else 1 << 30
        try:
            return launch.attention_bwd(*tensors, None, None, None, None, spec)
        finally:
            configs.DQ_ATOMIC_MIN_SEQLEN, configs.DQ_ATOMIC_MIN_SEQLEN_CAUSAL = thresholds

    return own_plans(call)


def main() -> None:
    print("| S | mask | atomics ms | dQ kernel ms | atomics / dQ kernel | shipped path |")
    print("|---:|---|---:|---:|---:|---|")
    for seqlen in LENGTHS:
        batch = TOKENS // seqlen
        for causal in (True, False):
            spec, tensors = attention_problem(batch, HEADS, seqlen, HEAD_DIM, causal)
            calls = [_backward(spec, tensors, atomic) for atomic in (True, False)]
            grads = [call() for call in calls]  # builds each plan (autotuning its configs)
            grads = [call() for call in calls]
            for label, ours, theirs in zip("qkv", *grads):
                err = ((ours.float() - theirs.float()).norm() / theirs.float().norm()).item()
                if not err < 1e-2:
                    print(f"d{label} of the two paths differ: {err:.2e}", flush=True)
            atomic_ms, kernel_ms = (statistics.median(t) for t in tuning.replay_rounds(calls, tuning.ROUNDS))
            shipped = configs.dq_atomic(HEAD_DIM, False, seqlen, causal, batch * HEADS * -(-seqlen // 128), 1, 132)
            print(f"| {seqlen} | {'causal' if causal else 'full'} | {atomic_ms:.4f} | {kernel_ms:.4f} | "
                  f"{atomic_ms / kernel_ms:.3f} | {'atomics' if shipped else 'dQ kernel'} |", flush=True)  # fmt: skip
            del tensors, grads, calls
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
