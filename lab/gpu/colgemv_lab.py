"""One row times input-major weights (W (K, N), N contiguous), as fused-swiglu stores its MLP:
the gate/up product with SwiGLU, and the down projection, at batch-1 decode.

    python3 lab/gpu/colgemv_lab.py           (on a GPU; markdown on stdout)
    TRITON_INTERPRET=1 python3 lab/gpu/colgemv_lab.py check     (CPU: the kernel against torch)

fused-gemm's GEMV kernel reads weight rows contiguous in K; these weights are contiguous in N,
where a program owning a few columns would read 8-32 byte pieces of each row. Here a program owns
BLOCK_N columns (128-256 bytes of each row) and one of SPLIT_K slices of K; each slice's fp32
partial sums go to a workspace, and the last program of a column block to finish (an atomic count
per block) sums the slices in a fixed order (deterministic) and applies the epilogue: SwiGLU of
the gate and up sums, or a cast. The count is reset by that program, so the workspace needs no
clearing between calls (nor between replays of a CUDA graph).

On the GPU: each provider's calls cycle over enough weight copies (>= 256 MB) that none stays in
L2, replayed from one CUDA graph; GB/s counts the weights' bytes. Anchors in the same run:
fused-swiglu's forward (its tuned skinny tiles) and cuBLAS (x @ Wg, x @ Wu, then silu * mul; the
down projection as x @ Wd). A lab tool: it prints a table and changes nothing.
"""

from __future__ import annotations

import itertools
import os
import sys

import torch
import triton
import triton.language as tl
from gemv_sweep import graph_us

D_MODEL, D_FF = 2048, 5632  # llama-1.4B
# (BLOCK_N, BLOCK_K, SPLIT_K, num_warps). COLGEMV_WIDE=1: programs that read 0.5-2 KB of each
# weight row (HBM pages are read whole; 64-256-byte pieces of rows 11 KB apart may waste them),
# the accumulator tiles capped at 8192 fp32 values.
TILES = list(itertools.product((32, 64, 128), (16, 32, 64), (1, 2, 4, 8), (4, 8)))
if os.environ.get("COLGEMV_WIDE") == "1":
    TILES = [(n, k, s, w) for n, k, s, w in itertools.product((256, 512, 1024), (4, 8, 16), (4, 8, 16, 32), (4, 8))
             if n * k <= 8192]  # fmt: skip


@triton.jit
def _colgemv_kernel(
    x_ptr, wg_ptr, wu_ptr, y_ptr, ws_ptr, count_ptr, N, K, k_per_split,
    GATED: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """y = silu(x Wg) * (x Wu) (GATED) or y = x Wg, for x (K,), Wg and Wu (K, N) row-major."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_in = cols < N
    offs_k = tl.arange(0, BLOCK_K)
    k_lo = split * k_per_split
    acc_g = tl.zeros([BLOCK_K, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_K, BLOCK_N], tl.float32)
    for k in range(k_lo, tl.minimum(k_lo + k_per_split, K), BLOCK_K):
        rows = k + offs_k
        row_in = rows < tl.minimum(k_lo + k_per_split, K)
        x = tl.load(x_ptr + rows, mask=row_in, other=0.0).to(tl.float32)
        offs = rows.to(tl.int64)[:, None] * N + cols[None, :]
        mask = row_in[:, None] & col_in[None, :]
        acc_g += tl.load(wg_ptr + offs, mask=mask, other=0.0).to(tl.float32) * x[:, None]
        if GATED:
            acc_u += tl.load(wu_ptr + offs, mask=mask, other=0.0).to(tl.float32) * x[:, None]
    g = tl.sum(acc_g, 0)
    u = tl.sum(acc_u, 0)
    if SPLIT_K > 1:
        # This slice's sums into the workspace (SPLIT_K, 2, N); the last slice of the block to
        # count in sums them all in slice order.
        tl.store(ws_ptr + (split * 2) * N + cols, g, mask=col_in)
        if GATED:
            tl.store(ws_ptr + (split * 2 + 1) * N + cols, u, mask=col_in)
        done = tl.atomic_add(count_ptr + pid_n, 1)  # acq_rel: the stores above are visible first
        last = done == SPLIT_K - 1
        if last:
            g = tl.zeros([BLOCK_N], tl.float32)
            u = tl.zeros([BLOCK_N], tl.float32)
            for s in range(SPLIT_K):
                g += tl.load(ws_ptr + (s * 2) * N + cols, mask=col_in, other=0.0, cache_modifier=".cg")
                if GATED:
                    u += tl.load(ws_ptr + (s * 2 + 1) * N + cols, mask=col_in, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + pid_n, 0)
    else:
        last = True
    if last:
        if GATED:
            y = g / (1.0 + tl.exp(-g)) * u
        else:
            y = g
        tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=col_in)


class ColGemv:
    """The kernel with its workspace and counts for one (K, N) and tile."""

    def __init__(self, k, n, device, block_n, block_k, split_k, num_warps, gated):
        self.k, self.n, self.gated = k, n, gated
        self.block_n, self.block_k, self.split_k, self.num_warps = block_n, block_k, split_k, num_warps
        blocks = triton.cdiv(n, block_n)
        per = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
        self.k_per_split = per
        self.grid = (blocks, split_k)
        self.ws = torch.empty(split_k * 2 * n, dtype=torch.float32, device=device)
        self.count = torch.zeros(blocks, dtype=torch.int32, device=device)

    def __call__(self, x, wg, wu, y):
        _colgemv_kernel[self.grid](
            x, wg, wg if wu is None else wu, y, self.ws, self.count, self.n, self.k, self.k_per_split,
            GATED=self.gated, SPLIT_K=self.split_k, BLOCK_N=self.block_n, BLOCK_K=self.block_k,
            num_warps=self.num_warps,
        )  # fmt: skip
        return y


def reference(x, wg, wu):
    g = x.float() @ wg.float()
    return g if wu is None else torch.nn.functional.silu(g) * (x.float() @ wu.float())


def check() -> None:
    """Under the interpreter: both epilogues, ragged K slices and column blocks, two calls in a row
    (the counts reset), against torch in fp32."""
    torch.manual_seed(0)
    for (k, n, block_n, block_k, split_k), gated in itertools.product(
        [(100, 70, 32, 16, 3), (64, 33, 16, 16, 1), (200, 130, 64, 32, 4)], [True, False]
    ):  # fmt: skip
        x = torch.randn(k, dtype=torch.bfloat16)
        wg = torch.randn(k, n, dtype=torch.bfloat16) * k**-0.5
        wu = torch.randn(k, n, dtype=torch.bfloat16) * k**-0.5 if gated else None
        run = ColGemv(k, n, "cpu", block_n, block_k, split_k, 4, gated)
        for _ in range(2):
            y = run(x, wg, wu, torch.full((n,), float("nan"), dtype=torch.float32))
            err = ((y - reference(x, wg, wu)).abs().max()).item()
            assert err < 1e-4, (k, n, split_k, gated, err)
        assert int(run.count.sum()) == 0
        print(f"ok K {k} N {n} split {split_k} gated {gated}: max error {err:.1e}")


def sweep(name: str, k: int, n: int, gated: bool) -> None:
    from fused_swiglu import swiglu

    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    nbytes = k * n * 2 * (2 if gated else 1)
    copies = max(2, -(-256 * 2**20 // nbytes))
    weights = [(torch.randn(k, n, **bf16) * 0.02, torch.randn(k, n, **bf16) * 0.02 if gated else None)
               for _ in range(copies)]  # fmt: skip
    x = torch.randn(1, k, **bf16)
    y = torch.empty(1, n, **bf16)
    expected = reference(x[0], *weights[0])
    rows = []

    def report(provider, make, out=None):
        try:
            us = graph_us([make(*w) for w in weights] * max(1, 16 // copies))
        except Exception as error:  # noqa: BLE001 - a lab report: show what failed
            rows.append((provider, float("nan"), f"failed: {str(error).splitlines()[0][:80]}"))
            return
        note = ""
        if out is not None:
            err = ((out().float().flatten() - expected).norm() / expected.norm()).item()
            note = f"rel err {err:.1e}" if err > 2e-2 else ""
        rows.append((provider, us, note))

    if gated:
        report("cuBLAS x@Wg, x@Wu, silu*mul",
               lambda wg, wu: lambda: torch.nn.functional.silu(x @ wg) * (x @ wu))  # fmt: skip
        report("fused_swiglu.swiglu", lambda wg, wu: lambda: swiglu(x, wg, wu),
               lambda: swiglu(x, *weights[0]))  # fmt: skip
    else:
        report("cuBLAS x@Wd", lambda wg, wu: lambda: torch.matmul(x, wg, out=y))
    for block_n, block_k, split_k, warps in TILES:
        run = ColGemv(k, n, "cuda", block_n, block_k, split_k, warps, gated)
        report(f"colgemv {block_n}x{block_k} split {split_k} w{warps}",
               lambda wg, wu, run=run: lambda: run(x, wg, wu, y), lambda run=run: run(x, *weights[0], y))  # fmt: skip
    ok = [r for r in rows if r[1] == r[1] and not r[2]]
    best = min(ok, key=lambda r: r[1])[0] if ok else None
    for provider, us, note in rows:
        mark = " (best)" if provider == best else ""
        print(f"| {name} | {k} x {n} | {provider}{mark} | {us:.2f} | {nbytes / us / 1e3:.0f} | {note} |", flush=True)


def main() -> None:
    print("| product | K x N | provider | us | GB/s | note |")
    print("|---|---|---|---:|---:|---|")
    sweep("gate/up + SwiGLU", D_MODEL, D_FF, True)
    torch.cuda.empty_cache()
    sweep("down", D_FF, D_MODEL, False)


if __name__ == "__main__":
    check() if sys.argv[1:2] == ["check"] else main()
