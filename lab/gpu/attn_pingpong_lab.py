"""The warp-specialized Gluon forward (attn_pingpong_kernels.py) against the package's forward and
cuDNN's, on Hopper.

    python3 lab/gpu/attn_pingpong_lab.py

Per shape (16k tokens, hidden 2048): the package's forward kernel and cuDNN's (kernel time under
the profiler), then each config of the Gluon kernel in a process of its own (a config that hangs
costs its timeout, not the run): O and the LSE checked against SDPA's and a float32 LSE
(relative Frobenius error, the package's beside it), timed with do_bench (median). A lab tool for
the GPU runs recorded in NOTES.md: it prints a table and changes nothing.
"""

from __future__ import annotations

import subprocess
import sys

import torch
from attn_ws_lab import kernel_ms, rel, torch_lse
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

SHAPES = [(4, 16, 4096, 128, True), (4, 16, 4096, 128, False), (4, 32, 4096, 64, True), (16, 16, 1024, 128, True)]
CONFIGS = [  # (BLOCK_N, STAGES, PINGPONG, OVERLAP)
    (128, 2, True, False),
    (128, 2, False, False),
    (128, 2, True, True),
    (128, 2, False, True),
    (64, 3, True, True),
    (64, 3, True, False),
]
CHILD_TIMEOUT_S = 150


def problem(b, h, s, d, causal):
    """BHSD bf16 q, k, v; SDPA's output; the float32 LSE (natural log), flat."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    lse = torch.cat([torch_lse(q[i : i + 1], k[i : i + 1], causal) for i in range(b)]).reshape(-1).contiguous()
    return (q, k, v), out, lse


def child(shape_index: int) -> None:
    """Every config at one shape: a RESULT line each (index, ms, TFLOP/s, error)."""
    from attn_pingpong_kernels import launch_pingpong_fwd

    b, h, s, d, causal = SHAPES[shape_index]
    (q, k, v), out_ref, lse_ref = problem(b, h, s, d, causal)
    flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
    for index, (block_n, stages, pingpong, overlap) in enumerate(CONFIGS):
        out, lse = torch.full_like(q, float("nan")), torch.full_like(lse_ref, float("nan"))

        def run(out=out, lse=lse, block_n=block_n, stages=stages, pingpong=pingpong, overlap=overlap):
            launch_pingpong_fwd(q, k, v, out, lse, causal, block_n, stages, pingpong, overlap)

        try:
            run()
            torch.cuda.synchronize()
        except Exception as error:  # a config that does not compile or fit
            print(f"FAILED {index} {type(error).__name__}: {str(error)[:120]}", flush=True)
            continue
        err = max(rel(out, out_ref), rel(lse, lse_ref))
        ms = do_bench(run, warmup=25, rep=100, return_mode="median")
        print(f"RESULT {index} {ms:.4f} {flops / ms / 1e9:.1f} {err:.2e}", flush=True)


def anchors(b, h, s, d, causal):
    """{name: (forward kernel ms, error)} of the package's forward and cuDNN's."""
    from fused_attention import flash_attention

    (q, k, v), out_ref, _ = problem(b, h, s, d, causal)
    rows = {}
    with torch.no_grad():
        out = flash_attention(q, k, v, causal=causal, layout="bhsd")
        rows["package fwd"] = (sum(kernel_ms(lambda: flash_attention(q, k, v, causal=causal, layout="bhsd")).values()),
                               rel(out, out_ref))  # fmt: skip
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            sdpa = torch.nn.functional.scaled_dot_product_attention
            rows["cuDNN fwd"] = (sum(kernel_ms(lambda: sdpa(q, k, v, is_causal=causal)).values()),
                                 rel(sdpa(q, k, v, is_causal=causal), out_ref))  # fmt: skip
    return rows


def main() -> None:
    print("| B, H, S, D, mask | kernel | config | ms | TFLOP/s | rel err |")
    print("|---|---|---|---:|---:|---:|")
    for shape_index, (b, h, s, d, causal) in enumerate(SHAPES):
        label = f"{b}, {h}, {s}, {d}, {'causal' if causal else 'full'}"
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        for name, (ms, err) in anchors(b, h, s, d, causal).items():
            print(f"| {label} | {name} | anchor | {ms:.4f} | {flops / ms / 1e9:.1f} | {err:.2e} |", flush=True)
        torch.cuda.empty_cache()
        names = [f"N{n} s{st}{' pingpong' if pp else ''}{' overlap' if ov else ''}" for n, st, pp, ov in CONFIGS]
        try:  # one process per shape: a hang costs its timeout, not the run
            done = subprocess.run([sys.executable, __file__, "child", str(shape_index)], timeout=CHILD_TIMEOUT_S,
                                  capture_output=True, text=True)  # fmt: skip
        except subprocess.TimeoutExpired as expired:
            done = None
            partial = (expired.stdout or b"")[-200:]
            print(f"| {label} | Gluon ws | timeout {CHILD_TIMEOUT_S} s | {partial!r} |", flush=True)
        if done is not None:
            for line in (line.split(maxsplit=2) for line in done.stdout.splitlines()):
                if line and line[0] == "RESULT":
                    ms, rate, err = line[2].split()
                    print(f"| {label} | Gluon ws | {names[int(line[1])]} | {ms} | {rate} | {err} |", flush=True)
                elif line and line[0] == "FAILED":
                    print(f"| {label} | Gluon ws | {names[int(line[1])]} | {line[2]} |", flush=True)
            if done.returncode:
                tail = done.stderr.strip().splitlines()[-1:] or [""]
                print(f"| {label} | Gluon ws | exit {done.returncode} | {tail[0][:150]} |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        child(int(sys.argv[2]))
    else:
        main()
