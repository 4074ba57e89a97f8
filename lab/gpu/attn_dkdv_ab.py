"""A/B of fused-attention's dK/dV kernel at head dim 64, causal: the package's against a lab file.

    python3 lab/gpu/attn_dkdv_ab.py LAB_ATTENTION_BWD_PY

LAB_ATTENTION_BWD_PY is another version of kernels/attention_bwd.py, loaded as a module of the
package. For the 410M GPT's attention (B = 8, H = 16, S = 2048) and S = 4096 (B = 4), the
backward runs with each dK/dV config pinned: with the separate dQ kernel (the package's kernel),
and with the atomic dQ (the package's kernel and the lab's). Each variant keeps its own launch
plans; all are timed together by fused-gemm's tuner timer (CUDA-graph replays, interleaved
rounds, medians). The lab's gradients are checked against the package's first.
A lab tool for the GPU runs recorded in NOTES.md: it prints a table and changes nothing.
"""

from __future__ import annotations

import statistics
import sys

from attn_config_sweep import attention_problem, own_plans

from fused_attention.ops import configs, launch
from fused_attention.ops.configs import KernelConfig
from fused_gemm.ops import tuning
from lab import load_module_as

SHAPES = [(8, 16, 2048), (4, 16, 4096)]  # (B, H, S); D = 64, causal
DKDV = [KernelConfig(32, 128, 8, 2, True), KernelConfig(64, 128, 8, 2, True), KernelConfig(32, 64, 4, 2, True),
        KernelConfig(32, 128, 4, 2, True), KernelConfig(64, 64, 4, 2, True)]  # fmt: skip
DQ = KernelConfig(64, 64, 4, 3, True)


def main(lab_path: str) -> None:
    lab = load_module_as(lab_path, "fused_attention.kernels", "_lab_attention_bwd")
    kernels = {"base": configs.KERNELS["dkdv"], "lab": lab._attn_bwd_dkdv_kernel}
    shortest = configs.DQ_ATOMIC_MIN_SEQLEN_CAUSAL
    print("| B, H, S | dQ | dK/dV config | kernel | ms | TFLOP/s |")
    print("|---|---|---|---|---:|---:|")
    for batch, heads, seqlen in SHAPES:
        spec, tensors = attention_problem(batch, heads, seqlen, 64, True)
        flops = 2.5 * 4 * batch * heads * seqlen * seqlen * 64 / 2
        variants = [("kernel", "base", config) for config in DKDV[:3]]
        variants += [("atomic", name, config) for config in DKDV for name in ("base", "lab")]
        calls, reference = [], {}
        for mode, name, config in variants:

            def forced(mode=mode, name=name, config=config, tensors=tensors, spec=spec):
                configs.KERNELS["dkdv"] = kernels[name]
                configs.DQ_ATOMIC_MIN_SEQLEN_CAUSAL = 0 if mode == "atomic" else 1 << 30
                try:
                    return launch.attention_bwd(*tensors, None, None, None, None, spec, config, DQ)
                finally:
                    configs.KERNELS["dkdv"], configs.DQ_ATOMIC_MIN_SEQLEN_CAUSAL = kernels["base"], shortest

            call = own_plans(forced)
            call()  # builds the plan
            grads = call()
            if name == "base" and mode == "atomic":
                reference[config] = grads
            elif name == "lab":
                for label, ours, theirs in zip("qkv", grads, reference[config]):
                    err = ((ours.float() - theirs.float()).norm() / theirs.float().norm()).item()
                    if not err < 1e-2:
                        print(f"lab d{label} differs: {err:.2e} ({batch}, {heads}, {seqlen}) {config}", flush=True)
            calls.append(call)
        samples = tuning.replay_rounds(calls, tuning.ROUNDS)
        for (mode, name, config), times in zip(variants, samples):
            ms = statistics.median(times)
            shape = f"{config.block_m}x{config.block_n} w{config.num_warps} s{config.num_stages}"
            print(f"| {batch}, {heads}, {seqlen} | {mode} | {shape} | {name} | {ms:.4f} | {flops / ms / 1e9:.1f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
