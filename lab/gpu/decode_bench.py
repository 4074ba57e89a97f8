"""Decode attention at batch 1: flash_attention_with_kvcache against SDPA over the same cache.

python lab/gpu/decode_bench.py   (on a GPU; prints a markdown table)

One query token, D = 128, 32 query heads over 8 KV heads (GQA 4:1), bf16, cache lengths 4096 to
32768. Bytes: the K and V cache rows read (2 * L * H_kv * D * 2), against the copy ceiling.
"""

import functools

import torch
import torch.nn.functional as F
import triton.testing

from fused_attention import flash_attention_with_kvcache

B, H, H_KV, D = 1, 32, 8, 128


def main() -> None:
    print("| cache length | ours ms | GB/s | SDPA ms | SDPA / ours |")
    print("|---:|---:|---:|---:|---:|")
    for length in (4096, 8192, 16384, 32768):
        k_cache = torch.randn(B, length, H_KV, D, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
        seqlens = torch.full((B,), length, dtype=torch.int32, device="cuda")
        ours = functools.partial(flash_attention_with_kvcache, q, k_cache, v_cache, seqlens)
        # SDPA over the same cache, its GQA heads shared without copies (enable_gqa).
        sdpa = functools.partial(
            F.scaled_dot_product_attention,
            q.transpose(1, 2),
            k_cache.transpose(1, 2),
            v_cache.transpose(1, 2),
            enable_gqa=True,
        )
        reference = sdpa().transpose(1, 2)
        torch.testing.assert_close(ours(), reference, atol=2e-2, rtol=2e-2)
        ms = triton.testing.do_bench(ours, warmup=25, rep=100, return_mode="median")
        ms_sdpa = triton.testing.do_bench(sdpa, warmup=25, rep=100, return_mode="median")
        gbps = 2 * length * H_KV * D * 2 / ms / 1e6
        print(f"| {length} | {ms:.4f} | {gbps:.0f} | {ms_sdpa:.4f} | {ms_sdpa / ms:.2f} |")


if __name__ == "__main__":
    main()
