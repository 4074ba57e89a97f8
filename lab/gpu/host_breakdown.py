"""Where an eager call's host microseconds go on the GPU machine, piece by piece.

python3 lab/gpu/host_breakdown.py      (prints a markdown table)

Each row times one piece alone, back to back with one synchronization at the end (the GPU is
idle at these sizes, so this is host time): torch's op, our op, our launcher without autograd,
the Launch call alone, the compiled kernel's raw launcher, allocations, an autograd.Function that
does nothing, and the backward pass of each through the engine.
"""

import torch
import torch.nn.functional as F
from tritonformer_testkit.bench import eager_us_per_call

import fused_norm_xent as nx
from fused_norm_xent.ops import norm as norm_ops


class Nothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


def main():
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(64, 1024, device=dev, dtype=dt, requires_grad=True)
    w = torch.randn(1024, device=dev, dtype=dt, requires_grad=True)
    xd, wd = x.detach(), w.detach()
    y, stats = norm_ops.norm_forward(xd, wd, None, [1024], None, 0.0, True)
    dy = torch.ones_like(y)
    plan = norm_ops._forward_plan(
        xd.shape, xd.stride(), dt, xd.device, norm_ops._param_key(wd), None, None, (1024,), None, 0.0, True, 0.0, False
    )
    launch = plan.launch
    key = launch._key((xd, wd, None, y, stats))
    run, function, metadata = launch._compiled[key]
    args = launch.arguments((xd, wd, None, y, stats))
    stream = torch.cuda.current_stream().cuda_stream
    g = launch.grid

    rows = {
        "torch F.rms_norm fwd (grad)": lambda: F.rms_norm(x, [1024], w),
        "torch F.rms_norm fwd+bwd": lambda: F.rms_norm(x, [1024], w).sum().backward(),
        "torch x*2 fwd (grad)": lambda: x * 2,
        "torch (x*2).sum().backward()": lambda: (x * 2).sum().backward(),
        "ours rms_norm fwd (grad)": lambda: nx.rms_norm(x, [1024], w),
        "ours rms_norm fwd (no grad)": lambda: nx.rms_norm(xd, [1024], wd),
        "ours rms_norm fwd+bwd": lambda: nx.rms_norm(x, [1024], w).sum().backward(),
        "norm_forward launcher": lambda: norm_ops.norm_forward(xd, wd, None, [1024], None, 0.0, True),
        "norm_backward launcher": lambda: norm_ops.norm_backward(dy, xd, wd, None, stats, [1024], 0.0, True),
        "Launch call": lambda: launch(xd, wd, None, y, stats),
        "Launch key": lambda: launch._key((xd, wd, None, y, stats)),
        "raw compiled run": lambda: run(g[0], g[1], g[2], stream, function, metadata, None, None, None, *args),
        "empty_like + empty": lambda: (torch.empty_like(xd), torch.empty(64, dtype=torch.float32, device=dev)),
        "Nothing.apply": lambda: Nothing.apply(x, w),
        "Nothing fwd+bwd": lambda: Nothing.apply(x, w).sum().backward(),
        "cached_plan lookup": lambda: norm_ops.cached_plan(
            norm_ops._forward_plan,
            (
                xd.shape,
                xd.stride(),
                xd.dtype,
                xd.device,
                norm_ops._param_key(wd),
                None,
                None,
                (1024,),
                None,
                0.0,
                True,
                0.0,
                False,
            ),
        ),
    }
    print("| piece | us/call |")
    print("|---|---:|")
    for name, fn in rows.items():
        print(f"| {name} | {eager_us_per_call(fn):.1f} |")


if __name__ == "__main__":
    main()
