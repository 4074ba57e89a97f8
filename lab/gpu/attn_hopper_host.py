# ruff: noqa: B023
"""Host cost of fused-attention's eager forward+backward with the Hopper dK/dV kernel and with the
portable one, at tiny and real sizes.

    python3 lab/gpu/attn_hopper_host.py

Per shape and variant: wall
microseconds per flash_attention forward + autograd.grad call over back-to-back calls (at tiny
sizes the host is the bottleneck, so this is the host cost), and do_bench's median. A lab tool
for the GPU runs recorded in NOTES.md: it prints a table and changes nothing.
"""

from __future__ import annotations

import time

import torch
from triton.testing import do_bench

from fused_attention import flash_attention
from fused_attention.ops import launch

SHAPES = [(1, 128, 8, 64), (1, 128, 8, 128), (4, 512, 16, 128), (8, 2048, 16, 128)]  # (B, S, H, D), causal


def main() -> None:
    print("| B, S, H, D | variant | wall us per fwd+bwd call | do_bench ms |")
    print("|---|---|---:|---:|")
    for batch, seqlen, heads, dim in SHAPES:
        q, k, v, do = (torch.randn(batch, seqlen, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)

        def call():
            return torch.autograd.grad(flash_attention(q, k, v, causal=True), (q, k, v), do)

        for name, hopper in (("portable", False), ("hopper", True), ("portable", False), ("hopper", True)):
            launch.HOPPER_DKDV = hopper
            launch.clear_plans()
            for _ in range(30):
                call()
            torch.cuda.synchronize()
            calls = 300 if seqlen <= 512 else 30
            start = time.perf_counter()
            for _ in range(calls):
                call()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / calls * 1e6
            ms = do_bench(call, warmup=10, rep=50, return_mode="median")
            print(f"| {batch}, {seqlen}, {heads}, {dim} | {name} | {wall:.1f} | {ms:.4f} |", flush=True)
    launch.HOPPER_DKDV = True


if __name__ == "__main__":
    main()
