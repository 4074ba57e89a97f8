"""How the fused loss's chunk size trades time for memory: fused_norm_xent.linear_cross_entropy
alone, and the GPT training step (CUDA-graph body) with TransformerConfig.loss_chunk_size.

    python3 lab/gpu/loss_chunk_sweep.py [loss] [model]

Why: each chunk adds its share of the weight gradient into an fp32 (V, H) accumulator, a read
and a write of 8*V*H bytes, against 2*C*V*H flops of that chunk's gradient matmul: below a few
thousand tokens per chunk the accumulator's traffic is a large part of the matmul's time, and
the default chunk (the largest power of two <= H) is 1024 tokens at H = 1024. A lab tool for the
GPU runs recorded in NOTES.md; prints tables, changes nothing.
"""

from __future__ import annotations

import sys

import torch
import triton.testing

LOSS_SHAPES = [(16384, 1024, 50304), (16384, 2048, 50304), (8192, 2048, 32000)]  # tokens, H, V
CHUNKS = [None, 1024, 2048, 4096, 8192, 16384]
MODEL_POINTS = [("410M", 8, [None, 4096, 8192, 16384]), ("llama-1.4B", 4, [None, 4096, 8192])]


def _loss_row(tokens: int, hidden_size: int, vocab: int, chunk) -> str:
    from fused_norm_xent import linear_cross_entropy

    hidden = torch.randn(tokens, hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(vocab, hidden_size, device="cuda") * 0.02).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (tokens,), device="cuda")

    def step():
        loss = linear_cross_entropy(hidden, weight, target, chunk_size=chunk)
        torch.autograd.grad(loss, (hidden, weight))

    step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    ms = triton.testing.do_bench(step, warmup=50, rep=300)
    return f"| {tokens}x{hidden_size}x{vocab} | {chunk or 'default'} | {ms:.3f} | {peak:.0f} |"


def loss_sweep() -> None:
    print("| tokens x H x V | chunk | fwd+bwd ms | peak extra MiB |\n|---|---:|---:|---:|")
    for tokens, hidden_size, vocab in LOSS_SHAPES:
        for chunk in CHUNKS:
            print(_loss_row(tokens, hidden_size, vocab, chunk), flush=True)


def model_sweep() -> None:
    from tritonformer.bench import Point, point_config, release_memory, time_training_steps, training_step

    device = torch.device("cuda")
    print("| point | loss_chunk_size | ms per step | peak GiB |\n|---|---:|---:|---:|")
    for preset, batch, chunks in MODEL_POINTS:
        point = Point(preset, 2048, batch)
        for chunk in chunks:
            config = point_config(point, "tritonformer+graph", {"loss_chunk_size": chunk})
            step = training_step(point, "tritonformer+graph", config, device)
            ms, peak = time_training_steps(step, warmup=3, steps=20, device=device)
            print(f"| {point} | {chunk or 'default'} | {ms:.2f} | {peak:.2f} |", flush=True)
            step = None
            release_memory(device)


if __name__ == "__main__":
    parts = sys.argv[1:] or ["loss", "model"]
    if "loss" in parts:
        loss_sweep()
    if "model" in parts:
        model_sweep()
