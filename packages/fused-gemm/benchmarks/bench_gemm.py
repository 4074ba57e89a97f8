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
The providers of a row are timed in turn (`measure_paired`: five interleaved do_bench windows
each, median of medians), so that a drift of the GPU's clocks falls on all of them alike: timed
one after the other in one window each, the same code's ratios move by several percent from one
benchmark to the next.
"""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit.bench import OURS, measure_paired

from fused_gemm import bmm, matmul, mlp

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

SHAPES = [(16384, 2048, 8192), (16384, 8192, 2048), (16384, 2048, 6144)]
MODES = ["fwd", "fwd+bwd"]
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


def _timed_call(fn, inputs, mode):
    """The call do_bench times: the forward without autograd, or the forward and the gradients of
    every tensor input (the inputs are made to require them)."""
    if mode == "fwd":

        def forward():
            with torch.no_grad():
                return fn(*inputs)

        return forward
    leaves = [t.requires_grad_(True) for t in inputs if t is not None]
    with torch.no_grad():
        dy = torch.randn_like(fn(*inputs))
    return lambda: torch.autograd.grad(fn(*inputs), leaves, dy)


def _run_in_turn(benchmark, group, shape_name, mode, calls, flops):
    """calls: provider -> (fn, inputs). The providers are timed in turn (measure_paired: interleaved
    do_bench windows, so that a drift of the GPU's clocks falls on all of them alike)."""
    fns = {provider: _timed_call(fn, inputs, mode) for provider, (fn, inputs) in calls.items()}
    measure_paired(benchmark, group=f"{group} {mode} bf16", shape=shape_name, fns=fns,
                   flops=flops if mode == "fwd" else 3 * flops)  # fmt: skip


def _linear_inputs(m, k, n):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda") / k**0.5).to(torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    return x, w, b


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm(benchmark, shape, mode):
    m, k, n = shape
    x, w, _ = _linear_inputs(m, k, n)
    calls = {OURS: (matmul, (x, w.t())), "cuBLAS (F.linear)": (F.linear, (x, w))}
    _run_in_turn(benchmark, "gemm", "x".join(map(str, shape)), mode, calls, 2 * m * k * n)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gemm_bias_gelu(benchmark, shape, mode):
    m, k, n = shape
    x, w, b = _linear_inputs(m, k, n)
    calls = {
        provider: (_linear_fn(provider), (x, w, b if provider in (OURS, "torch (F.linear + F.gelu)") else None))
        for provider in EPILOGUE_PROVIDERS
    }
    _run_in_turn(benchmark, "gemm+bias+gelu", "x".join(map(str, shape)), mode, calls, 2 * m * k * n)


@pytest.mark.parametrize("mode", MODES)
def test_bmm(benchmark, mode):
    batch, m, k, n = 64, 2048, 128, 2048
    a = torch.randn(batch, m, k, device="cuda", dtype=torch.bfloat16)
    b = (torch.randn(batch, k, n, device="cuda") / k**0.5).to(torch.bfloat16)
    calls = {OURS: (bmm, (a, b)), "cuBLAS (torch.bmm)": (torch.bmm, (a, b))}
    _run_in_turn(benchmark, "bmm", f"{batch}x{m}x{k}x{n}", mode, calls, 2 * batch * m * k * n)


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
@pytest.mark.parametrize("shape", MLP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_mlp(benchmark, shape, mode):
    m, d, h = shape
    x, w1, b1 = _linear_inputs(m, d, h)
    _, w2, b2 = _linear_inputs(1, h, d)
    calls = {provider: (_mlp_fn(provider), (x, w1, b1, w2, b2)) for provider in MLP_PROVIDERS}
    _run_in_turn(benchmark, "mlp", "x".join(map(str, shape)), mode, calls, 4 * m * d * h)
