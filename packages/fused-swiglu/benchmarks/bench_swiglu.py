"""SwiGLU and the SwiGLU MLP, forward and forward+backward: ours against torch eager,
torch.compile and Liger-Kernel (LigerSiLUMulFunction between cuBLAS matmuls), in one run.

Flop counts (the usual 2 flops per multiply-add; the pointwise work is not counted):
- SwiGLU, x (M, K) -> (M, N): forward = gate + up matmuls = 4*M*K*N; forward+backward adds
  dx (4*M*K*N) and the two weight gradients (4*M*K*N): 12*M*K*N.
- SwiGLU MLP (down projection N -> K included): forward 6*M*K*N, forward+backward 18*M*K*N.
The floor is the matmuls at the bf16 tensor-core ceiling (~795 TFLOP/s on this H100).

Groups: the seed's sweep (batch 4 x sequence 2048 = 8192 rows, d_intermediate = 3 x d_model,
d_model 1024..8192; bf16 and fp16); the headline MLP (16384 x 2048 -> 5632, bf16) with peak
memory; and the forward kernel alone at the headline's gate/up shape, the Hopper TMA variant
(what the launcher picks on an H100 with Triton >= 3.4) against the portable pointer kernel.
torch.compile runs in the bf16 groups only, with torch's default dynamic-shape policy in the
sweep: compiling it for every shape, dtype and mode would take most of this file's time
budget (under ~3 minutes on an H100).
"""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import triton_version
from tritonformer_testkit.bench import OURS, measure

from fused_swiglu import swiglu, swiglu_mlp
from fused_swiglu.ops.launchers import launch_forward, use_tma_forward

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

PROVIDERS = [OURS, "torch", "torch.compile", "liger"]
SWEEP_D_MODEL = [1024, 2048, 4096, 8192]
SWEEP_ROWS = 4 * 2048
HEADLINE = (16384, 2048, 5632)  # rows, d_model, d_intermediate
MODES = ["fwd", "fwd+bwd"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _liger_silu_mul():
    try:
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError as error:
        pytest.skip(f"Liger-Kernel is not importable here ({error})")
    return LigerSiLUMulFunction.apply


def _torch_swiglu(x, w_gate, w_up):
    """The unfused baseline with nn.Linear-layout (out, in) weights, as a LLaMA MLP is written."""
    return F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)


def _torch_swiglu_mlp(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def _provider_fn(provider: str, dtype_name: str, mlp: bool):
    """fn(x, w_gate, w_up[, w_down]) for each provider: ours takes (in, out) weights, the anchors
    nn.Linear-layout (out, in) ones; each gets its own layout contiguous (see _inputs)."""
    if provider == OURS:
        return swiglu_mlp if mlp else swiglu
    if provider == "torch":
        return _torch_swiglu_mlp if mlp else _torch_swiglu
    if provider == "torch.compile":
        if triton_version() < (3, 0):
            pytest.skip("torch.compile's Inductor needs Triton 3.x; this run has Triton 2.x first on the path")
        if dtype_name != "bf16":
            pytest.skip("torch.compile runs in the bf16 groups only (its compile time per shape and dtype)")
        if mlp:  # the headline: one shape, compiled for it
            return torch.compile(_torch_swiglu_mlp, dynamic=False)
        # The sweep: torch's default, static for the first shape, then one dynamic-shape graph
        # for the rest (two compiles per mode instead of one per shape).
        return torch.compile(_torch_swiglu)
    silu_mul = _liger_silu_mul()

    def liger(x, wg, wu, wd=None):
        h = silu_mul(F.linear(x, wg), F.linear(x, wu))
        return h if wd is None else F.linear(h, wd)

    return liger


def _inputs(provider, x, weights):
    """x and the weights in the provider's layout, made contiguous outside the timing."""
    if provider == OURS:
        weights = [w.t().contiguous() for w in weights]
    return [x, *weights]


def _run(benchmark, group, shape, provider, fn, inputs, mode, flops_fwd, memory=False):
    x, *weights = inputs = _inputs(provider, inputs[0], inputs[1:])
    if mode == "fwd":
        with torch.no_grad():
            measure(benchmark, group=group, shape=shape, provider=provider, fn=lambda: fn(*inputs),
                    flops=flops_fwd, memory=memory)  # fmt: skip
        return
    leaves = [x.requires_grad_(), *(w.requires_grad_() for w in weights)]
    dy = torch.randn_like(fn(*inputs))
    measure(benchmark, group=group, shape=shape, provider=provider,
            fn=lambda: torch.autograd.grad(fn(*inputs), leaves, dy), flops=3 * flops_fwd, memory=memory)  # fmt: skip


def _linear_weights(shapes, dtype):
    """nn.Linear-layout (out, in) weights with nn.Linear's scale."""
    return [torch.randn(out, fan_in, device="cuda", dtype=dtype) * fan_in**-0.5 for out, fan_in in shapes]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("d_model", SWEEP_D_MODEL)
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_swiglu_sweep(benchmark, dtype_name, d_model, provider, mode):
    dtype, rows, d_inter = DTYPES[dtype_name], SWEEP_ROWS, 3 * d_model
    fn = _provider_fn(provider, dtype_name, mlp=False)
    x = torch.randn(4, rows // 4, d_model, device="cuda", dtype=dtype)
    w_gate, w_up = _linear_weights([(d_inter, d_model)] * 2, dtype)
    _run(benchmark, f"swiglu {mode} {dtype_name} (batch 4 x seq 2048)", f"{d_model}->{d_inter}", provider, fn,
         [x, w_gate, w_up], mode, 4 * rows * d_model * d_inter)  # fmt: skip


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_swiglu_mlp_headline(benchmark, provider, mode):
    rows, d_model, d_inter = HEADLINE
    fn = _provider_fn(provider, "bf16", mlp=True)
    x = torch.randn(rows, d_model, device="cuda", dtype=torch.bfloat16)
    weights = _linear_weights([(d_inter, d_model), (d_inter, d_model), (d_model, d_inter)], torch.bfloat16)
    _run(benchmark, f"swiglu MLP {mode} bf16", f"{rows}x{d_model}->{d_inter}->{d_model}", provider, fn,
         [x, *weights], mode, 6 * rows * d_model * d_inter, memory=True)  # fmt: skip


@pytest.mark.parametrize("kernel", [OURS, "pointer kernel"])
def test_forward_kernel_tma_vs_pointer(benchmark, kernel):
    """The fused gate/up/activation kernel alone, saving g and u as in training: the TMA variant
    (OURS, when the launcher picks it) against the portable kernel on the same inputs."""
    rows, d_model, d_inter = HEADLINE
    x = torch.randn(rows, d_model, device="cuda", dtype=torch.bfloat16)
    w_gate, w_up = (t.t().contiguous() for t in _linear_weights([(d_inter, d_model)] * 2, torch.bfloat16))
    tma = use_tma_forward(x, w_gate, w_up)
    if kernel == OURS and not tma:
        pytest.skip("the TMA forward is not chosen here (it needs sm_90 and Triton >= 3.4)")
    h, g, u = (torch.empty(rows, d_inter, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    measure(benchmark, group="swiglu forward kernel bf16 (TMA vs pointer)", shape=f"{rows}x{d_model}->{d_inter}",
            provider=kernel, flops=4 * rows * d_model * d_inter,
            fn=lambda: launch_forward(x, w_gate, w_up, None, None, h, g, u, True, False, kernel == OURS))  # fmt: skip
