"""What programmatic dependent launch (PDL) could save in a batch-1 decode step, on a synthetic chain.

    python3 lab/gpu/pdl_chain.py      (Hopper, Triton >= 3.4; markdown on stdout)

The chain has the launches of one llama-1.4B decode step (24 layers of norm, qkv GEMV, two small
kernels standing in for RoPE and attention, output GEMV, norm, gate/up GEMV, down GEMV; then the
final norm and the head), each kernel a minimal Triton kernel, the whole step replayed from one
CUDA graph. Variants: plain launches; PDL with each kernel's griddepcontrol.wait at its top; PDL
with the GEMVs' first weight tile loaded before the wait (weights do not depend on the previous
kernel). A lab tool: it prints a table and changes nothing.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.testing import do_bench

D, QKV, FF, VOCAB, LAYERS = 2048, 6144, 5632, 32000, 24


@triton.jit
def _gemv(w_ptr, x_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
          PREFETCH: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None] * K + cols[None, :]
    if PDL:
        gdc_launch_dependents()
    if PREFETCH:
        w = tl.load(w_ptrs, mask=rows[:, None] < N)
    if PDL:
        gdc_wait()
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        if not PREFETCH:
            w = tl.load(w_ptrs + k, mask=rows[:, None] < N)
        x = tl.load(x_ptr + k + cols)
        acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], 1)
        if PREFETCH:
            w = tl.load(w_ptrs + k + BLOCK_K, mask=(rows[:, None] < N) & (k + BLOCK_K < K))
    tl.store(y_ptr + rows, acc.to(y_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def _rownorm(x_ptr, y_ptr, N, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x, 0) / N + 1e-6)
    tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=cols < N)


def step(buffers, weights, pdl: bool, prefetch: bool) -> None:
    x, h, big, out = buffers

    def gemv(w, src, dst):
        n, k = w.shape
        _gemv[(triton.cdiv(n, 16),)](w, src, dst, n, k, BLOCK_N=16, BLOCK_K=512, PDL=pdl, PREFETCH=prefetch,
                                     num_warps=4, launch_pdl=pdl)  # fmt: skip

    def norm(src, dst, n=D):
        _rownorm[(1,)](src, dst, n, BLOCK=triton.next_power_of_2(n), PDL=pdl, num_warps=4, launch_pdl=pdl)

    for qkv, proj, up, down in weights[:-1]:
        norm(x, h)
        gemv(qkv, h, big)
        norm(big, big, 256)  # RoPE's stand-in
        norm(big, h, 1024)  # attention's stand-in
        gemv(proj, h, x)
        norm(x, h)
        gemv(up, h, big)
        gemv(down, big, x)
    norm(x, h)
    gemv(weights[-1], h, out)


def main() -> None:
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    shapes = ((QKV, D), (D, D), (2 * FF, D), (D, FF))
    weights = [tuple(torch.randn(*shape, **bf16) * 0.02 for shape in shapes) for _ in range(LAYERS)]
    weights.append(torch.randn(VOCAB, D, **bf16) * 0.02)
    buffers = (torch.randn(D, **bf16), torch.empty(D, **bf16), torch.empty(2 * FF, **bf16), torch.empty(VOCAB, **bf16))
    weight_bytes = sum(w.numel() * 2 for group in weights[:-1] for w in group) + weights[-1].numel() * 2
    print(f"weights {weight_bytes / 1e9:.2f} GB per step; {LAYERS * 8 + 2} launches\n")
    print("| variant | graph replay us per step | GB/s | eager us per step | out equal |")
    print("|---|---:|---:|---:|---|")
    reference, start = None, buffers[0].clone()
    variants = (("plain", False, False), ("PDL, wait at top", True, False),
                ("PDL, first weight tile before the wait", True, True), ("plain again", False, False))  # fmt: skip
    for name, pdl, prefetch in variants:
        run = functools.partial(step, buffers, weights, pdl, prefetch)
        run()
        torch.cuda.synchronize()
        eager = do_bench(run, warmup=5, rep=100, return_mode="median") * 1e3
        try:
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                run()
                torch.cuda.synchronize()
                with torch.cuda.graph(graph, stream=stream):
                    run()
            replay = do_bench(graph.replay, warmup=10, rep=200, return_mode="median") * 1e3
        except Exception as error:  # noqa: BLE001 - a lab report: show what failed
            print(f"| {name} | capture failed: {str(error)[:120]} | | {eager:.0f} | |")
            continue
        buffers[0].copy_(start)
        run()
        torch.cuda.synchronize()
        result = buffers[3].clone()
        same = "" if reference is None else str(torch.equal(result, reference))
        if reference is None:
            reference = result
        print(f"| {name} | {replay:.0f} | {weight_bytes / replay / 1e3:.0f} | {eager:.0f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
