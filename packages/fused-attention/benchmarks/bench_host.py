"""The `host` group: microseconds per eager call at a tiny shape, where only the host path counts:
ours beside PyTorch's SDPA, timed in turn in one run. Forward with inputs that require grad (as in
training); forward+backward through `.sum().backward()`."""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit.bench import OURS, measure_host

from fused_attention import flash_attention

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

B, S, H, D = 1, 128, 8, 64


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_flash_attention(benchmark, mode):
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def sdpa():
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)

    providers = {OURS: lambda: flash_attention(q, k, v, causal=True), "torch SDPA": sdpa}
    measure_host(benchmark, op="flash_attention", mode=mode, shape=f"({B},{S},{H},{D})", providers=providers)
