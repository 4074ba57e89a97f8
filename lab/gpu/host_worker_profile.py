"""cProfile of one op's backward where autograd runs it (the engine's device thread) and of the
same launcher on the main thread, to see which calls cost more there.

python3 lab/gpu/host_worker_profile.py
"""

import cProfile
import pstats
import time

import torch

import fused_norm_xent as nx
from fused_norm_xent.ops import norm as norm_ops

N = 400


def main():
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for _ in range(30):
        nx.rms_norm(x, [1024], w).sum().backward()
    function = norm_ops.NormFunction
    original = function.backward
    worker = cProfile.Profile()
    spent = [0.0]

    def profiled(ctx, *grads):
        start = time.perf_counter()
        worker.enable()
        try:
            return original(ctx, *grads)
        finally:
            worker.disable()
            spent[0] += time.perf_counter() - start

    function.backward = staticmethod(profiled)
    for _ in range(N):
        nx.rms_norm(x, [1024], w).sum().backward()
    torch.cuda.synchronize()
    function.backward = staticmethod(original)
    print(f"== worker thread: {spent[0] / N * 1e6:.1f} us per backward (profiled)")
    pstats.Stats(worker).sort_stats("tottime").print_stats(22)

    xd, wd = x.detach(), w.detach()
    _, stats = norm_ops.norm_forward(xd, wd, None, [1024], None, 0.0, True)
    dy = torch.ones(64, 1024, device="cuda", dtype=torch.bfloat16)
    main_prof = cProfile.Profile()
    start = time.perf_counter()
    main_prof.enable()
    for _ in range(N):
        norm_ops.norm_backward(dy, xd, wd, None, stats, [1024], 0.0, True)
    main_prof.disable()
    torch.cuda.synchronize()
    print(f"== main thread launcher: {(time.perf_counter() - start) / N * 1e6:.1f} us per call (profiled)")
    pstats.Stats(main_prof).sort_stats("tottime").print_stats(16)

    fwd = cProfile.Profile()
    fwd.enable()
    for _ in range(N):
        nx.rms_norm(x, [1024], w)
    fwd.disable()
    print("== forward with autograd, main thread")
    pstats.Stats(fwd).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
