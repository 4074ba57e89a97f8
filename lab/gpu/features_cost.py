"""What softcap and dropout cost, as users call them: fused-attention and the losses, with anchors.

    python3 lab/gpu/features_cost.py            # prints markdown tables

Attention (bf16, causal, the 1.4B model's heads: B 4, S 2048, H 16, D 128; and D 64, H 32):
forward and forward+backward of flash_attention plain, softcap=50 (Gemma-2's value), dropout 0.1,
both; anchors in the same process: SDPA (its default backend) plain and with dropout_p=0.1
(SDPA has no softcap). Losses: cross_entropy at 16384 x 50304 and linear_cross_entropy at
8192 x 2304 -> 256000 (Gemma-2 2B's head) with softcap 0 and 30, Liger-Kernel's cross-entropy
and fused linear cross-entropy with the same softcaps when liger_kernel imports.
The gated MLP at the 1.4B shape with SiLU and with Gemma's tanh-GELU gate, against torch eager.
Times: triton.testing.do_bench medians (ms), eager calls. A lab tool: it prints and changes nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

from fused_attention import flash_attention
from fused_norm_xent import cross_entropy, linear_cross_entropy

try:
    from liger_kernel.transformers.functional import liger_cross_entropy, liger_fused_linear_cross_entropy
except ImportError:  # the anchor is optional
    liger_cross_entropy = liger_fused_linear_cross_entropy = None


def _median_ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def _fwd_bwd(forward, inputs):
    out = forward()
    grad = torch.randn_like(out)

    def step():
        for t in inputs:
            t.grad = None
        forward().backward(grad)

    return step


def attention_rows(batch, heads, seqlen, head_dim):
    q, k, v = (
        torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_(True) for t in (q, k, v))
    cases = {
        "ours plain": lambda: flash_attention(q, k, v, causal=True),
        "ours softcap 50": lambda: flash_attention(q, k, v, causal=True, softcap=50.0),
        "ours dropout 0.1": lambda: flash_attention(q, k, v, causal=True, dropout_p=0.1),
        "ours softcap + dropout": lambda: flash_attention(q, k, v, causal=True, softcap=50.0, dropout_p=0.1),
        "SDPA plain": lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True),
        "SDPA dropout 0.1": lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, dropout_p=0.1),
    }
    print(f"\n### attention B{batch} S{seqlen} H{heads} D{head_dim} causal bf16 (ms, medians)\n")
    print("| case | fwd | fwd+bwd |\n|---|---|---|")
    for name, forward in cases.items():
        inputs = (qt, kt, vt) if name.startswith("SDPA") else (q, k, v)
        with torch.no_grad():
            fwd = _median_ms(forward)
        print(f"| {name} | {fwd:.3f} | {_median_ms(_fwd_bwd(forward, inputs)):.3f} |")


def _loss_table(title, ours, liger, inputs):
    """ours(softcap) and liger(softcap or None) build a forward; one row per softcap."""
    print(f"\n### {title}, fwd+bwd (ms, medians)\n")
    print("| softcap | ours | Liger |\n|---|---|---|")
    for softcap in (0.0, 30.0):
        mine = _median_ms(_fwd_bwd(ours(softcap), inputs))
        theirs = "-" if liger is None else f"{_median_ms(_fwd_bwd(liger(softcap or None), inputs)):.3f}"
        print(f"| {softcap:g} | {mine:.3f} | {theirs} |")


def loss_rows():
    logits = torch.randn(16384, 50304, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, 50304, (16384,), device="cuda")
    _loss_table(
        "cross-entropy 16384 x 50304 bf16",
        lambda cap: lambda: cross_entropy(logits, target, softcap=cap),
        None if liger_cross_entropy is None else lambda cap: lambda: liger_cross_entropy(logits, target, softcap=cap),
        (logits,),
    )
    logits = None  # frees 1.6 GB before the linear rows
    hidden = torch.randn(8192, 2304, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(256000, 2304, device="cuda") / 48).to(torch.bfloat16).requires_grad_(True)
    target = torch.randint(0, 256000, (8192,), device="cuda")
    liger = None
    if liger_fused_linear_cross_entropy is not None:

        def liger(cap):
            return lambda: liger_fused_linear_cross_entropy(hidden, weight, target, softcap=cap)

    _loss_table(
        "linear + cross-entropy 8192 x 2304 -> 256000 bf16",
        lambda cap: lambda: linear_cross_entropy(hidden, weight, target, softcap=cap),
        liger,
        (hidden, weight),
    )


def mlp_rows(tokens=16384, d_model=2048, d_ff=5632):
    """fused_swiglu.swiglu_mlp with SiLU and with the tanh-approximate GELU gate (Gemma's GeGLU),
    against torch's eager composition of the same MLP."""
    from fused_swiglu import swiglu_mlp

    x = torch.randn(tokens, d_model, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w_gate, w_up = ((torch.randn(d_model, d_ff, device="cuda") / d_model**0.5).to(torch.bfloat16).requires_grad_(True)
                    for _ in range(2))  # fmt: skip
    w_down = (torch.randn(d_ff, d_model, device="cuda") / d_ff**0.5).to(torch.bfloat16).requires_grad_(True)
    inputs = (x, w_gate, w_up, w_down)
    torch_act = {"silu": F.silu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh")}
    print(f"\n### gated MLP {tokens} x {d_model} -> {d_ff} -> {d_model} bf16 (ms, medians)\n")
    print("| activation | ours fwd+bwd | torch eager fwd+bwd |\n|---|---|---|")
    for activation, act in torch_act.items():
        ours = _median_ms(_fwd_bwd(lambda a=activation: swiglu_mlp(x, w_gate, w_up, w_down, activation=a), inputs))
        eager = _median_ms(_fwd_bwd(lambda a=act: (a(x @ w_gate) * (x @ w_up)) @ w_down, inputs))
        print(f"| {activation} | {ours:.3f} | {eager:.3f} |")


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    attention_rows(4, 16, 2048, 128)
    attention_rows(4, 32, 2048, 64)
    loss_rows()
    mlp_rows()
