"""Where a training step's GPU waits for the host, and which kernels fill its time.

python3 lab/gpu/model_bubbles.py PRESET:CONTEXT:BATCH PROVIDER [PROVIDER ...]

Per provider: the eager step's median time, then one profiled step: kernel time summed, the
GPU's idle time between kernels (gaps over 5 us), the largest gaps with the kernels around them,
and the kernels by total time. With provider `tritonformer`, the step is also timed with the
token-id check turned off, to price its host read.
"""

import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from lab import step_ms, warm_training_step

GAP_US = 5.0


def short(name, width=70):
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    device = torch.device("cuda")
    for provider in sys.argv[2:]:
        step, model = warm_training_step(sys.argv[1], provider, device)
        print(f"\n## {provider} {sys.argv[1]}: step {step_ms(step.fn):.2f} ms")
        if model is not None:  # the token-id check on and off, alternating
            rows = {True: [], False: []}
            for _ in range(3):
                for on in (True, False):
                    model.check_token_ids = on
                    rows[on].append(step_ms(step.fn))
            model.check_token_ids = False
            print(
                "token-id check on: "
                + ", ".join(f"{t:.2f}" for t in rows[True])
                + " ms; off: "
                + ", ".join(f"{t:.2f}" for t in rows[False])
                + " ms"
            )
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step.fn()
            torch.cuda.synchronize()
        kernels = sorted(
            (e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0),
            key=lambda e: e.time_range.start,
        )
        busy = sum(e.time_range.end - e.time_range.start for e in kernels)
        gaps = []
        for before, after in zip(kernels, kernels[1:]):
            gap = after.time_range.start - before.time_range.end
            if gap > GAP_US:
                gaps.append((gap, before.name, after.name))
        span = kernels[-1].time_range.end - kernels[0].time_range.start
        print(
            f"kernels {len(kernels)}, busy {busy / 1e3:.2f} ms, span {span / 1e3:.2f} ms, "
            f"idle gaps > {GAP_US:.0f} us: {sum(g for g, _, _ in gaps) / 1e3:.2f} ms in {len(gaps)}"
        )
        by_next = collections.Counter()
        for gap, _, after in gaps:
            by_next[short(after, 60)] += gap
        print("idle before (kernel): " + "; ".join(f"{name} {us / 1e3:.2f} ms" for name, us in by_next.most_common(8)))
        totals = collections.Counter()
        counts = collections.Counter()
        for e in kernels:
            totals[short(e.name)] += e.time_range.end - e.time_range.start
            counts[short(e.name)] += 1
        print("| kernel | calls | ms |")
        print("|---|---:|---:|")
        for name, us in totals.most_common(int(os.environ.get("BUBBLES_TOP", "14"))):
            print(f"| {name} | {counts[name]} | {us / 1e3:.2f} |")
        del step, model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
