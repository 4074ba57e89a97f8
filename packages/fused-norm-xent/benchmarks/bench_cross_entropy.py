"""Cross-entropy over bf16 logits, forward+backward (mean loss, loss.backward()): ours against torch
eager, torch.compile and Liger-Kernel (when importable), with the peak memory each allocates.

Floor: read the logits once and write their gradient once: 2 * N * V * 2 bytes. Ours computes the
gradient in the forward kernel (the row is re-read, from L2 where it still is) and the backward
only checks that the upstream gradient is 1. "tritonformer" keeps F.cross_entropy's contract (the
logits are not modified): its peak extra memory is the (N, V) gradient it returns, as
torch.compile's. "tritonformer in place" writes the gradient into the logits buffer, as
Liger-Kernel always does: the leaf's .grad is that buffer, nothing of size (N, V) is allocated.
Both check the targets (one host read, issued after the kernels are queued).
"""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import triton_version
from tritonformer_testkit.bench import OURS, measure

from fused_norm_xent import cross_entropy

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

HEADLINE = (16384, 50304)
SHAPES = [HEADLINE, (8192, 128256)]
OURS_IN_PLACE = f"{OURS} in place"
PROVIDERS = [OURS, OURS_IN_PLACE, "torch", "torch.compile", "liger"]


def _loss_fn(provider: str, shape):
    if provider == OURS:
        return cross_entropy
    if provider == OURS_IN_PLACE:
        return lambda logits, target: cross_entropy(logits, target, inplace_backward=True)
    if provider == "torch":
        return F.cross_entropy
    if provider == "liger":
        try:
            from liger_kernel.transformers import LigerCrossEntropyLoss
        except ImportError as error:
            pytest.skip(f"Liger-Kernel is not importable here: {error}")
        return LigerCrossEntropyLoss()
    if triton_version() < (3, 0):
        pytest.skip("torch.compile's Inductor needs Triton 3.x; this run has Triton 2.x first on the path")
    if shape != HEADLINE:
        pytest.skip("torch.compile is timed on the headline shape only (its compile time bounds the run)")
    return torch.compile(F.cross_entropy, dynamic=False)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_cross_entropy_fwd_bwd(benchmark, shape, provider):
    loss_fn = _loss_fn(provider, shape)
    n_rows, n_cols = shape
    logits = torch.randn(n_rows, n_cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, n_cols, (n_rows,), device="cuda")

    def step():
        # A fresh non-leaf view each call: the in-place providers overwrite it, not the leaf.
        buffer = logits.detach().requires_grad_(True)
        loss_fn(buffer, target).backward()

    measure(benchmark, group="cross-entropy fwd+bwd bf16", shape=f"{n_rows}x{n_cols}", provider=provider, fn=step,
            bytes=2 * n_rows * n_cols * logits.element_size(), memory=True)  # fmt: skip
