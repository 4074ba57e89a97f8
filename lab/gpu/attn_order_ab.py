# ruff: noqa: B023
"""A/B of fused-attention's kernels against lab versions of their files, configs pinned.

    python3 lab/gpu/attn_order_ab.py LAB_ATTENTION_FWD_PY LAB_ATTENTION_BWD_PY

The lab files replace kernels/attention_fwd.py and kernels/attention_bwd.py (loaded as modules of
the package). Per shape (MHA and GQA, causal and full), the forward and the backward of each
variant run with the shipped configs pinned, each with launch plans of its own (own_plans); outputs are
compared (the lab versions here change only the order of programs, so they must match exactly),
then all calls are timed together by fused-gemm's tuner timer (CUDA-graph replays, interleaved
rounds, medians). A lab tool for the GPU runs recorded in NOTES.md: it prints a table and changes
nothing.
"""

from __future__ import annotations

import functools
import statistics
import sys

import torch
from attn_config_sweep import own_plans

from fused_attention.ops import configs, launch
from fused_attention.ops.configs import KernelConfig
from fused_gemm.ops import tuning
from lab import load_module_as

SHAPES = [  # (B, H, H_kv, S, D, causal)
    (4, 16, 4, 2048, 128, True),
    (4, 16, 16, 2048, 128, True),
    (8, 16, 16, 2048, 64, True),
    (16, 16, 16, 1024, 128, True),
    (4, 16, 16, 4096, 128, False),
]
C = KernelConfig


PINNED = {  # per D: fwd, dK/dV, dQ (the shipped first candidates, or the autotuner's usual pick)
    128: (C(128, 128, 8, 3, True), C(64, 64, 4, 2, True), C(128, 64, 8, 3, True)),
    64: (C(128, 128, 8, 3, True), C(32, 128, 4, 2, True), C(64, 64, 4, 3, True)),
}


def main(fwd_path: str, bwd_path: str) -> None:
    fwd_lab = load_module_as(fwd_path, "fused_attention.kernels", "_lab_attention_fwd")
    bwd_lab = load_module_as(bwd_path, "fused_attention.kernels", "_lab_attention_bwd")
    kernels = {
        "base": dict(configs.KERNELS),
        "lab": {"fwd": fwd_lab._attn_fwd_kernel, "dkdv": bwd_lab._attn_bwd_dkdv_kernel,
                "dq": bwd_lab._attn_bwd_dq_kernel},
    }  # fmt: skip
    print("| B, H, H_kv, S, D, mask | pass | variant | ms | TFLOP/s | lab / base |")
    print("|---|---|---|---:|---:|---:|")
    for batch, heads, kv_heads, seqlen, dim, causal in SHAPES:
        torch.manual_seed(0)
        q, do = (torch.randn(batch, seqlen, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(batch, seqlen, kv_heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        spec = launch.AttentionSpec(batch, heads, kv_heads, dim, seqlen, seqlen, dim**-0.5, -1,
                                    0 if causal else -1, False, False, False)  # fmt: skip
        fwd_config, dkdv_config, dq_config = PINNED[dim]
        o, lse = launch.attention_fwd(q, k, v, None, None, None, spec, fwd_config)
        flops = 4 * batch * heads * seqlen * seqlen * dim * (0.5 if causal else 1.0)
        calls, labels, outputs = [], [], {}
        for name in ("base", "lab"):

            def forced(fn, name=name):
                def call():
                    saved = dict(configs.KERNELS)
                    configs.KERNELS.update(kernels[name])
                    try:
                        return fn()
                    finally:
                        configs.KERNELS.update(saved)

                return own_plans(call)

            fwd = forced(functools.partial(launch.attention_fwd, q, k, v, None, None, None, spec, fwd_config))
            bwd = forced(functools.partial(launch.attention_bwd, do, q, k, v, o, lse, None, None, None, None, spec,
                                           dkdv_config, dq_config))  # fmt: skip
            outputs[name] = (*fwd(), *bwd())
            calls += [fwd, bwd]
            labels += [(name, "fwd", flops), (name, "bwd", 2.5 * flops)]
        for index, (base, lab) in enumerate(zip(outputs["base"], outputs["lab"])):
            if not torch.equal(base, lab):
                print(f"lab output {index} differs: {(base.float() - lab.float()).abs().max().item():.3e}")
        samples = [statistics.median(t) for t in tuning.replay_rounds(calls, tuning.ROUNDS)]
        shape = f"{batch}, {heads}, {kv_heads}, {seqlen}, {dim}, {'causal' if causal else 'full'}"
        for index, ((name, kind, work), ms) in enumerate(zip(labels, samples)):
            ratio = f"{samples[index - 2] / ms:.3f}" if name == "lab" else ""
            print(f"| {shape} | {kind} | {name} | {ms:.4f} | {work / ms / 1e9:.1f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
