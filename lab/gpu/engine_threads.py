"""Autograd's device threads against backward on the calling thread, for small ops and model steps.

python3 lab/gpu/engine_threads.py [PRESET:CONTEXT:BATCH ...]

torch runs a CUDA graph's backward on a per-device worker thread; with
torch.autograd.set_multithreading_enabled(False) the calling thread runs it. Host microseconds per
fwd+bwd of rms_norm 64x1024 (ours, torch) and of a leaf's .sum().backward(), then eager model
steps, each default / single-threaded, in alternating pairs on one machine.
"""

import sys

import torch
from tritonformer_testkit.bench import eager_us_per_call

import fused_norm_xent as nx
from lab import step_ms
from tritonformer.bench import Point, point_config, training_step


def pairs(measure, rounds=3):
    out = {True: [], False: []}
    for _ in range(rounds):
        for threads in (True, False):
            with torch.autograd.set_multithreading_enabled(threads):
                out[threads].append(measure())
    return out


def show(name, out, unit):
    fmt = ", ".join
    print(f"| {name} | {fmt(f'{v:.1f}' for v in out[True])} | {fmt(f'{v:.1f}' for v in out[False])} | {unit} |")


def main():
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    print("| call | device threads | calling thread | unit |")
    print("|---|---|---|---|")
    show(
        "ours rms_norm fwd+bwd",
        pairs(lambda: eager_us_per_call(lambda: nx.rms_norm(x, [1024], w).sum().backward())),
        "us",
    )
    show(
        "torch rms_norm fwd+bwd",
        pairs(lambda: eager_us_per_call(lambda: torch.nn.functional.rms_norm(x, [1024], w).sum().backward())),
        "us",
    )
    show("leaf .sum().backward()", pairs(lambda: eager_us_per_call(lambda: x.sum().backward())), "us")
    for text in sys.argv[1:]:
        point = Point.parse(text)
        config = point_config(point, "tritonformer", {})
        step = training_step(point, "tritonformer", config, torch.device("cuda"))
        step.warm()
        fn = step.fn
        show(f"tritonformer step {text}", pairs(lambda fn=fn: step_ms(fn)), "ms")
        del step, fn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
