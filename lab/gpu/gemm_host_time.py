"""fused-gemm's host time per call, launched through Triton's JIT against the direct launches.

    python3 lab/gpu/gemm_host_time.py

For the forward (no grad) and forward+backward, plain and bias+GELU, at a size whose kernels
take a few microseconds (so the GPU never holds the host back): the microseconds the host
spends issuing one call, median of 7 windows of 200 calls, with fused_gemm's direct launches
off (every launch through the JIT) and on; torch's F.linear and F.gelu(F.linear) beside them.
Then checks that a direct launch computes what the JIT launch of the same plan did (bit for
bit), and prints the host's Python hot spots of the bias+GELU forward (cProfile).

A lab tool for the GPU runs recorded in NOTES.md; prints tables, changes nothing.
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

import fused_gemm._compat as compat
from fused_gemm import matmul
from fused_gemm.ops import launch

M, K, N = 2048, 1024, 1024
CALLS, WINDOWS = 200, 7


def _inputs(grad: bool):
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
    w = (torch.randn(N, K, device="cuda") / K**0.5).to(torch.bfloat16).requires_grad_(grad)
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
    return x, w, b


def _cases():
    """name -> a call of no arguments."""
    forwards = {
        "ours plain": lambda x, w, b: matmul(x, w.t()),
        "ours bias+gelu": lambda x, w, b: matmul(x, w.t(), b, "gelu"),
        "F.linear": lambda x, w, b: F.linear(x, w),
        "F.gelu(F.linear)": lambda x, w, b: F.gelu(F.linear(x, w, b)),
    }
    cases = {}
    for name, forward in forwards.items():
        x, w, b = _inputs(False)
        cases[f"{name} fwd"] = lambda f=forward, x=x, w=w, b=b: f(x, w, b)
        xg, wg, bg = _inputs(True)
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        cases[f"{name} fwd+bwd"] = lambda f=forward, x=xg, w=wg, b=bg, dy=dy: torch.autograd.grad(
            f(x, w, b), (x, w, b), dy, allow_unused=True
        )
    return cases


def _host_us(fn) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    windows = []
    for _ in range(WINDOWS):
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        windows.append((time.perf_counter() - start) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(windows)


def _set_direct(on: bool) -> None:
    """Direct launches on or off; the plans are dropped so that new ones are made under the setting."""
    compat.DIRECT_LAUNCH = on
    launch._tma_plan.cache_clear()
    launch._grad_launch.cache_clear()


def _same_plan_check() -> None:
    """The first call of a plan goes through the JIT, the next ones through the direct launch: same bits."""
    _set_direct(True)
    x, w, b = _inputs(True)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    results = []
    for _ in range(3):
        y = matmul(x, w.t(), b, "gelu")
        results.append((y, *torch.autograd.grad(y, (x, w, b), dy)))
    same = all(torch.equal(first, later) for first, later in zip(results[0], results[2]))
    # The forward's plan (the key of the calls above: bias + GELU with z stored).
    c = torch.empty(1, M, N, device="cuda", dtype=torch.bfloat16)
    plan = launch.tma_plan(x.detach().reshape(1, M, K), w.detach().t().unsqueeze(0), c, torch.empty_like(c), b, 2)
    direct = plan is not None and plan.launch is not None and plan.launch.direct is not None
    print(f"direct launch == JIT launch, bit for bit (output, dx, dw, dbias): {same}")
    print(f"the forward's plan launches directly: {direct}")


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", __import__("triton").__version__)
    print(f"x {M}x{K} @ w {K}x{N}, bf16; host us per call, median of {WINDOWS} windows of {CALLS} calls")
    cases = _cases()
    rows = {}
    for direct in (False, True):
        _set_direct(direct)
        for name, fn in cases.items():
            if name.startswith("ours") or direct:
                rows.setdefault(name, {})[direct] = _host_us(fn)
    print("| call | JIT launches | direct launches |")
    print("|---|---:|---:|")
    for name, by_mode in rows.items():
        jit = f"{by_mode[False]:.1f}" if False in by_mode else ""
        print(f"| {name} | {jit} | {by_mode[True]:.1f} |")
    _same_plan_check()
    fn = cases["ours bias+gelu fwd"]
    for _ in range(3):  # the check above made new plans: tune this one before profiling
        fn()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(CALLS):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    print(f"== cProfile, ours bias+gelu fwd, {CALLS} calls, direct launches on")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(14)


if __name__ == "__main__":
    main()
