"""Sweep of block shapes for fused-attention's kernels (forward, dK/dV and dQ), one kernel at a time.

    python3 lab/gpu/attn_config_sweep.py [fwd]

The backward's default path (the dK/dV kernel without atomics, then the dQ kernel) at the model
shapes (GPT-2 410M: D = 64, H = 16; LLaMA 1.4B: D = 128, H = 16; both B = 8, S = 2048, causal)
and at the benchmark grid's S = 4096 points. For each shape, each dK/dV candidate runs pinned with
the dQ kernel at its first shipped candidate, then each dQ candidate with the fastest dK/dV one;
every row of a sweep is timed together by fused-gemm's tuner timer (CUDA-graph replays,
interleaved rounds, medians). With `fwd`, the forward's candidates instead, at the same shapes.
Configs that do not fit the GPU are listed as such. Shipped candidates are marked. A lab tool for
the GPU runs recorded in NOTES.md: it prints tables and changes nothing.
"""

from __future__ import annotations

import functools
import statistics
import sys

import torch

from fused_attention.ops import configs, launch
from fused_attention.ops.configs import KernelConfig
from fused_gemm.ops import tuning

# (B, H, S, D, causal)
SHAPES = [(8, 16, 2048, 64, True), (4, 32, 4096, 64, True), (8, 16, 2048, 128, True), (4, 16, 4096, 128, False)]
SWEEP = {
    ("dkdv", 64): [(16, 128, 4, 2), (32, 128, 4, 2), (32, 128, 4, 3), (32, 128, 8, 2), (32, 128, 8, 3), (64, 128, 8, 2),
                   (64, 128, 8, 3), (64, 128, 4, 2), (32, 64, 4, 2), (32, 64, 4, 3), (64, 64, 4, 2), (64, 64, 4, 3),
                   (64, 64, 8, 2), (128, 64, 8, 2), (128, 128, 8, 2)],
    ("dkdv", 128): [(32, 64, 4, 2), (32, 64, 4, 3), (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 8, 2), (32, 128, 8, 2),
                    (64, 128, 8, 2), (64, 128, 8, 3), (16, 128, 8, 2), (128, 64, 8, 2), (16, 64, 4, 2)],
    ("dq", 64): [(64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 4, 3),
                 (64, 32, 4, 3), (64, 128, 4, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 128, 8, 3), (128, 32, 4, 3)],
    ("fwd", 64): [(128, 128, 8, 3), (128, 128, 8, 2), (128, 128, 8, 4), (128, 64, 8, 3), (128, 64, 8, 2),
                  (128, 64, 8, 4), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (64, 128, 4, 2), (128, 64, 4, 3),
                  (64, 32, 4, 3), (128, 32, 8, 3)],
    ("fwd", 128): [(128, 128, 8, 3), (128, 128, 8, 2), (128, 128, 8, 4), (128, 64, 8, 3), (128, 64, 8, 2),
                   (128, 64, 8, 4), (64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (128, 32, 8, 3), (64, 32, 4, 3)],
    ("dq", 128): [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 2), (64, 64, 4, 3), (128, 32, 8, 3), (64, 128, 8, 2),
                  (128, 128, 8, 2), (64, 32, 4, 3), (128, 64, 4, 2)],
}  # fmt: skip


def own_plans(fn):
    """fn wrapped to run with launch plans of its own: ops.launch's plan caches (layout_plan,
    _backward_plan) swapped for fresh ones around each call, so that a call made with other kernels
    or another dQ policy never reuses a plan built for the package's (a plan holds its launches)."""
    caches = {
        name: functools.lru_cache(maxsize=None)(getattr(launch, name).__wrapped__)
        for name in ("layout_plan", "_backward_plan")
    }

    def call():
        saved = {name: getattr(launch, name) for name in caches}
        for name, cache in caches.items():
            setattr(launch, name, cache)
        try:
            return fn()
        finally:
            for name, cache in saved.items():
                setattr(launch, name, cache)

    return call


def attention_problem(batch, heads, seqlen, head_dim, causal, alibi_slopes=None):
    """(spec, (dO, Q, K, V, O, LSE)) of a dense bf16 attention, the forward run by the package;
    ALiBi with `alibi_slopes` when given."""
    q, k, v, do = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))  # fmt: skip
    spec = launch.AttentionSpec(batch, heads, heads, head_dim, seqlen, seqlen, head_dim**-0.5, -1,
                                0 if causal else -1, alibi_slopes is not None, False, False)  # fmt: skip
    o, lse = launch.attention_fwd(q, k, v, alibi_slopes, None, None, spec)
    return spec, (do, q, k, v, o, lse)


def _timed(label, candidates, call_of):
    """(config, ms) for each candidate shape that fits, fastest first: call_of(config) runs it."""
    calls, usable = [], []
    for shape in candidates:
        config = KernelConfig(*shape, True)
        call = call_of(config)
        try:
            call()
            call()
        except Exception as error:  # a config that does not fit (shared memory, registers)
            print(f"  {label} {shape}: {type(error).__name__}", flush=True)
            continue
        calls.append(call)
        usable.append(config)
    samples = tuning.replay_rounds(calls, tuning.ROUNDS)
    return sorted(zip(usable, (statistics.median(t) for t in samples)), key=lambda row: row[1])


def _sweep(spec, tensors, kind, candidates, partner):
    """_timed for the backward's `kind` kernel, the other one pinned to `partner`."""

    def call_of(config):
        dkdv, dq = (config, partner) if kind == "dkdv" else (partner, config)
        return own_plans(lambda: launch.attention_bwd(*tensors, None, None, None, None, spec, dkdv, dq))

    return _timed(kind, candidates, call_of)


def _sweep_forward(spec, tensors, candidates):
    """_timed for the forward kernel."""
    _, q, k, v, _, _ = tensors
    return _timed(
        "fwd",
        candidates,
        lambda config: own_plans(lambda: launch.attention_fwd(q, k, v, None, None, None, spec, config)),
    )


def main(forward: bool) -> None:
    for batch, heads, seqlen, head_dim, causal in SHAPES:
        spec, tensors = attention_problem(batch, heads, seqlen, head_dim, causal)
        flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
        kinds = ("fwd",) if forward else ("dkdv", "dq")
        shipped = {kind: configs.TMA_CONFIGS[kind][head_dim] for kind in kinds}
        label = f"B{batch} H{heads} S{seqlen} D{head_dim} {'causal' if causal else 'full'}"
        if forward:
            tables = [("fwd", _sweep_forward(spec, tensors, SWEEP[("fwd", head_dim)]))]
        else:
            flops *= 2.5
            dkdv_rows = _sweep(spec, tensors, "dkdv", SWEEP[("dkdv", head_dim)], configs.TMA_CONFIGS["dq"][head_dim][0])
            dq_rows = _sweep(spec, tensors, "dq", SWEEP[("dq", head_dim)], dkdv_rows[0][0])
            tables = [("dkdv", dkdv_rows), ("dq", dq_rows)]
        print(f"\n{label}: {'forward' if forward else 'backward'} ms (TFLOP/s); * = a shipped candidate")
        print("| kernel | config (BMxBN w s) | ms | TFLOP/s |")
        print("|---|---|---:|---:|")
        for kind, rows in tables:
            for config, ms in rows:
                mark = "*" if config in shipped[kind] else ""
                name = f"{config.block_m}x{config.block_n} w{config.num_warps} s{config.num_stages}{mark}"
                print(f"| {kind} | {name} | {ms:.4f} | {flops / ms / 1e9:.1f} |", flush=True)
        del tensors
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:] == ["fwd"])
