"""Does rotary inside the decode kernel pay in the model's decode step? (LLaMA 1.4B, batch 1)

    python3 lab/gpu/rope_fused_step.py      (on a GPU; markdown on stdout)

On an H100 the decode kernel with rotary_cos/rotary_sin took 1.5 us more than without when timed
alone (lab/gpu/decode_ab.py), about the cost of the separate RoPE launch it replaces, but in the
model's step its split kernel went from 7 to 15 us per layer (not understood). Here the step runs
three ways, each captured in its own decode graph, alternating, two rounds:

- rope kernel: the model as shipped (fused_rope.apply_rotary_qk, then the decode kernel);
- fused, fp32 tables: the decode kernel rotates q and the new key with the model's (capacity, D)
  fp32 tables, the RoPE launch dropped;
- fused, bf16 tables: the same with the tables in bf16 (half the bytes of a cold table row).

Each variant's logits must match the shipped step's (bf16 rounding apart), and the profiler's
per-kernel table of each is printed. A lab tool: the patch lives in this process only.
"""

from __future__ import annotations

import collections
import functools

import torch
import triton.testing
from decode_lab import _models, prefilled, prompt_tokens
from torch.profiler import ProfilerActivity, profile

import fused_attention


def fused_rotary_forward(tables):
    """Attention.forward for decode steps with rotary inside the decode kernel (`tables`: the
    rotary cos and sin (capacity, D) to pass); prefill and training as shipped."""
    from tritonformer.model import Attention

    shipped = Attention.forward

    def forward(self, x, position, cache=None):
        if cache is None or not cache.decoding or self.config.position != "rope":
            return shipped(self, x, position, cache)
        c = self.config
        B, S, _ = x.shape
        H, Hkv, D = c.n_head, c.n_kv_head, c.head_dim
        q, k, v = self.qkv(x).view(B, S, H + 2 * Hkv, D).split([H, Hkv, Hkv], dim=2)
        k_cache, v_cache = cache.buffers(k)
        y = fused_attention.flash_attention_with_kvcache(
            q, k_cache, v_cache, cache.lengths, k_new=k, v_new=v, causal=True, rotary_cos=tables[0],
            rotary_sin=tables[1],
        )  # fmt: skip
        return self.proj(y.reshape(B, S, H * D))

    return forward


@torch.no_grad()
def main() -> None:
    from tritonformer import generation
    from tritonformer.model import Attention

    config, ours, _ = _models()
    tokens = prompt_tokens(config)
    shipped = Attention.forward
    graphs, tables_of = {}, {}
    for name in ("rope kernel", "fused, fp32 tables", "fused, bf16 tables"):
        cache, next_tokens, active = prefilled(ours, tokens)
        if name != "rope kernel":
            dtype = torch.float32 if "fp32" in name else torch.bfloat16
            tables_of[name] = tuple(t.to(dtype).contiguous() for t in cache.tables)
            Attention.forward = fused_rotary_forward(tables_of[name])
        graph = generation.DecodeGraph(ours, cache, 1, tokens.dtype, torch.device("cuda"))
        graphs[name] = (functools.partial(graph, next_tokens, active), cache)
        Attention.forward = shipped
    reference = graphs["rope kernel"][0]().clone()
    print("| variant | replay us per step (round 1) | (round 2) | max abs logit diff vs shipped |")
    print("|---|---:|---:|---:|")
    times = collections.defaultdict(list)
    for _ in range(2):
        for name, (replay, _) in graphs.items():
            times[name].append(triton.testing.do_bench(replay, warmup=10, rep=100, return_mode="median") * 1e3)
    for name, (replay, _) in graphs.items():
        diff = (replay().float() - reference.float()).abs().max().item()
        print(f"| {name} | {times[name][0]:.0f} | {times[name][1]:.0f} | {diff:.3g} |", flush=True)
    for name, (replay, _) in graphs.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                replay()
            torch.cuda.synchronize()
        per_kernel = collections.defaultdict(float)
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                per_kernel[event.name[:60]] += event.device_time / 5
        top = sorted(per_kernel.items(), key=lambda kv: -kv[1])[:8]
        print(f"\n{name}: " + "; ".join(f"{kernel} {us:.0f} us" for kernel, us in top))


if __name__ == "__main__":
    main()
