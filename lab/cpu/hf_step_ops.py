"""Which aten ops one training step of a small patched HF Llama runs, outside the kernels.

    TRITON_INTERPRET=1 python lab/cpu/hf_step_ops.py [llama|qwen2] [tritonformer|liger|none]

Counts, by op and (shape, stride, dtype) of the first operand, every aten op of a forward and
backward under bf16 autocast (CPU autocast stands in for CUDA's: both cast linear's operands),
so that each elementwise kernel of the GPU profile can be traced to what launches it. A lab tool.
"""

import collections
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tritonformer.bench_common import hf_model
from tritonformer.config import TransformerConfig

SKIP = {
    "aten.detach.default",
    "aten.view.default",
    "aten._unsafe_view.default",
    "aten.t.default",
    "aten.transpose.int",
    "aten.unsqueeze.default",
    "aten.expand.default",
    "aten.slice.Tensor",
    "aten.select.int",
    "aten.permute.default",
    "aten.squeeze.dim",
    "aten.as_strided.default",
    "aten.alias.default",
    "aten.split.Tensor",
    "aten.unbind.int",
    "aten.lift_fresh.default",
}


class Log(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name not in SKIP:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            desc = "" if first is None else f"{tuple(first.shape)} {first.stride()} {str(first.dtype)[6:]}"
            dtype = kwargs.get("dtype") if kwargs else None
            self.ops[(name, desc, str(dtype) if dtype else "")] += 1
        return func(*args, **(kwargs or {}))


def main():
    arch = sys.argv[1] if len(sys.argv) > 1 else "llama"
    patch = sys.argv[2] if len(sys.argv) > 2 else "tritonformer"
    config = TransformerConfig.preset(
        "llama-160M",
        d_model=128,
        n_head=2,
        n_kv_head=2 if arch == "llama" else 1,
        n_layer=1,
        d_ff=352,
        vocab_size=512,
        max_seq_len=64,
    )
    torch.manual_seed(0)
    model = hf_model(config, arch, "" if patch == "none" else patch)
    idx = torch.randint(0, 512, (2, 64))
    for _ in range(2):  # the second step: warm caches, as timed steps are
        log = Log()
        with log:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=idx, labels=idx).loss
            loss.backward()
        model.zero_grad(set_to_none=True)
    for (name, desc, dtype), n in sorted(log.ops.items()):
        print(f"{n:3d} {name:40s} {desc} {dtype}")


if __name__ == "__main__":
    main()
