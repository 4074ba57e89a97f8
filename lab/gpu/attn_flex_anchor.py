"""Which flex_attention set-up is the ALiBi anchor of fused-attention's benchmark?

    python3 lab/gpu/attn_flex_anchor.py

The issue's ALiBi anchor is "flex_attention (compiled) with an ALiBi score_mod", measured by its
author at 208 / 182 TFLOP/s (fwd / fwd+bwd, D = 128, S = 4096, causal) on an H100; the
benchmark's set-up (causal as a block mask, ALiBi as a score_mod) measures 328 / 337 here. This
tool times the ways a user may write that anchor, side by side with fused-attention, at that point
(B = 4, H = 16, bf16): the causal mask as a block mask or inside the score_mod, the slopes from a
tensor or computed in the score_mod, and flex's plain causal for scale. Timing: triton's do_bench
medians; flops = 2 * B * H * S^2 * D (causal), fwd+bwd 3.5x. A lab tool for the GPU runs recorded
in NOTES.md: it prints a table and changes nothing.
"""

from __future__ import annotations

import torch
from torch.nn.attention import flex_attention as flex
from triton.testing import do_bench

from fused_attention import alibi_slopes, flash_attention

BATCH, HEADS, SEQLEN, HEAD_DIM = 4, 16, 4096, 128


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _variants():
    """name -> attention(q, k, v) on (B, H, S, D) tensors."""
    slopes = alibi_slopes(HEADS, device="cuda")
    compiled = torch.compile(flex.flex_attention, dynamic=False)
    causal_blocks = flex.create_block_mask(_causal, None, None, SEQLEN, SEQLEN, device="cuda")

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    def alibi_computed_slope(score, b, h, q_idx, kv_idx):
        slope = torch.exp2(-8.0 * (h + 1) / HEADS)
        return score - slope * (q_idx - kv_idx)

    def alibi_and_causal(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score - slopes[h] * (q_idx - kv_idx), -float("inf"))

    return {
        "block mask + ALiBi score_mod (the benchmark's)": lambda q, k, v: compiled(
            q, k, v, score_mod=alibi, block_mask=causal_blocks
        ),
        "block mask + ALiBi score_mod, slope computed": lambda q, k, v: compiled(
            q, k, v, score_mod=alibi_computed_slope, block_mask=causal_blocks
        ),
        "no block mask, causal inside the ALiBi score_mod": lambda q, k, v: compiled(
            q, k, v, score_mod=alibi_and_causal
        ),
        "block mask, no ALiBi (flex's plain causal)": lambda q, k, v: compiled(q, k, v, block_mask=causal_blocks),
        "fused-attention ALiBi": lambda q, k, v: flash_attention(
            q, k, v, causal=True, alibi_slopes=slopes, layout="bhsd"
        ),
    }


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(BATCH, HEADS, SEQLEN, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
                   for _ in range(4))  # fmt: skip
    for t in (q, k, v):
        t.requires_grad_(True)
    flops = 2 * BATCH * HEADS * SEQLEN**2 * HEAD_DIM
    print(f"B{BATCH} H{HEADS} S{SEQLEN} D{HEAD_DIM} causal, bf16; TFLOP/s")
    print("| set-up | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s |")
    print("|---|---:|---:|---:|---:|")
    reference = None
    for name, attention in _variants().items():
        with torch.no_grad():
            out = attention(q, k, v)
        if reference is None:
            reference = out
        err = ((out.float() - reference.float()).norm() / reference.float().norm()).item()
        if not err < 1e-2:
            print(f"  {name}: output differs from the first set-up's by {err:.2e}", flush=True)

        def forward_backward(attention=attention):
            torch.autograd.grad(attention(q, k, v), (q, k, v), do)

        with torch.no_grad():
            fwd_ms = do_bench(lambda attention=attention: attention(q, k, v), return_mode="median")
        both_ms = do_bench(forward_backward, return_mode="median")
        print(f"| {name} | {fwd_ms:.4f} | {flops / fwd_ms / 1e9:.1f} | {both_ms:.4f} | "
              f"{3.5 * flops / both_ms / 1e9:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
