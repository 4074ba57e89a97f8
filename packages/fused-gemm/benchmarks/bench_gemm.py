"""fused-gemm against cuBLAS (F.linear / torch.bmm) and the unfused torch epilogue, bf16, on one H100.

Shapes: the linear layers of a 1.4B model at 16k tokens, (M, K, N) = tokens x in x out, and the
attention-sized bmm 64 x (2048x128 @ 128x2048).
Flops: forward 2*M*K*N; forward+backward 6*M*K*N (dX and dW are matmuls of the same size). The
epilogue's elementwise work is not counted: it is the overhead being measured.
Groups:
- "gemm": the plain matmul, ours against cuBLAS through F.linear (weight (N, K), as nn.Linear).
- "gemm+bias+gelu": ours fused against torch's sequence F.gelu(F.linear(x, w, b)) (cuBLAS, bias in
  its epilogue, then a GELU kernel; backward: GELU backward, two matmuls and a bias reduction),
  and against both plain matmuls (ours and cuBLAS), so that time/ours of "tritonformer, no
  epilogue" reads the cost of the fused epilogue directly.
- "bmm": ours against torch.bmm.
- "mlp": fc2(gelu(fc1(x))) with biases at a GPT-2 410M layer's size (16k tokens, 1024 -> 4096 ->
  1024) and a 1.4B GPT-2's (2048 -> 8192 -> 2048): ours as one `mlp` call (the GELU's backward in
  the epilogue of fc2's input gradient), ours as two `matmul` calls (the separate elementwise
  pass), and torch's F.linear / F.gelu / F.linear. Flops: both products.
"""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit.bench import OURS, measure

from fused_gemm import bmm, matmul, mlp

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

SHAPES = [(16384, 2048, 8192), (16384, 8192, 2048), (16384, 2048, 6144)]
MODES = ["fwd", "fwd+bwd"]
PLAIN_PROVIDERS = [OURS, "cuBLAS (F.linear)"]
EPILOGUE_PROVIDERS = [OURS, "torch (F.linear + F.gelu)", "tritonformer, no epilogue", "cuBLAS, no epilogue"]


def _linear_fn(provider: str):
    """(x, weight (N, K), bias) -> output, for each provider."""
    return {
        OURS: lambda x, w, b: matmul(x, w.t(), b, "gelu"),
        "torch (F.linear + F.gelu)": lambda x, w, b: F.gelu(F.linear(x, w, b)),
        "tritonformer, no epilogue": lambda x, w, b: matmul(x, w.t()),
        "cuBLAS, no epilogue": lambda x, w, b: F.linear(x, w),
        "cuBLAS (F.linear)": lambda x, w, b: F.linear(x, w),
    }[provider]


def _run(benchmark, group, shape_name, provider, mode, fn, inputs, flops):
    grad_inputs = [t for t in inputs if t is not None]
    if mode == "fwd":
        with torch.no_grad():
            measure(benchmark, group=f"{group} fwd bf16", shape=shape_name, provider=provider, fn=lambda: fn(*inputs),
                    flops=flops)  # fmt: skip
        return
    for t in grad_inputs:
        t.requires_grad_(True)
    dy = torch.randn_like(fn(*inputs))
    measure(benchmark, group=f"{group} fwd+bwd bf16", shape=shape_name, provider=provider,
            fn=lambda: torch.autograd.grad(fn(*inputs), grad_inputs, dy), flops=3 * flops)  # fmt: skip


def _linear_inputs(m, k, n):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    return x, w, b


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PLAIN_PROVIDERS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm(benchmark, shape, provider, mode):
    m, k, n = shape
    x, w, _ = _linear_inputs(m, k, n)
    fn = matmul if provider == OURS else F.linear
    weight = w.t() if provider == OURS else w
    _run(benchmark, "gemm", "x".join(map(str, shape)), provider, mode, fn, (x, weight), 2 * m * k * n)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", EPILOGUE_PROVIDERS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_bias_gelu(benchmark, shape, provider, mode):
    m, k, n = shape
    x, w, b = _linear_inputs(m, k, n)
    uses_bias = provider in (OURS, "torch (F.linear + F.gelu)")
    _run(benchmark, "gemm+bias+gelu", "x".join(map(str, shape)), provider, mode, _linear_fn(provider),
         (x, w, b if uses_bias else None), 2 * m * k * n)  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", [OURS, "cuBLAS (torch.bmm)"])
def test_bmm(benchmark, provider, mode):
    batch, m, k, n = 64, 2048, 128, 2048
    a = torch.randn(batch, m, k, device="cuda", dtype=torch.bfloat16)
    b = (torch.randn(batch, k, n, device="cuda") / k**0.5).to(torch.bfloat16)
    fn = bmm if provider == OURS else torch.bmm
    _run(benchmark, "bmm", f"{batch}x{m}x{k}x{n}", provider, mode, fn, (a, b), 2 * batch * m * k * n)


MLP_SHAPES = [(16384, 1024, 4096), (16384, 2048, 8192)]
MLP_PROVIDERS = [OURS, "tritonformer, two matmuls", "torch (F.linear + F.gelu + F.linear)"]


def _mlp_fn(provider: str):
    """(x, w1 (H, D), b1, w2 (D, H), b2) -> output, nn.Linear weights, for each provider."""
    return {
        OURS: lambda x, w1, b1, w2, b2: mlp(x, w1.t(), b1, w2.t(), b2, "gelu"),
        "tritonformer, two matmuls": lambda x, w1, b1, w2, b2: matmul(matmul(x, w1.t(), b1, "gelu"), w2.t(), b2),
        "torch (F.linear + F.gelu + F.linear)": lambda x, w1, b1, w2, b2: F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2),
    }[provider]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", MLP_PROVIDERS)
@pytest.mark.parametrize("shape", MLP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_mlp(benchmark, shape, provider, mode):
    m, d, h = shape
    x, w1, b1 = _linear_inputs(m, d, h)
    _, w2, b2 = _linear_inputs(1, h, d)
    _run(benchmark, "mlp", "x".join(map(str, shape)), provider, mode, _mlp_fn(provider), (x, w1, b1, w2, b2),
         4 * m * d * h)  # fmt: skip
