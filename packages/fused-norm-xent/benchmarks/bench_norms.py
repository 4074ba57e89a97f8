"""RMSNorm and LayerNorm, bf16, forward and forward+backward: ours against torch eager,
torch.compile and Liger-Kernel (when importable), in one run; plus the fused residual + dropout +
RMSNorm against its unfused torch form.

Memory-bound; bytes count each input read once and each output written once: fwd = read x +
write y = 2 * M * N * 2 bytes; fwd+bwd adds read x, read dy and write dx: 5 * M * N * 2 bytes
(the weight, the statistics and the parameter gradients are noise).
Residual + dropout + norm, prenorm, fp32 residual stream: fwd reads x (bf16) and the residual
(fp32) and writes y (bf16) and the new residual (fp32): 12 bytes per element; fwd+bwd adds
reading the saved sum (fp32), dy (bf16), the residual-out gradient (fp32) and writing dx (bf16)
and the residual gradient (fp32): 14 more.
"""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import triton_version
from tritonformer_testkit.bench import OURS, graph_replay, measure

from fused_norm_xent import add_dropout_norm, layer_norm, rms_norm

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

HEADLINE = (16384, 4096)
SHAPES = [HEADLINE, (4096, 8192), (65536, 1024)]
# "tritonformer+graph": our same call replayed from a CUDA graph (no host path), beside the eager one.
GRAPHED = OURS + "+graph"
PROVIDERS = [OURS, GRAPHED, "torch", "torch.compile", "liger"]


def _liger(kind: str, n_cols: int, requires_grad: bool):
    """(fn, weight, bias): Liger's module on the GPU in bf16; it owns its parameters, which are the
    ones differentiated."""
    try:
        from liger_kernel.transformers import LigerLayerNorm, LigerRMSNorm
    except ImportError as error:
        pytest.skip(f"Liger-Kernel is not importable here: {error}")
    module = LigerRMSNorm(n_cols, eps=1e-6) if kind == "rmsnorm" else LigerLayerNorm(n_cols, eps=1e-6)
    module = module.to(device="cuda", dtype=torch.bfloat16).requires_grad_(requires_grad)
    return (lambda x, w, b: module(x)), module.weight, getattr(module, "bias", None)


def _norm_fn(kind: str, provider: str, shape):
    n_cols = shape[1]
    if provider in (OURS, GRAPHED):
        if kind == "rmsnorm":
            return lambda x, w, b: rms_norm(x, n_cols, w, 1e-6)
        return lambda x, w, b: layer_norm(x, n_cols, w, b, 1e-6)
    if kind == "rmsnorm":
        fn = lambda x, w, b: F.rms_norm(x, (n_cols,), w, 1e-6)  # noqa: E731
    else:
        fn = lambda x, w, b: F.layer_norm(x, (n_cols,), w, b, 1e-6)  # noqa: E731
    if provider == "torch":
        return fn
    if triton_version() < (3, 0):
        pytest.skip("torch.compile's Inductor needs Triton 3.x; this run has Triton 2.x first on the path")
    if shape != HEADLINE:
        pytest.skip("torch.compile is timed on the headline shape only (its compile time bounds the run)")
    return torch.compile(fn, dynamic=False)


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
def test_norm(benchmark, kind, shape, provider, mode):
    rows, cols = shape
    grad = mode != "fwd"
    if provider == GRAPHED and shape != HEADLINE:
        pytest.skip("the CUDA-graph replay is timed on the headline shape only")
    if provider == "liger":
        fn, w, b = _liger(kind, cols, grad)
    else:
        fn = _norm_fn(kind, provider, shape)
        w = torch.randn(cols, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
        b = torch.randn(cols, device="cuda", dtype=torch.bfloat16, requires_grad=grad) if kind == "layernorm" else None
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
    dy = torch.randn_like(x)
    elements = rows * cols * x.element_size()
    group = f"{kind} {mode} bf16"
    if mode == "fwd":
        call = lambda: fn(x, w, b)  # noqa: E731
    else:
        wrt = [t for t in (x, w, b) if t is not None]
        call = lambda: torch.autograd.grad(fn(x, w, b), wrt, dy)  # noqa: E731
    if provider == GRAPHED:
        call = graph_replay(call)
    with torch.no_grad() if mode == "fwd" else contextlib.nullcontext():
        measure(benchmark, group=group, shape=f"{rows}x{cols}", provider=provider, fn=call,
                bytes=(2 if mode == "fwd" else 5) * elements)  # fmt: skip


def _unfused_add_dropout_rms_norm(x, residual, w):
    s = F.dropout(x, 0.1) + residual
    return F.rms_norm(s.to(x.dtype), s.shape[-1:], w, 1e-6), s


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("provider", [OURS, "torch"])
def test_add_dropout_rms_norm(benchmark, provider, mode):
    rows, cols = HEADLINE
    grad = mode != "fwd"
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
    residual = torch.randn(rows, cols, device="cuda", dtype=torch.float32, requires_grad=grad)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
    if provider == OURS:
        fn = lambda: add_dropout_norm(x, residual, w, None, 0.1, norm="rmsnorm", eps=1e-6)  # noqa: E731
    else:
        fn = lambda: _unfused_add_dropout_rms_norm(x, residual, w)  # noqa: E731
    n = rows * cols
    group = f"residual + dropout(0.1) + rmsnorm {mode}, bf16 x, fp32 residual"
    if mode == "fwd":
        with torch.no_grad():
            measure(benchmark, group=group, shape=f"{rows}x{cols}", provider=provider, fn=fn, bytes=12 * n)
    else:
        dy, dres = torch.randn_like(x), torch.randn_like(residual)
        measure(benchmark, group=group, shape=f"{rows}x{cols}", provider=provider,
                fn=lambda: torch.autograd.grad(fn(), (x, residual, w), (dy, dres)), bytes=26 * n)  # fmt: skip
