"""Softmax forward and forward+backward, bf16: ours against torch eager and torch.compile.

Memory-bound: bytes count each input read once and each output written once, so
fwd = read x + write y, fwd+bwd adds read y + read dy + write dx (5 passes in all).
"""

import pytest
import torch
from tritonformer_testkit import triton_version
from tritonformer_testkit.bench import OURS, measure

from fused_norm_xent import softmax

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

SHAPES = [(16384, 1024), (16384, 4096), (8192, 16384), (2048, 65536)]
PROVIDERS = [OURS, "torch", "torch.compile"]


def _softmax_fn(provider: str):
    if provider == OURS:
        return softmax
    if provider == "torch":
        return lambda x: torch.softmax(x, -1)
    if triton_version() < (3, 0):
        pytest.skip("torch.compile's Inductor needs Triton 3.x; this run has Triton 2.x first on the path")
    return torch.compile(lambda x: torch.softmax(x, -1), dynamic=False)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_softmax(benchmark, shape, provider, mode):
    rows, cols = shape
    fn = _softmax_fn(provider)
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, requires_grad=mode != "fwd")
    dy = torch.randn_like(x)
    element_bytes = rows * cols * x.element_size()
    if mode == "fwd":
        with torch.no_grad():
            measure(benchmark, group=f"softmax {mode} bf16", shape=f"{rows}x{cols}", provider=provider,
                    fn=lambda: fn(x), bytes=2 * element_bytes)  # fmt: skip
    else:
        measure(benchmark, group=f"softmax {mode} bf16", shape=f"{rows}x{cols}", provider=provider,
                fn=lambda: torch.autograd.grad(fn(x), x, dy), bytes=5 * element_bytes)  # fmt: skip
