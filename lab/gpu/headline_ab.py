"""GPU time at the packages' headline shapes, for whichever copy of the packages is importable.

python3 lab/gpu/headline_ab.py LABEL >> rows.jsonl     (PYTHONPATH picks the packages)

Run it once per copy (the base tree, the working tree), alternating, on one machine: each row is
a do_bench median in ms. Shapes: attention D=128 causal S=4096 (16k tokens, 16 heads) and the
410M model's D=64 causal S=2048 batch 8; GEMM 16384x2048x5632 plain and bias+GELU; the SwiGLU MLP
16384x2048->5632; RoPE q,k (4,4096,32,128); cross-entropy 16384x50304; linear+CE 16384x2048 ->
50304; RMSNorm and LayerNorm 16384x4096; all bf16, forward and forward+backward.
"""

import json
import sys

import torch
import triton.testing

import fused_attention
import fused_gemm
import fused_norm_xent as nx
import fused_rope
import fused_swiglu

DEV, DT = "cuda", torch.bfloat16


def leaf(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEV, dtype=DT) * scale).requires_grad_(True)


def fwd_bwd(fn, inputs):
    def step():
        out = fn()
        out = out[0] if isinstance(out, tuple) else out
        out.backward(torch.ones_like(out) if out.dim() else None)
        for t in inputs:
            t.grad = None

    return step


def cases():
    out = {}
    for name, (b, s, h, d) in {
        "attn D128 causal S4096": (4, 4096, 16, 128),
        "attn D64 causal S2048 b8": (8, 2048, 16, 64),
    }.items():
        q, k, v = leaf(b, s, h, d), leaf(b, s, h, d), leaf(b, s, h, d)
        fn = lambda q=q, k=k, v=v: fused_attention.flash_attention(q, k, v, causal=True)  # noqa: E731
        out[name] = (fn, (q, k, v))
    a, w, bias = leaf(16384, 2048), leaf(5632, 2048, scale=0.02), leaf(5632)
    out["gemm 16384x2048x5632"] = (lambda: fused_gemm.matmul(a, w.t()), (a, w))
    out["gemm+bias+gelu 16384x2048x5632"] = (
        lambda: fused_gemm.matmul(a, w.t(), bias=bias, activation="gelu"),
        (a, w, bias),
    )
    wg, wu, wd = leaf(2048, 5632, scale=0.02), leaf(2048, 5632, scale=0.02), leaf(5632, 2048, scale=0.02)
    out["swiglu_mlp 16384x2048->5632"] = (lambda: fused_swiglu.swiglu_mlp(a, wg, wu, wd), (a, wg, wu, wd))
    q, k = leaf(4, 32, 4096, 128), leaf(4, 32, 4096, 128)
    cos, sin = fused_rope.RotaryEmbedding(128).to(DEV).cos_sin(4096)
    out["rope_qk (4,32,4096,128)"] = (lambda: fused_rope.apply_rotary_qk(q, k, cos, sin), (q, k))
    logits, target = leaf(16384, 50304), torch.randint(0, 50304, (16384,), device=DEV)
    out["cross_entropy 16384x50304"] = (lambda: nx.cross_entropy(logits, target), (logits,))
    h, wv = leaf(16384, 2048), leaf(50304, 2048, scale=0.02)
    out["linear_cross_entropy 16384x2048->50304"] = (lambda: nx.linear_cross_entropy(h, wv, target), (h, wv))
    x, g, bb = leaf(16384, 4096), leaf(4096), leaf(4096)
    out["rms_norm 16384x4096"] = (lambda: nx.rms_norm(x, [4096], g), (x, g))
    out["layer_norm 16384x4096"] = (lambda: nx.layer_norm(x, [4096], g, bb), (x, g, bb))
    return out


def main():
    label = sys.argv[1]
    for name, (fn, inputs) in cases().items():
        for mode, call in (("fwd", fn), ("fwd+bwd", fwd_bwd(fn, inputs))):
            try:
                ms = triton.testing.do_bench(call, warmup=25, rep=200)
            except Exception as error:  # a base tree may lack an API: record it, go on
                ms = None
                print(f"{name} {mode}: {type(error).__name__}: {str(error)[:120]}", file=sys.stderr)
            print(json.dumps({"label": label, "case": name, "mode": mode, "ms": ms}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
