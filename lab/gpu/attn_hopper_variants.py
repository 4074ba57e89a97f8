# ruff: noqa: B023
"""The Hopper dK/dV kernel (kernels/attention_bwd_hopper.py) in variants: layout (BSHD, BHSD),
program order (head-major, block-major), Q/dO ring stages; the portable dK/dV kernel beside it.

    python3 lab/gpu/attn_hopper_variants.py

Per shape: the portable kernel's time inside the package's backward (profiler, autotuned), then
each variant of the Hopper launch alone (do_bench median) with its error against the portable
kernel's dK and dV. A lab tool for the GPU runs recorded in NOTES.md: it prints a table and
changes nothing.
"""

from __future__ import annotations

import itertools

import torch
from attn_ws_lab import kernel_ms, rel
from triton.testing import do_bench

from fused_attention.kernels import attention_bwd_hopper as hopper
from fused_attention.ops import launch

SHAPES = [  # (B, H, H_kv, S, D, causal)
    (8, 16, 16, 2048, 64, True),
    (4, 32, 32, 4096, 64, True),
    (8, 16, 16, 2048, 128, True),
    (8, 16, 4, 2048, 128, True),
    (4, 16, 16, 4096, 128, False),
]


def main() -> None:
    print("| B, H, H_kv, S, D, mask | kernel | layout | order | stages | ms | TFLOP/s | rel err |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for batch, heads, kv_heads, seqlen, dim, causal in SHAPES:
        label = f"{batch}, {heads}, {kv_heads}, {seqlen}, {dim}, {'causal' if causal else 'full'}"
        flops = 4 * 2 * batch * heads * seqlen * seqlen * dim * (0.5 if causal else 1.0)
        for layout in ("bshd", "bhsd"):
            torch.manual_seed(0)
            shape_q = (batch, seqlen, heads, dim) if layout == "bshd" else (batch, heads, seqlen, dim)
            shape_k = (batch, seqlen, kv_heads, dim) if layout == "bshd" else (batch, kv_heads, seqlen, dim)
            q, do = (torch.randn(shape_q, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            k, v = (torch.randn(shape_k, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            spec = launch.AttentionSpec(batch, heads, kv_heads, dim, seqlen, seqlen, dim**-0.5, -1,
                                        0 if causal else -1, False, False, layout == "bhsd")  # fmt: skip
            o, lse = launch.attention_fwd(q, k, v, None, None, None, spec)
            launch.HOPPER_DKDV = False
            launch.clear_plans()
            times = kernel_ms(lambda: launch.attention_bwd(do, q, k, v, o, lse, None, None, None, None, spec))
            _, dk_ref, dv_ref = launch.attention_bwd(do, q, k, v, o, lse, None, None, None, None, spec)
            launch.HOPPER_DKDV = True
            launch.clear_plans()
            ms = sum(t for name, t in times.items() if "dkdv" in name)
            print(f"| {label} | portable | {layout} | package | | {ms:.4f} | {flops / ms / 1e9:.1f} | |", flush=True)
            delta = (o.float() * do.float()).sum(-1)
            delta = (delta.transpose(1, 2) if layout == "bshd" else delta).contiguous()
            views = [launch._descriptor_view(t.shape, t.stride(), 2, spec) for t in (q, k, v, do)]
            heads_outer = views[0][2]
            dk, dv = torch.empty_like(k), torch.empty_like(v)
            for block_major, stages in itertools.product((False, True), (2, 3)):
                rows = (hopper.BLOCK_M, hopper.BLOCK_N, hopper.BLOCK_N, hopper.BLOCK_M)
                blocks = [launch._descriptor_block(heads_outer, r, dim) for r in rows]
                descs = [
                    launch.descriptor_like(launch.gluon_descriptor_template(view[0], view[1], block, q.dtype), t)
                    for view, block, t in zip(views, blocks, (q, k, v, do))
                ]  # fmt: skip
                grad_strides = launch.seq_strides(dk.stride(), spec)

                kernel_launch = launch.Launch(
                    hopper._attn_bwd_dkdv_hopper_kernel, (-(-seqlen // hopper.BLOCK_N) * batch * kv_heads,),
                    num_warps=hopper.NUM_WARPS, **launch._strides("dk", grad_strides),
                    **launch._strides("dv", grad_strides), stride_lse_b=lse.stride(0), stride_lse_h=lse.stride(1),
                    n_kv_heads=kv_heads, kv_group=heads // kv_heads, seqlen_q=seqlen, seqlen_k=seqlen,
                    qk_scale=dim**-0.5 * 1.4426950408889634, softmax_scale=dim**-0.5, CAUSAL=causal,
                    HEADS_OUTER=heads_outer, BLOCK_MAJOR=block_major, STAGES=stages,
                )  # fmt: skip

                def run(descs=descs, kernel_launch=kernel_launch):
                    kernel_launch(*descs, lse, delta, dk, dv)

                try:
                    run()
                    torch.cuda.synchronize()
                except Exception as error:
                    print(f"| {label} | hopper | {layout} | {block_major} | {stages} | {type(error).__name__} |")
                    continue
                err = max(rel(dk, dk_ref), rel(dv, dv_ref))
                ms = do_bench(run, warmup=25, rep=100, return_mode="median")
                order = "block-major" if block_major else "head-major"
                print(f"| {label} | hopper | {layout} | {order} | {stages} | {ms:.4f} | {flops / ms / 1e9:.1f} | "
                      f"{err:.2e} |", flush=True)  # fmt: skip
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
