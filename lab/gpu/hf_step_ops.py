"""Which aten ops take the GPU time of one training step, by input shapes (HF providers or ours).

    python3 lab/gpu/hf_step_ops.py PRESET:CONTEXT:BATCH PROVIDER [PROVIDER ...]

One profiled step per provider (after two warm-up steps) with record_shapes: the ops by self CUDA
time, grouped by input shapes, so that each elementwise kernel of model_bubbles.py's table can be
traced to the op and tensor that launch it. A lab tool: prints, changes nothing.
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile

from lab import warm_training_step


def main():
    device = torch.device("cuda")
    for provider in sys.argv[2:]:
        step, model = warm_training_step(sys.argv[1], provider, device)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            step.fn()
            torch.cuda.synchronize()
        print(f"\n## {provider} {sys.argv[1]}: aten ops by self CUDA time, by input shapes\n")
        table = prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cuda_time_total", row_limit=45, max_name_column_width=40, max_shapes_column_width=90
        )
        print(table)
        del step, model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
