"""Where one call's time goes on the GPU: per-kernel device time (profiler) and the host's Python hot spots.

    python3 lab/gpu/profile_calls.py NAME...      (names: see CASES)

A lab tool for the GPU runs recorded in NOTES.md; prints tables, changes nothing.
"""

from __future__ import annotations

import cProfile
import pathlib
import pstats
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def _swiglu_mlp():
    from fused_swiglu import swiglu_mlp

    def weight(*shape):
        return (torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_(True)

    x = torch.randn(16384, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w_gate, w_up, w_down = weight(2048, 5632), weight(2048, 5632), weight(5632, 2048)
    dy = torch.randn(16384, 2048, device="cuda", dtype=torch.bfloat16)
    return lambda: torch.autograd.grad(swiglu_mlp(x, w_gate, w_up, w_down), (x, w_gate, w_up, w_down), dy)


def _rope_qk():
    from fused_rope import RotaryEmbedding, apply_rotary_qk

    q = torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cos, sin = RotaryEmbedding(128).to("cuda").cos_sin(4096)
    dq, dk = torch.randn_like(q), torch.randn_like(k)

    def call():
        qo, ko = apply_rotary_qk(q, k, cos, sin)
        return torch.autograd.grad((qo, ko), (q, k), (dq, dk))

    return call


CASES = {"swiglu_mlp": _swiglu_mlp, "rope_qk": _rope_qk}


def main(names):
    for name in names:
        fn = CASES[name]()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        print(f"== {name}: device time per kernel (5 calls)")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
        print(f"== {name}: host hot spots (20 calls)")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    # Run from a checkout without installing: the packages' sources first on the path.
    sys.path[:0] = [str(p) for p in sorted(pathlib.Path(__file__).resolve().parents[2].glob("packages/*/src"))]
    main(sys.argv[1:])
