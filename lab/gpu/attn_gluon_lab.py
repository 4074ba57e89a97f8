"""The Gluon forward, dK/dV and dQ kernels (attn_gluon_kernels.py) against the package's, on Hopper.

    python3 lab/gpu/attn_gluon_lab.py            # every kernel
    ATTN_GLUON_KINDS=dq python3 lab/gpu/attn_gluon_lab.py   # only the dQ kernels

Per shape: the package's forward, dK/dV and dQ kernels timed by the profiler in its autotuned
forward+backward, then the Gluon kernels, each kernel's configs in a process of their own (a
kernel that hangs costs its timeout): outputs checked against SDPA's (relative Frobenius error, the package's beside
it), timed with do_bench (median). A lab tool for the GPU runs recorded in NOTES.md: it prints a table
and changes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from attn_ws_lab import kernel_ms, rel, torch_lse
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

LOG2E = 1.4426950408889634
SHAPES = [(4, 16, 2048, 128, True), (8, 16, 2048, 64, True), (4, 16, 4096, 128, False)]
CONFIGS = {  # (BLOCK_M, BLOCK_N, STAGES, num_warps)
    "fwd": [(128, 64, 3, 8), (128, 128, 3, 8)],
    "dkdv": [(64, 128, 2, 8), (64, 64, 2, 4)],
    "dq": [(128, 64, 2, 8), (128, 64, 3, 8), (64, 64, 2, 4), (64, 64, 3, 4)],
}
KERNEL_NAMES = {"fwd": "_attn_fwd_kernel", "dkdv": "_attn_bwd_dkdv_kernel", "dq": "_attn_bwd_dq_kernel"}
PRODUCTS = {"fwd": 2, "dkdv": 4, "dq": 3}  # matmuls of the kernel per (query block, key block) pair


def problem(b, h, s, d, causal):
    """BHSD bf16 q, k, v, do; SDPA's output and gradients; the LSE * log2(e) and delta, flat."""
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(out, (q, k, v), do)
    lse = torch.cat([torch_lse(q[i : i + 1], k[i : i + 1], causal) for i in range(b)])
    lse2 = (lse * LOG2E).reshape(-1).contiguous()
    delta = (out.float() * do.float()).sum(-1).reshape(-1).contiguous()
    return (q, k, v, do), out, grads, lse2, delta


def child(kind: str, shape_index: int) -> None:
    """Every config of `kind` at one shape: a RESULT line each (index, ms, TFLOP/s, error)."""
    from attn_gluon_kernels import launch_gluon_dkdv, launch_gluon_dq, launch_gluon_fwd

    b, h, s, d, causal = SHAPES[shape_index]
    (q, k, v, do), out_ref, (dq_ref, dk_ref, dv_ref), lse2, delta = problem(b, h, s, d, causal)
    q, k, v = (t.detach() for t in (q, k, v))
    dq, dk, dv, out = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)
    lse = torch.empty_like(lse2)
    errors = {
        "fwd": lambda: max(rel(out, out_ref), rel(lse * LOG2E, lse2)),
        "dkdv": lambda: max(rel(dk, dk_ref), rel(dv, dv_ref)),
        "dq": lambda: rel(dq, dq_ref),
    }
    flops = PRODUCTS[kind] * 2 * b * h * s * s * d * (0.5 if causal else 1.0)
    for index, (block_m, block_n, stages, warps) in enumerate(CONFIGS[kind]):

        def run(block_m=block_m, block_n=block_n, stages=stages, warps=warps):
            if kind == "fwd":
                launch_gluon_fwd(q, k, v, out, lse, causal, block_m, block_n, stages, warps)
            elif kind == "dkdv":
                launch_gluon_dkdv(q, k, v, do, lse2, delta, dk, dv, causal, block_m, block_n, stages, warps)
            else:
                launch_gluon_dq(q, k, v, do, lse2, delta, dq, causal, block_m, block_n, stages, warps)

        try:
            run()
            torch.cuda.synchronize()
        except Exception as error:  # a config that does not compile or fit
            print(f"FAILED {index} {type(error).__name__}: {str(error)[:120]}", flush=True)
            continue
        err = errors[kind]()
        ms = do_bench(run, warmup=25, rep=100, return_mode="median")
        print(f"RESULT {index} {ms:.4f} {flops / ms / 1e9:.1f} {err:.2e}", flush=True)


def package_kernels(b, h, s, d, causal):
    """{kind: (the package's kernel ms in its autotuned backward, its gradients' error against SDPA's)}."""
    from fused_attention import flash_attention

    (q, k, v, do), out_ref, (dq_ref, dk_ref, dv_ref), _, _ = problem(b, h, s, d, causal)

    def fwd_bwd():
        return torch.autograd.grad(flash_attention(q, k, v, causal=causal, layout="bhsd"), (q, k, v), do)

    dq, dk, dv = fwd_bwd()
    times = kernel_ms(fwd_bwd)
    out = flash_attention(q, k, v, causal=causal, layout="bhsd")
    errors = {"fwd": rel(out, out_ref), "dkdv": max(rel(dk, dk_ref), rel(dv, dv_ref)), "dq": rel(dq, dq_ref)}
    rows = {kind: (times[name], errors[kind]) for kind, name in KERNEL_NAMES.items()}
    rows["fwd+bwd"] = (sum(times.values()), float("nan"))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        sdpa = torch.nn.functional.scaled_dot_product_attention
        rows["cuDNN fwd"] = (sum(kernel_ms(lambda: sdpa(q, k, v, is_causal=causal)).values()), float("nan"))
        total = kernel_ms(lambda: torch.autograd.grad(sdpa(q, k, v, is_causal=causal), (q, k, v), do))
        rows["cuDNN fwd+bwd"] = (sum(total.values()), float("nan"))
    return rows


def main() -> None:
    print("| B, H, S, D, mask | kernel | config | ms | TFLOP/s | rel err |")
    print("|---|---|---|---:|---:|---:|")
    for shape_index, (b, h, s, d, causal) in enumerate(SHAPES):
        label = f"{b}, {h}, {s}, {d}, {'causal' if causal else 'full'}"
        package = package_kernels(b, h, s, d, causal)
        torch.cuda.empty_cache()
        fwd_flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        for name, work in (("fwd+bwd", 3.5), ("cuDNN fwd", 1.0), ("cuDNN fwd+bwd", 3.5)):
            ms = package[name][0]
            owner = "package" if name == "fwd+bwd" else "anchor"
            print(f"| {label} | {name} | {owner} | {ms:.4f} | {work * fwd_flops / ms / 1e9:.1f} | |", flush=True)
        for kind, configs in CONFIGS.items():
            if kind not in os.environ.get("ATTN_GLUON_KINDS", "fwd,dkdv,dq").split(","):
                continue
            ms, err = package[kind]
            flops = PRODUCTS[kind] * 2 * b * h * s * s * d * (0.5 if causal else 1.0)
            tflops = flops / ms / 1e9
            print(f"| {label} | {kind} package | autotuned | {ms:.4f} | {tflops:.1f} | {err:.2e} |", flush=True)
            names = ["{}x{} s{} w{}".format(*config) for config in configs]
            args = [sys.executable, __file__, "child", kind, str(shape_index)]
            try:  # one process per kernel and shape: a hang costs its timeout, not the run
                done = subprocess.run(args, timeout=120, capture_output=True, text=True)
                lines = [line.split(maxsplit=2) for line in done.stdout.splitlines()]
                for line in lines:
                    if line[0] == "RESULT":
                        ms, rate, err = line[2].split()
                        print(f"| {label} | {kind} Gluon | {names[int(line[1])]} | {ms} | {rate} | {err} |", flush=True)
                    elif line[0] == "FAILED":
                        print(f"| {label} | {kind} Gluon | {names[int(line[1])]} | {line[2]} |", flush=True)
                if done.returncode:
                    tail = done.stderr.strip().splitlines()[-1:] or [""]
                    print(f"| {label} | {kind} Gluon | exit {done.returncode} | {tail[0][:150]} |", flush=True)
            except subprocess.TimeoutExpired as expired:
                out = expired.stdout or ""
                seen = (out.decode(errors="replace") if isinstance(out, bytes) else out).count("RESULT")
                name = names[min(seen, len(names) - 1)]
                print(f"| {label} | {kind} Gluon | {name} | no result in 120 s (hang?) |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()
