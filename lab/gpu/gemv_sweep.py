"""Batch-1 decode products (one row times a weight) at llama-1.4B's shapes, read from HBM: the
package's launcher, cuBLAS, the portable kernel at pinned tiles, and a plain GEMV kernel.

    python3 lab/gpu/gemv_sweep.py     (on a GPU; markdown on stdout)

Each provider's calls cycle over enough copies of the weight (>= 256 MB) that the L2 cache holds
none of them from one call to the next, as in a decode step; calls are replayed from one CUDA
graph, so no host time counts. GB/s counts the weight's bytes. A lab tool: it prints a table and
changes nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

SHAPES = {"qkv": (6144, 2048), "proj": (2048, 2048), "gate+up": (11264, 2048), "down": (2048, 5632),
          "head": (32000, 2048)}  # fmt: skip
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of the portable kernel
PORTABLE_TILES = [(16, 16, 512, 4, 4), (16, 32, 256, 4, 4), (16, 64, 128, 4, 4), (16, 64, 128, 4, 6),
                  (16, 128, 64, 4, 4), (16, 128, 128, 4, 3), (16, 128, 128, 8, 4), (16, 64, 256, 4, 3),
                  (16, 256, 64, 8, 4)]  # fmt: skip
# (BLOCK_N, BLOCK_K, num_warps, num_stages) of the plain GEMV
GEMV_TILES = [(n, k, w, s) for n in (4, 8, 16, 32) for k in (256, 512) for w in (4, 8) for s in (2, 4)]


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y = W x for W (N, K) row-major: BLOCK_N rows per program, fp32 products summed in registers."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    for k in range(0, K, BLOCK_K):
        w = tl.load(w_ptrs + k, mask=rows[:, None] < N)
        x = tl.load(x_ptr + k + cols)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    tl.store(y_ptr + rows, tl.sum(acc, 1).to(y_ptr.dtype.element_ty), mask=rows < N)


def graph_us(calls) -> float:
    """Microseconds per call of `calls` (a list of thunks) replayed from one CUDA graph."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return do_bench(graph.replay, warmup=5, rep=50, return_mode="median") * 1e3 / len(calls)


def sweep(name: str, n: int, k: int) -> None:
    """Every provider on one (N, K) product; a table row each."""
    from fused_gemm import matmul
    from fused_gemm.kernels.matmul import _matmul_kernel

    portable = _matmul_kernel.fn.fn
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    nbytes = n * k * 2
    copies = max(2, -(-256 * 2**20 // nbytes))
    weights = [torch.randn(n, k, **bf16) * 0.02 for _ in range(copies)]
    x = torch.randn(1, k, **bf16)
    y = torch.empty(1, n, **bf16)
    reference = F.linear(x, weights[0]).float()
    rows = []

    def report(provider, make, check=None):
        try:
            us = graph_us([make(w) for w in weights] * max(1, 16 // copies))
        except Exception as error:  # noqa: BLE001 - a lab report: show what failed
            rows.append((provider, float("nan"), f"failed: {str(error).splitlines()[0][:80]}"))
            return
        if check is not None:
            err = ((check().float() - reference).norm() / reference.norm()).item()
            if err > 2e-2:
                rows.append((provider, us, f"wrong (rel err {err:.1e})"))
                return
        rows.append((provider, us, ""))

    def launch_portable(w, bm, bn, bk, warps, stages):
        return lambda: portable[(triton.cdiv(n, bn),)](
            x, w.t(), y, y, y, 0, k, 1, 0, 1, k, 0, n, 1, 0, 1, n, k,
            HAS_BIAS=False, ACTIVATION=0, STORE_Z=False, ALLOW_TF32=False, UPCAST=False, BLOCK_M=bm,
            BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EVEN_K=k % bk == 0, num_warps=warps, num_stages=stages,
        )  # fmt: skip

    def launch_gemv(w, bn, bk, warps, stages):
        return lambda: _gemv_kernel[(triton.cdiv(n, bn),)](x, w, y, n, k, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                                                           num_stages=stages)  # fmt: skip

    def checked(make, *tile):
        def check():
            make(weights[0], *tile)()
            return y

        return check

    report("cuBLAS (F.linear)", lambda w: lambda: torch.matmul(x, w.t(), out=y))
    report("package (fused_gemm.matmul)", lambda w: lambda: matmul(x, w.t()), lambda: matmul(x, weights[0].t()))
    for tile in PORTABLE_TILES:
        report("portable {}x{}x{} w{} s{}".format(*tile), lambda w, t=tile: launch_portable(w, *t),
               checked(launch_portable, *tile))  # fmt: skip
    for tile in GEMV_TILES:
        if k % tile[1] == 0:
            label = "gemv {}x{} w{} s{}".format(*tile)
            report(label, lambda w, t=tile: launch_gemv(w, *t), checked(launch_gemv, *tile))
    best = min((r for r in rows if r[1] == r[1]), key=lambda r: r[1])
    for provider, us, note in rows:
        mark = " (best)" if provider == best[0] else ""
        rate = nbytes / us / 1e3 if us == us else float("nan")
        print(f"| {name} | {n} x {k} | {nbytes / 2**20:.1f} | {provider}{mark} {note} | {us:.2f} | {rate:.0f} |",
              flush=True)  # fmt: skip


def main() -> None:
    print("| module | N x K | MB | provider | us | GB/s |")
    print("|---|---|---:|---|---:|---:|")
    for name, (n, k) in SHAPES.items():
        sweep(name, n, k)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
