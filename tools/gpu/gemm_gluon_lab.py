"""Lab: a warp-specialized Gluon matmul (bias and GELU in their own partition) against fused-gemm.

    python3 tools/gpu/gemm_gluon_lab.py LAB_GLUON_GEMM_PY

LAB_GLUON_GEMM_PY defines matmul_ws(a, w, bias=None, gelu=False, **config) -> c for a (M, K),
w (N, K) row-major bf16 (session 12's: `tools/gpu/gluon_gemm_ws.py`). First its
results against an fp32 reference on ragged and real shapes (beside torch's bf16 result, for
scale); then, for the issue's three products, plain and bias + GELU, the lab kernel, fused-gemm's
`matmul`, torch's F.linear (+ F.gelu) timed together by fused-gemm's tuner timer (CUDA-graph
replays, interleaved rounds, medians). A lab tool for the GPU runs recorded in NOTES.md.
"""

from __future__ import annotations

import importlib.util
import inspect
import statistics
import sys

import torch
import torch.nn.functional as F

from fused_gemm import matmul
from fused_gemm.ops import tuning

CHECKS = [(1000, 512, 768), (4096, 1024, 1000), (333, 2048, 2048), (16384, 2048, 8192)]
PRODUCTS = [(16384, 2048, 8192), (16384, 8192, 2048), (16384, 2048, 6144)]


def _load(path: str):
    spec = importlib.util.spec_from_file_location("gluon_gemm_lab", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.matmul_ws


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref).norm() / ref.norm()).item()


def _providers(matmul_ws, a, w, bias, gelu, out):
    """(name, call) of the lab kernel, fused-gemm's matmul and torch's F.linear (+ F.gelu)."""

    def torch_call():
        y = F.linear(a, w, bias)
        return F.gelu(y) if gelu else y

    variants = [("gluon ws (lab)", lambda: matmul_ws(a, w, bias, gelu, out=out))]
    if not gelu:  # the epilogue partition hands each tile back unread (timing only, nothing stored)
        variants.append(("gluon ws, epilogue skipped", lambda: matmul_ws(a, w, None, False, handoff=False, out=out)))
        if "inline" in inspect.signature(matmul_ws).parameters:  # the MMA warps store their own tiles
            variants.append(
                ("gluon, epilogue in the MMA warps", lambda: matmul_ws(a, w, None, False, inline=True, out=out))
            )
    return variants + [
        ("fused-gemm", lambda: matmul(a, w.t(), bias, activation="gelu" if gelu else None)),
        ("torch", torch_call),
    ]


def main(path: str) -> None:
    matmul_ws = _load(path)
    print("| M, K, N | epilogue | lab rel err | torch bf16 rel err |")
    print("|---|---|---:|---:|")
    for m, k, n in CHECKS:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        for label, b, gelu in (("plain", None, False), ("+bias gelu", bias, True)):
            ref = F.linear(a.float(), w.float(), None if b is None else b.float())
            ref = F.gelu(ref) if gelu else ref
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            matmul_ws(a, w, b, gelu, out=out)
            torch.cuda.synchronize()
            theirs = F.linear(a, w, b)
            theirs = F.gelu(theirs) if gelu else theirs
            print(f"| {m}, {k}, {n} | {label} | {_rel(out, ref):.2e} | {_rel(theirs, ref):.2e} |", flush=True)
            if not gelu and "inline" in inspect.signature(matmul_ws).parameters:
                out.fill_(float("nan"))
                matmul_ws(a, w, None, False, inline=True, out=out)
                print(f"| {m}, {k}, {n} | plain, inline | {_rel(out, ref):.2e} | |", flush=True)
    print("\n| M, K, N | epilogue | provider | ms | TFLOP/s | torch / provider |")
    print("|---|---|---|---:|---:|---:|")
    for m, k, n in PRODUCTS:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        for label, b, gelu in (("plain", None, False), ("+bias gelu", bias, True)):
            providers = _providers(matmul_ws, a, w, b, gelu, out)
            for _, call in providers:
                call()
            ms = [statistics.median(t) for t in tuning.replay_rounds([c for _, c in providers], tuning.ROUNDS)]
            flops = 2 * m * n * k
            for (name, _), t in zip(providers, ms):
                print(f"| {m}, {k}, {n} | {label} | {name} | {t:.4f} | {flops / t / 1e9:.0f} | {ms[-1] / t:.3f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
