"""The `host` group: microseconds per eager call at tiny shapes, where only the host path counts:
ours beside cuBLAS through torch (and the unfused epilogue), timed in turn in one run. Forward with
inputs that require grad (as in training); forward+backward through `.sum().backward()`."""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit.bench import OURS, measure_host

from fused_gemm import matmul

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

M, K, N = 64, 1024, 1024


def _param(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("epilogue", ["plain", "bias+gelu"])
def test_matmul(benchmark, mode, epilogue):
    x, w, b = _param(M, K), _param(N, K), _param(N)
    if epilogue == "plain":
        ours, theirs = (lambda: matmul(x, w.t())), (lambda: F.linear(x, w))
    else:
        ours = lambda: matmul(x, w.t(), b, activation="gelu")  # noqa: E731
        theirs = lambda: F.gelu(F.linear(x, w, b))  # noqa: E731

    op = "matmul" if epilogue == "plain" else "matmul+bias+gelu"
    measure_host(benchmark, op=op, mode=mode, shape=f"{M}x{K}x{N}", providers={OURS: ours, "torch": theirs})
