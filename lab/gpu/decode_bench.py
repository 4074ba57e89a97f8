"""Decode attention at batch 1: flash_attention_with_kvcache against SDPA over the same caches.

    python3 lab/gpu/decode_bench.py           (on a GPU; markdown on stdout)
    python3 lab/gpu/decode_bench.py sweep     (the same, over split counts and split-kernel tiles)

One query token, D = 128, 32 query heads over 8 KV heads (GQA 4:1), bf16, cache lengths 4096 to
32768. Bytes: the K and V cache rows read (2 * L * H_kv * D * 2). Each provider's calls cycle over
enough cache copies (>= 256 MB) that none stays in the L2 cache from one call to the next, as in
a decode step, where 24 layers' caches and the weights pass between two calls of one layer.

Columns: kernel time (calls replayed from one CUDA graph, no host time) with its GB/s and its
fraction of the copy ceiling measured in the same run (a 256 MB device-to-device copy, bytes read
plus written); then the eager call as a user makes it (do_bench median, L2 flushed). The GPU is
kept busy for a second first so that its clocks have risen before the first row.
"""

from __future__ import annotations

import functools
import itertools
import sys

import torch
import torch.nn.functional as F
import triton.testing
from gemv_sweep import graph_us

from fused_attention import flash_attention_with_kvcache
from fused_attention.ops import decode as decode_ops

B, H, H_KV, D = 1, 32, 8, 128
LENGTHS = (4096, 8192, 16384, 32768)
COLD_BYTES = 256 << 20


def warm_clocks(seconds: float = 1.0) -> None:
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    while True:
        for _ in range(20):
            a @ a
        end.record()
        end.synchronize()
        if start.elapsed_time(end) > seconds * 1e3:
            return


def copy_ceiling_gbps() -> float:
    src = torch.empty(COLD_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = graph_us([functools.partial(dst.copy_, src)] * 4)
    return 2 * COLD_BYTES / us / 1e3


def problems(length: int):
    """[(q, k_cache, v_cache, seqlens)] copies whose caches total at least COLD_BYTES."""
    cache_bytes = 2 * B * length * H_KV * D * 2
    copies = max(2, -(-COLD_BYTES // cache_bytes))
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((B,), length, dtype=torch.int32, device="cuda")
    out = []
    for _ in range(copies):
        k_cache = torch.randn(B, length, H_KV, D, device="cuda", dtype=torch.bfloat16)
        out.append((q, k_cache, torch.randn_like(k_cache), seqlens))
    return out, cache_bytes


def sdpa_call(q, k_cache, v_cache, seqlens):
    # SDPA over the same cache, its GQA heads shared without copies (enable_gqa).
    return F.scaled_dot_product_attention(
        q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), enable_gqa=True
    ).transpose(1, 2)


def cold_us(fn, cases) -> float:
    calls = [functools.partial(fn, *case) for case in cases]
    return graph_us(calls * max(1, 16 // len(calls)))


def eager_us(fn, case) -> float:
    return triton.testing.do_bench(functools.partial(fn, *case), warmup=25, rep=100, return_mode="median") * 1e3


def table() -> None:
    warm_clocks()
    ceiling = copy_ceiling_gbps()
    print(f"Copy ceiling (256 MB device-to-device, read + write): {ceiling:.0f} GB/s\n")
    print("| cache length | ours us | GB/s | of ceiling | SDPA us | SDPA GB/s | SDPA / ours | ours eager us | "
          "SDPA eager us | SDPA / ours eager |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for length in LENGTHS:
        cases, nbytes = problems(length)
        torch.testing.assert_close(flash_attention_with_kvcache(*cases[0]), sdpa_call(*cases[0]), atol=2e-2, rtol=2e-2)
        ours = cold_us(flash_attention_with_kvcache, cases)
        sdpa = cold_us(sdpa_call, cases)
        ours_e = eager_us(flash_attention_with_kvcache, cases[0])
        sdpa_e = eager_us(sdpa_call, cases[0])
        gbps = nbytes / ours / 1e3
        print(f"| {length} | {ours:.1f} | {gbps:.0f} | {gbps / ceiling:.2f} | {sdpa:.1f} | {nbytes / sdpa / 1e3:.0f} | "
              f"{sdpa / ours:.2f} | {ours_e:.1f} | {sdpa_e:.1f} | {sdpa_e / ours_e:.2f} |", flush=True)  # fmt: skip


def sweep() -> None:
    """Split counts x (BLOCK_N, num_stages) of the split kernel (4 warps), kernel time as above."""
    original_sizes, original_launch = decode_ops.block_sizes, decode_ops.Launch
    warm_clocks()
    print("| cache length | splits | BLOCK_N s | us | GB/s |")
    print("|---:|---:|---|---:|---:|")
    for length in LENGTHS:
        cases, nbytes = problems(length)
        reference = sdpa_call(*cases[0])
        variants = [(0, None, None)] + list(itertools.product((8, 16, 32, 48, 64), (32, 64, 128), (2, 3, 4)))
        for splits, bn, stages in variants:
            decode_ops._plan.cache_clear()
            if bn is None:
                decode_ops.block_sizes, decode_ops.Launch = original_sizes, original_launch
            else:
                decode_ops.block_sizes = lambda spec, bn=bn: (16, bn)

                def patched(kernel, grid, stages=stages, **kw):
                    if kernel is decode_ops._decode_split_kernel:
                        kw.update(num_stages=stages)
                    return original_launch(kernel, grid, **kw)

                decode_ops.Launch = patched
            fn = functools.partial(flash_attention_with_kvcache, num_splits=splits)
            name = "default" if bn is None else f"{bn} s{stages}"
            try:
                torch.testing.assert_close(fn(*cases[0]), reference, atol=2e-2, rtol=2e-2)
                us = cold_us(fn, cases)
                print(f"| {length} | {splits or 'auto'} | {name} | {us:.1f} | {nbytes / us / 1e3:.0f} |", flush=True)
            except Exception as error:  # a config that does not compile must not lose the table
                print(f"| {length} | {splits or 'auto'} | {name} | failed {type(error).__name__} | |", flush=True)
    decode_ops.block_sizes, decode_ops.Launch = original_sizes, original_launch
    decode_ops._plan.cache_clear()


if __name__ == "__main__":
    sweep() if sys.argv[1:] == ["sweep"] else table()
