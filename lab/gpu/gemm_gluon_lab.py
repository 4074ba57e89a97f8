"""fused-gemm's warp-specialized Gluon kernel against its TMA kernel and torch, forced path by path.

    python3 lab/gpu/gemm_gluon_lab.py

Needs Triton 3.6 on a Hopper GPU (`_runtime.compat.HAS_GLUON_HOPPER`). First kernels.matmul_ws's results
against an fp32 reference on ragged and real shapes (beside torch's own 16-bit result, for
scale); then, for the issue's three products, plain and bias + GELU, the two kernels forced
(`launch_matmul(path="ws" / "tma")`) and torch's F.linear (+ F.gelu), timed together by
fused-gemm's tuner timer (CUDA-graph replays, interleaved rounds, medians). Session 12 developed
the kernel with it (NOTES.md runs 101-112; the lab variants of those runs were the tool's
argument then). A lab tool for the GPU runs recorded in NOTES.md: it prints tables and changes
nothing.
"""

from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

from fused_gemm._runtime.compat import HAS_GLUON_HOPPER
from fused_gemm.kernels.common import ACTIVATION_CODES
from fused_gemm.ops import tuning
from fused_gemm.ops.launch import launch_matmul

CHECKS = [(1000, 512, 768), (4096, 1024, 1000), (333, 2048, 2048), (16384, 2048, 8192)]
PRODUCTS = [(16384, 2048, 8192), (16384, 8192, 2048), (16384, 2048, 6144)]


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref).norm() / ref.norm()).item()


def _operands(m: int, k: int, n: int):
    """x (M, K), w (N, K) scaled by 1/sqrt(K), bias (N,): bf16 on the GPU."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
    return x, w, torch.randn(n, device="cuda", dtype=torch.bfloat16)


def _forced(path, x, w, bias, gelu, out):
    """launch_matmul on the 3-D views the launcher takes, the kernel forced."""
    code = ACTIVATION_CODES["gelu" if gelu else None]
    return lambda: launch_matmul(x[None], w.t()[None], out[None], bias=bias, activation=code, path=path)


def _providers(x, w, bias, gelu, out):
    """(name, call) of the two kernels and torch's F.linear (+ F.gelu)."""

    def torch_call():
        y = F.linear(x, w, bias)
        return F.gelu(y) if gelu else y

    return [("warp-specialized (ws)", _forced("ws", x, w, bias, gelu, out)),
            ("TMA kernel", _forced("tma", x, w, bias, gelu, out)), ("torch", torch_call)]  # fmt: skip


def main() -> None:
    if not HAS_GLUON_HOPPER:
        raise SystemExit("kernels.matmul_ws needs Triton 3.6's Gluon API")
    print("| M, K, N | epilogue | ws rel err | torch rel err |")
    print("|---|---|---:|---:|")
    for m, k, n in CHECKS:
        x, w, bias = _operands(m, k, n)
        for label, b, gelu in (("plain", None, False), ("+bias gelu", bias, True)):
            ref = F.linear(x.float(), w.float(), None if b is None else b.float())
            ref = F.gelu(ref) if gelu else ref
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            _forced("ws", x, w, b, gelu, out)()
            theirs = F.linear(x, w, b)
            theirs = F.gelu(theirs) if gelu else theirs
            print(f"| {m}, {k}, {n} | {label} | {_rel(out, ref):.2e} | {_rel(theirs, ref):.2e} |", flush=True)
    print("\n| M, K, N | epilogue | provider | ms | TFLOP/s | torch / provider |")
    print("|---|---|---|---:|---:|---:|")
    for m, k, n in PRODUCTS:
        x, w, bias = _operands(m, k, n)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        for label, b, gelu in (("plain", None, False), ("+bias gelu", bias, True)):
            providers = _providers(x, w, b, gelu, out)
            for _, call in providers:
                call()
            ms = [statistics.median(t) for t in tuning.replay_rounds([c for _, c in providers], tuning.ROUNDS)]
            flops = 2 * m * n * k
            for (name, _), t in zip(providers, ms):
                print(f"| {m}, {k}, {n} | {label} | {name} | {t:.4f} | {flops / t / 1e9:.0f} | {ms[-1] / t:.3f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
