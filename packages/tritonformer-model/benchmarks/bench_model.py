"""Training-step throughput of the GPT at two headline configs, against PyTorch.

GPT-2 style 410M at batch 8 and LLaMA style 1.4B at batch 4, context 2048, bf16 autocast,
fp32 weights; one step = forward + backward of the loss on random tokens (`tritonformer-bench`'s
step, see tritonformer.bench). Providers: ours (`Transformer`, fused linear+cross-entropy
loss), `TorchTransformer` eager and under torch.compile, and for the LLaMA config Hugging Face
Llama plain and with Liger-Kernel when they import. Ours is the step with the body replayed from
CUDA graphs (tritonformer+graph; the eager step is the "tritonformer (eager)" row).

Flops: model flops 6N + 12 * L * d * S per token (N: the matmul parameters, the head
included, the embedding tables not), times B * S tokens. Reference figures of a plain-PyTorch
GPT: 410M b8 eager 363, torch.compile 476 model TFLOP/s, peak 24.9 / 17.3 GiB; 1.4B b4 eager 370,
torch.compile 547 (23.8 GiB); HF Llama 315, + Liger 442. The goal: torch.compile's throughput or
more at no more peak memory, ideally 1.1x. About 3-4 minutes on an H100 (torch.compile compiles each model once).
"""

import pytest
import torch
from tritonformer_testkit import bench

from tritonformer.bench import Point, point_config, release_memory, skip_reason, training_step

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

HEADLINE = [Point("410M", 2048, 8), Point("llama-1.4B", 2048, 4)]
PROVIDERS = ["tritonformer+graph", "tritonformer", "torch", "torch.compile", "hf-llama", "hf-llama+liger"]
NAMES = {"tritonformer+graph": bench.OURS, "tritonformer": "tritonformer (eager)"}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("point", HEADLINE, ids=str)
def test_training_step(benchmark, point, provider):
    config = point_config(point, provider, {})
    device = torch.device("cuda")
    reason = skip_reason(provider, config, device)
    if reason:
        pytest.skip(reason)
    try:
        step = training_step(point, provider, config, device)
    except NotImplementedError as error:
        pytest.skip(str(error))
    try:
        bench.measure(
            benchmark,
            group=f"GPT training step ({point.preset}, batch {point.batch}, context {point.context})",
            shape=str(point),
            provider=NAMES.get(provider, provider),
            fn=step.fn,
            flops=step.flops,
            memory=True,
        )
    finally:
        step = None
        release_memory(device)
