"""Why an eager backward costs more host time through autograd's engine than its launcher alone.

python3 lab/gpu/host_backward_diag.py     (prints what it finds)

For one RMSNorm call at 64x1024 bf16: which path each Launch takes (the compiled launcher or the
JIT) on which thread, and the time of the backward called four ways: through the engine, by its
node's apply on the main thread, the launcher alone on the main thread and on another thread.
"""

import collections
import threading
import time

import torch
from tritonformer_testkit.bench import eager_us_per_call

import fused_norm_xent as nx
from fused_norm_xent._runtime import launch as launch_mod
from fused_norm_xent.ops import norm as norm_ops

PATHS = collections.Counter()
SPENT = collections.defaultdict(float)
original_call = launch_mod.Launch.__call__


def counting_call(self, *per_call):
    key = self._key(per_call) if launch_mod.DIRECT_LAUNCH else None
    hit = key is not None and key in self._compiled and not launch_mod._hooks_installed()
    where = "main" if threading.current_thread() is threading.main_thread() else "other"
    PATHS[(self.kernel.fn.__name__, where, "direct" if hit else "jit")] += 1
    start = time.perf_counter()
    try:
        return original_call(self, *per_call)
    finally:
        SPENT[(self.kernel.fn.__name__, where)] += time.perf_counter() - start


def main():
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(64, 1024, device=dev, dtype=dt, requires_grad=True)
    w = torch.randn(1024, device=dev, dtype=dt, requires_grad=True)
    xd, wd = x.detach(), w.detach()
    y = nx.rms_norm(x, [1024], w)
    dy = torch.ones_like(y)
    _, stats = norm_ops.norm_forward(xd, wd, None, [1024], None, 0.0, True)
    print("DIRECT_LAUNCH", launch_mod.DIRECT_LAUNCH)

    launch_mod.Launch.__call__ = counting_call
    function = norm_ops.NormFunction
    original_backward = function.backward

    def timed_backward(ctx, *grads):
        begin = time.perf_counter()
        try:
            return original_backward(ctx, *grads)
        finally:
            SPENT[("Function.backward", threading.current_thread() is threading.main_thread())] += (
                time.perf_counter() - begin
            )

    function.backward = staticmethod(timed_backward)
    for _ in range(20):
        nx.rms_norm(x, [1024], w).sum().backward()
    torch.cuda.synchronize()
    PATHS.clear()
    SPENT.clear()
    n = 300
    begin = time.perf_counter()
    for _ in range(n):
        nx.rms_norm(x, [1024], w).sum().backward()
    torch.cuda.synchronize()
    total = (time.perf_counter() - begin) / n * 1e6
    print(f"paths over {n} fwd+bwd:", dict(PATHS))
    print(
        f"total us per fwd+bwd {total:.1f}; us per call inside:",
        {str(k): round(v / n * 1e6, 1) for k, v in SPENT.items()},
    )
    launch_mod.Launch.__call__ = original_call
    function.backward = staticmethod(original_backward)

    def in_thread(fn):
        result = []
        t = threading.Thread(target=lambda: result.append(eager_us_per_call(fn)))
        t.start()
        t.join()
        return result[0]

    rows = {
        "fwd+bwd, .sum().backward()": lambda: nx.rms_norm(x, [1024], w).sum().backward(),
        "fwd + autograd.grad(dy contiguous)": lambda: torch.autograd.grad(nx.rms_norm(x, [1024], w), (x, w), dy),
        "norm_backward launcher, main": lambda: norm_ops.norm_backward(dy, xd, wd, None, stats, [1024], 0.0, True),
        "x.sum().backward() (leaf)": lambda: x.sum().backward(),
        "torch rms_norm fwd+bwd": lambda: torch.nn.functional.rms_norm(x, [1024], w).sum().backward(),
    }
    for name, fn in rows.items():
        print(f"| {name} | {eager_us_per_call(fn):.1f} |")
    print(
        f"| norm_backward launcher, other thread | "
        f"{in_thread(lambda: norm_ops.norm_backward(dy, xd, wd, None, stats, [1024], 0.0, True)):.1f} |"
    )
    print(f"| fwd+bwd in another thread | {in_thread(lambda: nx.rms_norm(x, [1024], w).sum().backward()):.1f} |")
    return
    import cProfile
    import pstats

    fn = lambda: nx.rms_norm(x, [1024], w).grad_fn.apply(dy)  # noqa: E731
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        fn()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
