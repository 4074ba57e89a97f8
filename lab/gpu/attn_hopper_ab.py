# ruff: noqa: B023
"""fused-attention's backward with the Hopper dK/dV kernel (kernels/attention_bwd_hopper.py) and
with the portable one, against cuDNN, at the issue grid's shapes plus GQA.

    python3 lab/gpu/attn_hopper_ab.py

Per shape (BSHD bf16, as the model calls it): for each variant (ops.launch.HOPPER_DKDV off, then
on; fresh plans, autotuned), the kernel times of one forward+backward by the profiler (dK/dV
kernel, whole backward, forward+backward) and the eager forward+backward by do_bench (median, as
users call it), the dK/dV error against SDPA's; then cuDNN's (SDPA backend). A lab tool for the
GPU runs recorded in NOTES.md: it prints a table and changes nothing.
"""

from __future__ import annotations

import torch
from attn_ws_lab import kernel_ms, rel
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from fused_attention import flash_attention
from fused_attention.ops import launch

SHAPES = [  # (B, H, H_kv, S, D, causal): 16k tokens, hidden 2048 (the grid), then GQA
    (4, 16, 16, 4096, 128, True),
    (4, 16, 16, 4096, 128, False),
    (1, 16, 16, 16384, 128, False),
    (4, 32, 32, 4096, 64, True),
    (16, 16, 16, 1024, 128, True),
    (8, 16, 16, 2048, 128, True),
    (8, 16, 4, 2048, 128, True),
    (8, 16, 16, 2048, 64, True),
]
FWD_KERNEL = "_attn_fwd_kernel"


def main() -> None:
    print("| B, H, H_kv, S, D, mask | variant | dK/dV ms | bwd ms | fwd+bwd ms | fwd+bwd TFLOP/s | eager fwd+bwd ms "
          "| cuDNN / this (kernels) | dK, dV rel err |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for batch, heads, kv_heads, seqlen, dim, causal in SHAPES:
        torch.manual_seed(0)
        q, do = (torch.randn(batch, seqlen, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(batch, seqlen, kv_heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        for t in (q, k, v):
            t.requires_grad_(True)
        flops = 3.5 * 4 * batch * heads * seqlen * seqlen * dim * (0.5 if causal else 1.0)
        group = heads // kv_heads
        qt, kt, vt, dot = (t.transpose(1, 2) for t in (q, k, v, do))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = torch.nn.functional.scaled_dot_product_attention(
                    qt, kt.repeat_interleave(group, 1), vt.repeat_interleave(group, 1), is_causal=causal
                )
                return torch.autograd.grad(out, (q, k, v), dot)

        _, dk_ref, dv_ref = cudnn()
        cudnn_times = kernel_ms(cudnn)
        # The GQA expansion (repeat_interleave and its backward) is not cuDNN's attention.
        cudnn_ms = sum(ms for name, ms in cudnn_times.items() if "cudnn" in name.lower() or "sm90" in name.lower()
                       or "flash" in name.lower())  # fmt: skip
        cudnn_ms = cudnn_ms or sum(cudnn_times.values())

        def ours():
            return torch.autograd.grad(flash_attention(q, k, v, causal=causal), (q, k, v), do)

        label = f"{batch}, {heads}, {kv_heads}, {seqlen}, {dim}, {'causal' if causal else 'full'}"
        for name, hopper in (("portable", False), ("hopper", True)):
            launch.HOPPER_DKDV = hopper
            launch.clear_plans()
            _, dk, dv = ours()
            times = kernel_ms(ours)
            dkdv = sum(ms for kernel, ms in times.items() if "dkdv" in kernel)
            total = sum(times.values())
            backward = total - times.get(FWD_KERNEL, 0.0)
            eager = do_bench(ours, warmup=25, rep=100, return_mode="median")
            err = max(rel(dk, dk_ref), rel(dv, dv_ref))
            print(f"| {label} | {name} | {dkdv:.4f} | {backward:.4f} | {total:.4f} | {flops / total / 1e9:.1f} | "
                  f"{eager:.4f} | {cudnn_ms / total:.3f} | {err:.2e} |", flush=True)  # fmt: skip
        print(f"| {label} | cuDNN | | | {cudnn_ms:.4f} | {flops / cudnn_ms / 1e9:.1f} | | | |", flush=True)
        launch.HOPPER_DKDV = True
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
