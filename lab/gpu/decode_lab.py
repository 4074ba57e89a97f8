"""Where a batch-1 decode step's time goes, and how fast its pieces can be.

python3 lab/gpu/decode_lab.py [attention] [attention_small] [modules] [step]   (on a GPU; markdown on stdout)

- attention: flash_attention_with_kvcache at batch 1 (32 query heads over 8 KV heads, D 128,
  bf16, caches 4096-32768) against SDPA, each timed as 20 calls replayed from one CUDA graph (kernel time, no host),
  over split counts and (BLOCK_N, num_warps, num_stages) of the split kernel. The 20 calls read one
  cache, so caches smaller than L2 (4096-8192) are timed from L2: decode_bench.py cycles caches
  through HBM instead.
- modules: each linear layer / MLP of one llama-1.4B block and the head, ours against the twin's
  (cuBLAS), at M = 1 and 16 rows, replayed from a graph; GB/s counts the weight bytes.
- step: one decode step of llama-1.4B (prompt 512) replayed from a graph, and the kernels of
  eager decode steps by total time per step, for Transformer and TorchTransformer
  (DECODE_LAB_MODELS: a comma list of ours, twin, compiled: the twin's step under torch.compile).
"""

from __future__ import annotations

import collections
import functools
import os
import sys

import torch
import torch.nn.functional as F
import triton.testing
from torch.profiler import ProfilerActivity, profile
from tritonformer_testkit.bench import graph_replay

CALLS = 20


def graph_us(fn, calls: int = CALLS) -> float:
    """Microseconds per fn call: `calls` calls captured into one CUDA graph, replay median."""
    return triton.testing.do_bench(graph_replay(fn, calls), warmup=10, rep=60, return_mode="median") * 1e3 / calls


def decode_problem(length: int, heads: int, kv_heads: int, head_dim: int = 128, batch: int = 1):
    """(q, k_cache, v_cache, seqlens, sdpa): one query token per head and row against a full
    bf16 cache of `length`, and SDPA over the same cache (GQA heads shared without copies)."""
    k_cache = torch.randn(batch, length, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(batch, 1, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    sdpa = functools.partial(
        F.scaled_dot_product_attention, q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
        enable_gqa=heads != kv_heads,
    )  # fmt: skip
    return q, k_cache, v_cache, seqlens, sdpa


def attention() -> None:
    from fused_attention import flash_attention_with_kvcache
    from fused_attention.ops import decode as decode_ops

    original_sizes = decode_ops.block_sizes
    original_launch = decode_ops.Launch
    variants = [(None, None, None)] + [(bn, w, s) for bn in (64, 128) for w in (4, 8) for s in (2, 3, 4)]
    print("| cache | splits | BLOCK_N w s | ours us | GB/s | SDPA us | SDPA GB/s |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for length in (4096, 8192, 16384, 32768):
        q, k_cache, v_cache, seqlens, sdpa = decode_problem(length, 32, 8)  # GQA 4:1
        nbytes = 2 * k_cache.numel() * 2
        sdpa_us = graph_us(sdpa)
        reference = sdpa().transpose(1, 2)
        for splits in (0, 16, 32, 64):
            for bn, w, s in variants:
                if bn is not None and splits not in (0, 32):
                    continue
                decode_ops._plan.cache_clear()
                if bn is None:
                    decode_ops.block_sizes, decode_ops.Launch = original_sizes, original_launch
                else:
                    decode_ops.block_sizes = lambda spec, bn=bn: (16, bn)

                    def patched(kernel, grid, w=w, s=s, **kw):
                        if kernel is decode_ops._decode_split_kernel:
                            kw.update(num_warps=w, num_stages=s)
                        return original_launch(kernel, grid, **kw)

                    decode_ops.Launch = patched
                fn = functools.partial(flash_attention_with_kvcache, q, k_cache, v_cache, seqlens, num_splits=splits)
                try:
                    torch.testing.assert_close(fn(), reference, atol=2e-2, rtol=2e-2)
                    us = graph_us(fn)
                    cell = f"{us:.1f} | {nbytes / us / 1e3:.0f}"
                except Exception as error:  # a config that does not compile must not lose the table
                    cell = f"failed {type(error).__name__} | "
                name = "default" if bn is None else f"{bn} w{w} s{s}"
                anchor = f"{sdpa_us:.1f} | {nbytes / sdpa_us / 1e3:.0f}"
                print(f"| {length} | {splits or 'auto'} | {name} | {cell} | {anchor} |", flush=True)
        decode_ops.block_sizes, decode_ops.Launch = original_sizes, original_launch
        decode_ops._plan.cache_clear()


def _models(preset: str = "llama-1.4B"):
    from tritonformer.config import TransformerConfig
    from tritonformer.train import build_model

    config = TransformerConfig.preset(preset)
    ours = build_model("triton", config).cuda().to(torch.bfloat16).eval()
    twin = build_model("torch", config).cuda().to(torch.bfloat16).eval()
    twin.load_state_dict(ours.state_dict())
    return config, ours, twin


PROMPT = 512


def prompt_tokens(config) -> torch.Tensor:
    """A random batch-1 prompt of PROMPT tokens."""
    return torch.randint(0, config.vocab_size, (1, PROMPT), device="cuda")


def prefilled(model, tokens: torch.Tensor):
    """(cache, next_tokens, active) for decode steps of `model` after prefilling `tokens` (1, PROMPT)
    into a cache of PROMPT + 300 positions; no row active, so replayed steps leave the lengths put."""
    from tritonformer import generation

    device = torch.device("cuda")
    cache = generation.KVCache(model.config.n_layer, 1, PROMPT + 300, device)
    cache.tables = model.decode_tables(PROMPT + 300, device)
    generation._prefill(model, tokens, torch.full((1,), PROMPT, device=device), PROMPT, cache)
    return cache, tokens[:, -1].clone(), torch.zeros(1, dtype=torch.bool, device=device)


@torch.no_grad()
def modules() -> None:
    config, ours, twin = _models()
    print("| module | M | weight MB | ours us | GB/s | twin us | GB/s | twin / ours |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    pairs = [
        ("qkv", ours.blocks[0].attn.qkv, twin.blocks[0].attn.qkv),
        ("proj", ours.blocks[0].attn.proj, twin.blocks[0].attn.proj),
        ("mlp", ours.blocks[0].mlp, twin.blocks[0].mlp),
        ("head", ours.lm_head, twin.lm_head),
    ]
    for name, mine, theirs in pairs:
        weight = sum(p.numel() * p.element_size() for p in mine.parameters())
        in_features = mine.weight.shape[1] if hasattr(mine, "weight") else config.d_model
        for m in (1, 16):
            x = torch.randn(m, 1, in_features, device="cuda", dtype=torch.bfloat16)
            torch.testing.assert_close(mine(x), theirs(x), atol=5e-2, rtol=5e-2)
            a, b = graph_us(functools.partial(mine, x)), graph_us(functools.partial(theirs, x))
            print(f"| {name} | {m} | {weight / 1e6:.1f} | {a:.1f} | {weight / a / 1e3:.0f} | {b:.1f} | "
                  f"{weight / b / 1e3:.0f} | {b / a:.2f} |", flush=True)  # fmt: skip


@torch.no_grad()
def step() -> None:
    from tritonformer import generation

    config, ours, twin = _models()
    models = {"ours": ("Transformer", ours), "twin": ("TorchTransformer", twin), "compiled": ("compiled twin", twin)}
    for name in os.environ.get("DECODE_LAB_MODELS", "ours,twin").split(","):
        label, model = models[name]
        if name == "compiled":
            model.forward_cached = compiled_decode(twin)
        tokens = prompt_tokens(config)
        cache, next_tokens, active = prefilled(model, tokens)
        graph = generation.DecodeGraph(model, cache, 1, tokens.dtype, torch.device("cuda"))
        replay = functools.partial(graph, next_tokens, active)
        replay_us = triton.testing.do_bench(replay, warmup=10, rep=100, return_mode="median") * 1e3
        steps = 10
        for _ in range(3):
            generation._decode(model, next_tokens, active, cache)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                generation._decode(model, next_tokens, active, cache)
            torch.cuda.synchronize()
        per_kernel = collections.defaultdict(lambda: [0.0, 0])
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                per_kernel[event.name][0] += event.device_time / steps
                per_kernel[event.name][1] += 1
        total = sum(t for t, _ in per_kernel.values())
        count = sum(n for _, n in per_kernel.values()) / steps
        print(f"\n### {label}: graph replay {replay_us:.0f} us per step ({1e6 / replay_us:.0f} tok/s); "
              f"kernels {total:.0f} us in {count:.0f} launches per step\n")  # fmt: skip
        print("| kernel | us per step | launches per step |")
        print("|---|---:|---:|")
        for name, (t, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:16]:
            print(f"| {name[:90]} | {t:.1f} | {n / steps:.0f} |")
        del graph, replay, cache
        model.__dict__.pop("forward_cached", None)
        torch.cuda.empty_cache()


def compiled_decode(twin):
    """The twin's forward_cached with its decode steps under torch.compile (no inductor CUDA
    graphs: the decode graph captures them), its prefills eager (tritonformer-bench's arrangement)."""
    eager = twin.forward_cached
    step = torch.compile(eager)
    return lambda idx, cache: step(idx, cache) if cache.decoding else eager(idx, cache)


def attention_small() -> None:
    """Decode attention at short caches by split count: the 1.4B model's heads (16, no GQA) and
    32 query over 8 KV heads, D 128, batch 1 and 4."""
    from fused_attention import flash_attention_with_kvcache

    print("| heads | batch | cache | " + " | ".join(f"{s or 'auto'} splits us" for s in SMALL_SPLITS) + " | SDPA us |")
    print("|---|---:|---:|" + "---:|" * (len(SMALL_SPLITS) + 1))
    for heads, kv_heads in ((16, 16), (32, 8)):
        for batch in (1, 4):
            for length in (256, 512, 768, 1024, 2048, 4096):
                q, k_cache, v_cache, seqlens, sdpa = decode_problem(length, heads, kv_heads, batch=batch)
                cells = []
                for splits in SMALL_SPLITS:
                    fn = functools.partial(flash_attention_with_kvcache, q, k_cache, v_cache, seqlens,
                                           num_splits=splits)  # fmt: skip
                    cells.append(f"{graph_us(fn):.1f}")
                row = f"| {heads}/{kv_heads} | {batch} | {length} | " + " | ".join(cells)
                print(row + f" | {graph_us(sdpa):.1f} |", flush=True)


SMALL_SPLITS = (0, 1, 2, 3, 4, 6, 8, 12, 16)


if __name__ == "__main__":
    for part in sys.argv[1:] or ["attention", "modules", "step"]:
        print(f"\n## {part}\n", flush=True)
        {"attention": attention, "attention_small": attention_small, "modules": modules, "step": step}[part]()
