"""A/B of the decode step's pieces, each timed cold: `calls` calls on as many different caches or
weights (more bytes than L2 holds, as in a model step), captured once in a CUDA graph.

python3 lab/gpu/decode_ab.py attention LABEL   (this PYTHONPATH's fused_attention; markdown rows)
python3 lab/gpu/decode_ab.py gateup            (the skinny gate/up forward: cuBLAS, each skinny tile, candidates)

(A streaming kernel for the skinny down projection, 1 x 5632 -> 2048, measured here on an H100:
14.6-19.3 us over five tiles against cuBLAS's 12.5; it was dropped.)

attention: batch 1, 16 query and key/value heads, D 128, bf16, cache capacity 812 with 512 keys
and one new token (the 1.4B model's decode step in decode_lab.py), rotary off and on where the
package has it, by split count; then the split kernels' registers and spills.
"""

from __future__ import annotations

import functools
import sys

import torch
import triton.testing
from tritonformer_testkit.bench import graph_replay

CALLS = 24


def cold_us(fns) -> float:
    """Microseconds per call of the fns, each called once per replay of one graph."""
    replay = graph_replay(lambda: [fn() for fn in fns])
    return triton.testing.do_bench(replay, warmup=10, rep=100, return_mode="median") * 1e3 / len(fns)


def attention(label: str) -> None:
    import inspect

    from fused_attention import flash_attention_with_kvcache
    from fused_attention.kernels import decode as kernels

    rotary = "rotary_cos" in inspect.signature(flash_attention_with_kvcache).parameters
    capacity, length, heads, dim = 812, 512, 16, 128
    caches = [torch.randn(2, 1, capacity, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(CALLS)]
    q = torch.randn(1, 1, heads, dim, device="cuda", dtype=torch.bfloat16)
    k_new, v_new = torch.randn_like(q), torch.randn_like(q)
    lengths = torch.full((1,), length, dtype=torch.int32, device="cuda")
    positions = torch.arange(capacity, device="cuda").float()
    angles = torch.outer(positions, torch.rand(dim // 2, device="cuda")).repeat(1, 2)
    cos, sin = angles.cos(), angles.sin()

    def call(cache, splits, extra):
        return flash_attention_with_kvcache(q, cache[0], cache[1], lengths, k_new, v_new, num_splits=splits, **extra)

    for use_rotary in (False, True) if rotary else (False,):
        extra = dict(rotary_cos=cos, rotary_sin=sin) if use_rotary else {}
        for splits in (0, 1, 4, 7, 13):
            us = cold_us([functools.partial(call, c, splits, extra) for c in caches])
            print(f"| {label} | {'on' if use_rotary else 'off'} | {splits or 'auto'} | {us:.2f} |", flush=True)
    for device_cache in getattr(kernels._decode_split_kernel, "device_caches", {}).values():
        for compiled in device_cache[0].values():
            meta = compiled.metadata
            print(f"{label} split kernel: regs {compiled.n_regs} spills {compiled.n_spills} warps {meta.num_warps} "
                  f"stages {meta.num_stages} shared {meta.shared}")  # fmt: skip


# Candidate skinny forward tiles beside the package's: (BLOCK_N, BLOCK_K, warps, stages).
GATEUP_CANDIDATES = [(16, 128, 4, 4), (16, 128, 4, 6), (16, 64, 4, 8), (32, 64, 4, 6), (16, 256, 4, 3), (16, 128, 2, 4)]


def gateup() -> None:
    """x (1, 2048) @ [w_gate | w_up] (2048, 5632) and the activation, the 1.4B model's decode MLP."""
    import triton as _triton

    from fused_swiglu import swiglu
    from fused_swiglu.kernels import forward
    from fused_swiglu.ops import launchers

    x = torch.randn(1, 2048, device="cuda", dtype=torch.bfloat16)
    weights = [
        [torch.randn(2048, 5632, device="cuda", dtype=torch.bfloat16) / 45 for _ in range(2)] for _ in range(CALLS)
    ]
    cublas = cold_us([lambda w=w: torch.nn.functional.silu(x @ w[0]) * (x @ w[1]) for w in weights])
    print(f"| cuBLAS (two products, unfused activation) | {cublas:.2f} |")
    kernel = forward._swiglu_fwd_kernel
    configs = list(kernel.configs)
    skinny = [c for c in configs if c.kwargs["BLOCK_M"] == 16]
    extra = [
        _triton.Config(dict(BLOCK_M=16, BLOCK_N=n, BLOCK_K=k, GROUP_M=8), num_warps=w, num_stages=s)
        for n, k, w, s in GATEUP_CANDIDATES
    ]
    for config in skinny + extra:
        kernel.configs = [config]
        launchers.clear_plans()
        with torch.no_grad():
            us = cold_us([lambda w=w: swiglu(x, w[0], w[1]) for w in weights])
        print(f"| {config} | {us:.2f} |", flush=True)
    kernel.configs = configs


if __name__ == "__main__":
    if sys.argv[1] == "attention":
        attention(sys.argv[2])
    else:
        gateup()
