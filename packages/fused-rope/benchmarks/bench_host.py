"""The `host` group: microseconds per eager call at a tiny shape, where only the host path counts:
ours beside the HF formula in torch and Liger-Kernel's (when importable), timed in turn in one run.
Forward with inputs that require grad (as in training); forward+backward through `.sum().backward()`."""

import pytest
import torch
from tritonformer_testkit.bench import OURS, measure_host

from fused_rope import apply_rotary_qk

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

B, H, S, D = 1, 8, 128, 64


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _torch_rope(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_rope_qk(benchmark, mode):
    q, k = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    angles = torch.randn(1, S, D, device="cuda")
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    fns = {OURS: lambda: apply_rotary_qk(q, k, cos, sin), "torch": lambda: _torch_rope(q, k, cos, sin)}
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        fns["liger"] = lambda: liger_rotary_pos_emb(q, k, cos, sin)
    except ImportError:
        pass

    measure_host(benchmark, op="rope_qk", mode=mode, shape=f"({B},{H},{S},{D})",
                 providers=fns)  # fmt: skip
