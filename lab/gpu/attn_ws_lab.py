# ruff: noqa: B023
"""Triton's automatic warp specialization (Hopper) on minimal attention kernels, against the package.

    python3 lab/gpu/attn_ws_lab.py [fwd dkdv dq]

attn_ws_kernels.py holds three dense kernels (BHSD, causal or full, no other options) whose main
loop is `tl.range(..., warp_specialize=True)`: on sm_90 with Triton 3.6 the compiler splits each
into a TMA producer warpgroup and two consumer warpgroups (384 threads, setmaxnreg). For each
shape: the package's forward and backward (kernel times from the profiler), cuDNN's through SDPA,
then the lab kernels per config, checked against the package's outputs, timed with do_bench
(medians). A lab tool for the GPU runs recorded in NOTES.md: it prints tables and changes nothing.
"""

from __future__ import annotations

import collections
import subprocess
import sys

import torch
import triton
from attn_ws_kernels import _mini_dkdv, _mini_dq, _mini_fwd
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench
from triton.tools.tensor_descriptor import TensorDescriptor

from fused_attention import flash_attention

LOG2E = 1.4426950408889634
SHAPES = [(4, 16, 2048, 128, True), (8, 16, 2048, 64, True), (4, 16, 4096, 128, False), (4, 16, 4096, 128, True)]
CONFIGS = {  # (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim
    "fwd": {128: [(128, 128, 4, 2), (128, 64, 4, 3), (128, 128, 4, 3)], 64: [(128, 128, 4, 2), (128, 64, 4, 3)]},
    "dkdv": {128: [(64, 128, 4, 2), (64, 128, 4, 3), (32, 128, 4, 2), (64, 64, 4, 2)],
             64: [(64, 128, 4, 2), (128, 128, 4, 2), (64, 128, 4, 3), (32, 128, 4, 3)]},
    "dq": {128: [(128, 64, 4, 2), (128, 128, 4, 2), (128, 64, 4, 3)], 64: [(128, 64, 4, 3), (128, 128, 4, 2)]},
}  # fmt: skip


def kernel_ms(fn, steps=10):
    """Mean GPU time per call of each kernel name fn launches."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    times = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            times[e.name[:60]] += e.device_time / 1e3 / steps
    return times


def torch_lse(q, k, causal):
    scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        scores.masked_fill_(torch.ones_like(scores[0, 0], dtype=torch.bool).triu(1), float("-inf"))
    return torch.logsumexp(scores, -1).detach()


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def package_and_cudnn_rows(q, k, v, do, causal, fwd_flops, row):
    """The package's forward and fwd+bwd kernel times (each kernel listed), then cuDNN's."""
    times = kernel_ms(lambda: flash_attention(q, k, v, causal=causal, layout="bhsd"))
    row("fwd", "package", "autotuned", sum(times.values()), fwd_flops)
    times = kernel_ms(lambda: torch.autograd.grad(flash_attention(q, k, v, causal=causal, layout="bhsd"),
                                                  (q, k, v), do))  # fmt: skip
    for name, ms in sorted(times.items(), key=lambda item: -item[1]):
        print(f"|  | kernel | package fwd+bwd | {name} | {ms:.4f} |  |  |")
    row("fwd+bwd", "package", "autotuned", sum(times.values()), 3.5 * fwd_flops)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = torch.nn.functional.scaled_dot_product_attention
        fwd_ms = sum(kernel_ms(lambda: ref(q, k, v, is_causal=causal)).values())
        total_ms = sum(kernel_ms(lambda: torch.autograd.grad(ref(q, k, v, is_causal=causal), (q, k, v), do)).values())
    row("fwd", "cuDNN", "", fwd_ms, fwd_flops)
    row("fwd+bwd", "cuDNN", "", total_ms, 3.5 * fwd_flops)


def main(kinds, anchors=True):
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    print("| B, H, S, D, causal | kernel | provider | config | ms | TFLOP/s | rel err |")
    print("|---|---|---|---|---:|---:|---:|")
    for b, h, s, d, causal in SHAPES:
        torch.manual_seed(0)
        q, k, v, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)
        fwd_flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        label = f"{b}, {h}, {s}, {d}, {'causal' if causal else 'full'}"

        def row(kind, provider, config, ms, flops, err=""):
            err = f"{err:.1e}" if err != "" else ""
            print(
                f"| {label} | {kind} | {provider} | {config} | {ms:.4f} | {flops / ms / 1e9:.1f} | {err} |", flush=True
            )

        if anchors:
            out, lse = flash_attention(q, k, v, causal=causal, layout="bhsd", return_lse=True)
            package_and_cudnn_rows(q, k, v, do, causal, fwd_flops, row)
        else:  # no autotuning in a probe process: SDPA's output, the LSE from the scores
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            lse = torch.cat([torch_lse(q[i : i + 1], k[i : i + 1], causal) for i in range(b)])
        dq_ref, dk_ref, dv_ref = torch.autograd.grad(out, (q, k, v), do)

        rows = b * h * s
        q2, k2, v2, do2 = (t.detach().reshape(rows, d) for t in (q, k, v, do))
        lse2 = (lse.float() * LOG2E).reshape(rows).contiguous()
        delta = (out.float() * do.float()).sum(-1).reshape(rows).contiguous()
        scale = d**-0.5
        for kind in kinds:
            for bm, bn, warps, stages in CONFIGS[kind][d]:
                desc = lambda t, block: TensorDescriptor.from_tensor(t, [block, d])  # noqa: E731
                config = f"{bm}x{bn} w{warps} s{stages}"
                try:
                    if kind == "fwd":
                        o = torch.empty_like(q2)
                        l_out = torch.empty(rows, device="cuda", dtype=torch.float32)
                        args = (desc(q2, bm), desc(k2, bn), desc(v2, bn), o, l_out, s, scale * LOG2E)
                        grid = (s // bm, b * h)
                        fn = lambda: _mini_fwd[grid](*args, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, WS=True,  # noqa: E731
                                                     CAUSAL=causal, num_warps=warps, num_stages=stages)  # fmt: skip
                        fn()
                        err = max(rel(o, out.detach().reshape(rows, d)), rel(l_out, lse.reshape(rows)))
                        flops = fwd_flops
                    else:
                        lse_desc = TensorDescriptor(lse2, [rows], [1], [bm])
                        delta_desc = TensorDescriptor(delta, [rows], [1], [bm])
                        if kind == "dkdv":
                            dk, dv = torch.empty_like(k2), torch.empty_like(v2)
                            args = (desc(q2, bm), desc(k2, bn), desc(v2, bn), desc(do2, bm), lse_desc, delta_desc,
                                    dk, dv, s, scale * LOG2E, scale)  # fmt: skip
                            grid = (s // bn, b * h)
                            kernel = _mini_dkdv
                            check = lambda: max(rel(dk, dk_ref.reshape(rows, d)), rel(dv, dv_ref.reshape(rows, d)))  # noqa: E731
                            flops = 2.0 * fwd_flops
                        else:
                            dq = torch.empty_like(q2)
                            args = (desc(q2, bm), desc(k2, bn), desc(v2, bn), desc(do2, bm), lse_desc, delta_desc,
                                    dq, s, scale * LOG2E, scale)  # fmt: skip
                            grid = (s // bm, b * h)
                            kernel = _mini_dq
                            check = lambda: rel(dq, dq_ref.reshape(rows, d))  # noqa: E731
                            flops = 1.5 * fwd_flops
                        fn = lambda: kernel[grid](*args, HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, WS=True,  # noqa: E731
                                                  CAUSAL=causal, num_warps=warps, num_stages=stages)  # fmt: skip
                        fn()
                        err = check()
                    ms = do_bench(fn, warmup=50, rep=200, return_mode="median")
                    row(kind, "lab WS", config, ms, flops, err)
                except Exception as error:  # a config that does not compile or fit
                    print(f"| {label} | {kind} | lab WS | {config} | {type(error).__name__}: {str(error)[:80]} |")


def gqa_rows(b=4, h=16, h_kv=4, s=2048, d=128):
    """The package's GQA fwd+bwd kernel time (per kernel) beside MHA's, and cuDNN's on K/V repeated
    to every query head, as transformers' sdpa path does."""
    torch.manual_seed(0)
    q, do = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for kv_heads in (h_kv, h):
        k, v = (
            torch.randn(b, kv_heads, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2)
        )
        q.requires_grad_(True)
        times = kernel_ms(
            lambda: torch.autograd.grad(flash_attention(q, k, v, causal=True, layout="bhsd"), (q, k, v), do)
        )
        print(f"\n#### package fwd+bwd, {b}x{h} heads / {kv_heads} kv, S {s}, D {d}: {sum(times.values()):.3f} ms")
        for name, ms in times.most_common(6):
            print(f"- {name}: {ms:.3f}")
        if kv_heads != h:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):

                def cudnn():
                    kr, vr = (t.repeat_interleave(h // kv_heads, dim=1) for t in (k, v))
                    out = torch.nn.functional.scaled_dot_product_attention(q, kr, vr, is_causal=True)
                    return torch.autograd.grad(out, (q, k, v), do)

                print(f"- cuDNN on repeated K/V, all kernels: {sum(kernel_ms(cudnn).values()):.3f} ms")


PROBES = [  # (kind, B, H, S, D, causal, config): one process each
    ("fwd", 4, 16, 4096, 128, False, (128, 128, 4, 2)),
    ("fwd", 4, 16, 2048, 128, True, (128, 128, 4, 2)),
    ("dkdv", 4, 16, 4096, 128, False, (64, 128, 4, 2)),
    ("dkdv", 4, 16, 2048, 128, True, (64, 128, 4, 2)),
    ("dq", 4, 16, 4096, 128, False, (128, 64, 4, 2)),
    ("dq", 4, 16, 2048, 128, True, (128, 64, 4, 2)),
]


def probe_all(timeout_s: float = 60.0) -> None:
    """Each probe in its own process: a kernel that hangs costs its timeout, not the run."""
    for index, probe in enumerate(PROBES):
        try:
            done = subprocess.run([sys.executable, __file__, "probe", str(index)], timeout=timeout_s,
                                  capture_output=True, text=True)  # fmt: skip
            lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
            print("\n".join(lines[-1:]) or f"| {probe} | exit {done.returncode}: {done.stderr.strip()[-200:]} |")
        except subprocess.TimeoutExpired:
            print(f"| {probe} | no result in {timeout_s:.0f} s (hang) |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        kind, *shape, config = PROBES[int(sys.argv[2])]
        SHAPES[:] = [tuple(shape)]
        CONFIGS[kind][shape[3]] = [config]
        main([kind], anchors=False)
    elif sys.argv[1:2] == ["gqa"]:
        gqa_rows()
    else:
        probe_all()
