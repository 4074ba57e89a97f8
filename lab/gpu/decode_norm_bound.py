"""What would folding the residual add + RMSNorm into the next product save in the decode step?
(LLaMA 1.4B, batch 1, replayed from its CUDA graph)

    python3 lab/gpu/decode_norm_bound.py      (on a GPU; markdown on stdout)

The step launches 49 add + norm kernels (two per layer, one before the head), about 2 us each in
a 1432 us step; #29's 1.2x against the compiled twin needs about 100 us less. Folding them into
the products that read their output (the qkv GEMV, fused-swiglu's gate/up, the head) would cost
each of those a prologue: every program sums the squares of the row it reads. Before writing
that, this bounds the gain: the step captured with the norms skipped (their kernels not launched,
x = h, the residual left as it is; the logits are then wrong, and the times an upper bound):

- shipped: the model as it is;
- no attention-side norms: the norms before the qkv products and the head skipped (what a norm
  prologue in fused-gemm's GEMV could remove);
- no norms: every add + norm skipped (fused-swiglu's gate/up as well);
- fused qkv norm: each block's attention-side add + norm done inside the qkv GEMV by
  decode_norm_gemv.py's kernel (real numerics: its logits are compared with the shipped step's);
- fused qkv and gate/up norms: the MLP-side one as well, inside that file's copy of fused-swiglu's
  gate/up kernel at the tile the package tuned for one row.

Each variant in its own decode graph, alternating, two rounds; the profiler's kernel total
beside. A lab tool: the patches live in this process only.
"""

from __future__ import annotations

import collections
import functools

import torch
import triton.testing
from decode_lab import _models, prefilled, prompt_tokens
from decode_norm_gemv import add_norm_gemv, add_norm_swiglu
from torch.profiler import ProfilerActivity, profile

import fused_attention
import fused_rope


def skipping(shipped, skip):
    """add_dropout_norm that launches nothing for the norms `skip(norm)` selects."""

    def add_dropout_norm(h, residual, norm, p, config):
        if skip(norm):
            return h, h if residual is None else residual
        return shipped(h, residual, norm, p, config)

    return add_dropout_norm


def swiglu_tile():
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) of the tile fused-swiglu's autotuner chose for one row."""
    from fused_swiglu.kernels.forward import _swiglu_fwd_kernel

    for key, config in _swiglu_fwd_kernel.cache.items():
        if key[0] == 1:
            kw = config.kwargs
            return kw["BLOCK_N"], kw["BLOCK_K"], config.num_warps, config.num_stages
    print(f"fused-swiglu's autotuner holds no one-row forward ({list(_swiglu_fwd_kernel.cache)}): 64 x 64, 4 warps")
    return 64, 64, 4, 3


def fused_norms(shipped, mlp_tile=None):
    """Block.forward whose decode steps (batch 1, RMSNorm, RoPE, no biases) fold the attention-side
    add + norm into the qkv product, and with mlp_tile the MLP-side one into the gate/up product;
    everything else as shipped."""
    from tritonformer import model

    def forward(self, h, residual, position, cache=None):
        c = self.config
        if cache is None or not cache.decoding or h.shape[0] != 1 or c.norm != "rmsnorm" or c.position != "rope":
            return shipped(self, h, residual, position, cache)
        attn, mlp = self.attn, self.mlp
        B, S, _ = h.shape
        H, Hkv, D = c.n_head, c.n_kv_head, c.head_dim
        qkv, residual = add_norm_gemv(h, residual, self.norm_attn.weight, c.norm_eps, attn.qkv.weight, attn.qkv.bias)
        q, k, v = qkv.view(B, S, H + 2 * Hkv, D).split([H, Hkv, Hkv], dim=2)
        q, k = fused_rope.apply_rotary_qk(q.transpose(1, 2), k.transpose(1, 2), *position)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        k_cache, v_cache = cache.buffers(k)
        y = fused_attention.flash_attention_with_kvcache(q, k_cache, v_cache, cache.lengths, k_new=k, v_new=v,
                                                         causal=True)  # fmt: skip
        h = attn.proj(y.reshape(B, S, H * D))
        if mlp_tile is None:
            x, residual = model.add_dropout_norm(h, residual, self.norm_mlp, 0.0, c)
            return mlp(x), residual
        act, residual = add_norm_swiglu(h, residual, self.norm_mlp.weight, c.norm_eps, mlp.w_gate, mlp.w_up, *mlp_tile)
        return torch.matmul(act, mlp.w_down), residual

    return forward


def kernel_us(replay, steps: int = 5):
    """(kernel microseconds, launches) per replay, under the profiler."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            replay()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in events) / steps, len(events) / steps


@torch.no_grad()
def main() -> None:
    from tritonformer import generation, model

    config, ours, _ = _models()
    tokens = prompt_tokens(config)
    shipped, shipped_block = model.add_dropout_norm, model.Block.forward
    mlp_norms = {id(block.norm_mlp) for block in ours.blocks}
    variants = {
        "shipped": None,
        "no attention-side norms": lambda norm: id(norm) not in mlp_norms,
        "no norms": lambda norm: True,
        "fused qkv norm": "qkv",
        "fused qkv and gate/up norms": "both",
    }
    graphs = {}
    for name, skip in variants.items():
        cache, next_tokens, active = prefilled(ours, tokens)
        if skip in ("qkv", "both"):
            model.Block.forward = fused_norms(shipped_block, swiglu_tile() if skip == "both" else None)
        elif skip is not None:
            model.add_dropout_norm = skipping(shipped, skip)
        try:
            graph = generation.DecodeGraph(ours, cache, 1, tokens.dtype, torch.device("cuda"))
        finally:
            model.add_dropout_norm, model.Block.forward = shipped, shipped_block
        graphs[name] = functools.partial(graph, next_tokens, active)
    reference = graphs["shipped"]().float().clone()
    for name in ("fused qkv norm", "fused qkv and gate/up norms"):
        logits = graphs[name]().float()
        diff = (logits - reference).abs().max().item()
        same = bool(logits.argmax(-1).eq(reference.argmax(-1)).all())
        print(f"{name}: max abs logit difference from the shipped step {diff:.3g}, same greedy token: {same}")
    times = collections.defaultdict(list)
    for _ in range(2):
        for name, replay in graphs.items():
            times[name].append(triton.testing.do_bench(replay, warmup=10, rep=100, return_mode="median") * 1e3)
    base = min(times["shipped"])
    print("| variant | replay us (round 1) | (round 2) | saved us | kernel us per step | launches |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, replay in graphs.items():
        kernels, launches = kernel_us(replay)
        first, second = times[name]
        saved = base - min(first, second)
        print(f"| {name} | {first:.0f} | {second:.0f} | {saved:.0f} | {kernels:.0f} | {launches:.0f} |")


if __name__ == "__main__":
    main()
