"""The host path of eager calls, measured on the CPU with every kernel launch replaced by a no-op.

python lab/host/cpu_host_profile.py [op ...] [--profile]

What it leaves out: the compiled launcher's own C call (a few microseconds on a GPU host) and
CUDA's allocator (torch.empty on a GPU costs more than on the CPU). What it keeps: everything
Python does per call (argument checks, plan lookups, autograd, allocations on the CPU, the
Launch's key), which is where eager calls lose to torch's own ops. A guide, not a GPU figure.
"""

import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import fused_attention  # noqa: E402
import fused_norm_xent as nx  # noqa: E402
import fused_rope  # noqa: E402


def _noop(*args):
    return None


def _fake_call(self, *per_call):
    """Launch.__call__'s direct path: arguments, key, the cached launcher's call."""
    args = self.arguments(per_call)
    key = [0]
    for slot in self._tensor_slots:
        value = per_call[slot]
        key.append((value.dtype, value.data_ptr() & 15 == 0) if isinstance(value, torch.Tensor) else value)
    key = tuple(key)
    grid = self.grid
    _noop(grid[0], grid[1], grid[2], 0, None, None, None, None, None, *args)


def patch_launches():
    for name, module in list(sys.modules.items()):
        launch = getattr(module, "Launch", None)
        if name.endswith("_runtime.launch") and launch is not None:
            launch.__call__ = _fake_call


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def cases():
    x = torch.randn(64, 1024, requires_grad=True)
    w = torch.randn(1024, requires_grad=True)
    b = torch.randn(1024, requires_grad=True)
    logits = torch.randn(64, 1000, requires_grad=True)
    target = torch.randint(0, 1000, (64,))
    q = torch.randn(1, 8, 128, 64, requires_grad=True)
    k = torch.randn(1, 8, 128, 64, requires_grad=True)
    cos = torch.randn(128, 64)
    sin = torch.randn(128, 64)
    qa = torch.randn(1, 128, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    ka = torch.randn(1, 128, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    va = torch.randn(1, 128, 8, 64, dtype=torch.bfloat16, requires_grad=True)

    def fb(f):
        return lambda: f().sum().backward()

    return {
        "rms_norm": (lambda: nx.rms_norm(x, [1024], w), lambda: torch.nn.functional.rms_norm(x, [1024], w)),
        "layer_norm": (lambda: nx.layer_norm(x, [1024], w, b), lambda: torch.nn.functional.layer_norm(x, [1024], w, b)),
        "cross_entropy": (
            lambda: nx.cross_entropy(logits, target),
            lambda: torch.nn.functional.cross_entropy(logits, target),
        ),
        "rope_qk": (lambda: fused_rope.apply_rotary_qk(q, k, cos, sin)[0], None),
        "flash_attention": (lambda: fused_attention.flash_attention(qa, ka, va, causal=True), None),
    }, fb


def main():
    patch_launches()
    wanted = [a for a in sys.argv[1:] if not a.startswith("--")]
    table, fb = cases()
    if "--profile" in sys.argv:
        import cProfile
        import pstats

        fn = fb(table[wanted[0]][0])
        for _ in range(50):
            fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            fn()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    print("| op | ours fwd us | ours fwd+bwd us | torch fwd us | torch fwd+bwd us |")
    print("|---|---:|---:|---:|---:|")
    for name, (ours, ref) in table.items():
        if wanted and name not in wanted:
            continue
        row = [per_call_us(ours), per_call_us(fb(ours))]
        row += [per_call_us(ref), per_call_us(fb(ref))] if ref else [float("nan")] * 2
        print(f"| {name} | " + " | ".join(f"{v:.1f}" for v in row) + " |")


if __name__ == "__main__":
    main()
