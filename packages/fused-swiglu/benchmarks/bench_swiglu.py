"""SwiGLU and the SwiGLU MLP, forward and forward+backward: ours against torch eager,
torch.compile and Liger-Kernel (LigerSiLUMulFunction between cuBLAS matmuls), in one run; and
each of our kernels at the headline shape beside cuBLAS doing the same matmul.

Flop counts (the usual 2 flops per multiply-add; the pointwise work is not counted):
- SwiGLU, x (M, K) -> (M, N): forward = gate + up matmuls = 4*M*K*N; forward+backward adds
  dx (4*M*K*N) and the two weight gradients (4*M*K*N): 12*M*K*N.
- SwiGLU MLP (down projection N -> K included): forward 6*M*K*N, forward+backward 18*M*K*N.
The floor is the matmuls at the bf16 tensor-core ceiling (~795 TFLOP/s on this H100).

Groups (the file runs in about 2 minutes on an H100, most of it compiling). The providers of a
row are timed in turn (`measure_paired`: five interleaved do_bench windows each, median of
medians), so that a drift of the GPU's clocks or the host's speed falls on all of them alike:
- the headline MLP (16384 x 2048 -> 5632 -> 2048), forward and forward+backward, with peak
  memory, against every anchor;
- the headline's kernels one by one (the fused forward, the down-projection backward with the
  SwiGLU step, the input gradient, the weight gradients), each against cuBLAS doing the same
  matmuls without the fusion (torch.mm on concatenated operands: the floor our kernel must
  reach), the forward, the down-projection backward and the weight gradients also against the
  portable pointer kernel on its first config (what runs off Hopper); the shape column names the
  config the autotuner chose;
- a sweep (batch 4 x sequence 2048 rows, d_intermediate = 3 x d_model) at d_model 1024,
  2048, 4096 and 8192, bf16 and fp16, against torch eager and Liger-Kernel, and in fp16 also
  FastAccumFusedSwiGLU with fp16 accumulation; torch.compile runs at the bf16 headline only (its
  compile time per shape, dtype and mode would not fit).
The headline also runs in fp16 (ours, torch, Liger).
"""

import pytest
import torch
import torch.nn.functional as F
from tritonformer_testkit import triton_version
from tritonformer_testkit.bench import OURS, measure, measure_paired

from fused_swiglu import FastAccumFusedSwiGLU, swiglu, swiglu_mlp
from fused_swiglu.kernels.backward import (
    _mlp_down_grad_kernel,
    _mlp_down_grad_tma_kernel,
    _swiglu_input_grad_kernel,
    _swiglu_input_grad_tma_kernel,
    _swiglu_weight_grad_kernel,
    _swiglu_weight_grad_tma_kernel,
)
from fused_swiglu.kernels.forward import _swiglu_fwd_kernel, _swiglu_fwd_tma_kernel
from fused_swiglu.ops.launchers import (
    launch_down_grad,
    launch_forward,
    launch_weight_grad,
    swiglu_input_grad,
    use_tma_down_grad,
    use_tma_forward,
    use_tma_input_grad,
    use_tma_weight_grad,
)

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

FAST_ACCUM = f"{OURS} (fp16 accumulate)"
PROVIDERS = [OURS, "torch", "torch.compile", "liger"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SWEEP_D_MODEL = [1024, 2048, 4096, 8192]
SWEEP_ROWS = 4 * 2048
HEADLINE = (16384, 2048, 5632)  # rows, d_model, d_intermediate
MODES = ["fwd", "fwd+bwd"]
CUBLAS = "cuBLAS, same matmul"


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


def _provider_fn(provider: str, mlp: bool):
    """fn(x, w_gate, w_up[, w_down]) for each provider: ours takes (in, out) weights, the anchors
    nn.Linear-layout (out, in) ones; each gets its own layout contiguous (see _inputs)."""
    if provider == OURS:
        return swiglu_mlp if mlp else swiglu
    if provider == FAST_ACCUM:
        return lambda x, w_gate, w_up: FastAccumFusedSwiGLU.apply(x, w_gate, w_up, True)
    if provider == "torch":
        return _torch_swiglu_mlp if mlp else _torch_swiglu
    if provider == "torch.compile":
        if triton_version() < (3, 0):
            pytest.skip("torch.compile's Inductor needs Triton 3.x; this run has Triton 2.x first on the path")
        if not mlp:
            pytest.skip("torch.compile runs at the headline only (its compile time per shape and mode)")
        return torch.compile(_torch_swiglu_mlp, dynamic=False)
    silu_mul = _liger_silu_mul()

    def liger(x, wg, wu, wd=None):
        h = silu_mul(F.linear(x, wg), F.linear(x, wu))
        return h if wd is None else F.linear(h, wd)

    return liger


def _inputs(provider, x, weights):
    """x and the weights in the provider's layout, made contiguous outside the timing."""
    if provider in (OURS, FAST_ACCUM):
        weights = [w.t().contiguous() for w in weights]
    return [x, *weights]


def _timed(provider, fn, inputs, mode):
    """What one timed call of `provider` runs: fn under no_grad, or fn and torch.autograd.grad."""
    x, *weights = inputs = _inputs(provider, inputs[0], inputs[1:])
    if mode == "fwd":

        def fwd():
            with torch.no_grad():
                return fn(*inputs)

        return fwd
    leaves = [x.requires_grad_(), *(w.requires_grad_() for w in weights)]
    dy = torch.randn_like(fn(*inputs))
    return lambda: torch.autograd.grad(fn(*inputs), leaves, dy)


def _run_in_turn(benchmark, group, shape, providers, mlp, inputs, mode, flops_fwd, memory=False):
    """Every provider that runs here, timed in turn (measure_paired: interleaved windows, so a
    drift of the GPU's clocks or the host's speed falls on all of them alike)."""
    fns = {}
    for provider in providers:
        try:
            fns[provider] = _timed(provider, _provider_fn(provider, mlp), inputs, mode)
        except pytest.skip.Exception as reason:
            print(f"{provider} skipped at {shape}: {reason}")
    flops = flops_fwd if mode == "fwd" else 3 * flops_fwd
    measure_paired(benchmark, group=group, shape=shape, fns=fns, flops=flops, memory=memory)


def _linear_weights(shapes, dtype=torch.bfloat16):
    """nn.Linear-layout (out, in) weights with nn.Linear's scale."""
    return [torch.randn(out, fan_in, device="cuda", dtype=dtype) * fan_in**-0.5 for out, fan_in in shapes]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_swiglu_mlp_headline(benchmark, dtype, mode):
    rows, d_model, d_inter = HEADLINE
    x = torch.randn(rows, d_model, device="cuda", dtype=DTYPES[dtype])
    weights = _linear_weights([(d_inter, d_model), (d_inter, d_model), (d_model, d_inter)], DTYPES[dtype])
    providers = PROVIDERS if dtype == "bf16" else [OURS, "torch", "liger"]  # compile: bf16 only (its time)
    _run_in_turn(benchmark, f"swiglu MLP {mode} {dtype}", f"{rows}x{d_model}->{d_inter}->{d_model}", providers,
                 True, [x, *weights], mode, 6 * rows * d_model * d_inter, memory=True)  # fmt: skip


def _config_label(kernel) -> str:
    """The config the autotuner chose for `kernel`'s last launch, e.g. 128x128x64 w8 s3."""
    config = kernel.best_config
    blocks = [v for k, v in config.kwargs.items() if k.startswith("BLOCK_")]
    extra = [f"{k}={v}" for k, v in config.kwargs.items() if k in ("EPILOGUE_M", "PROGRAMS_PER_SM")]
    return " ".join(["x".join(map(str, blocks)), f"w{config.num_warps}", f"s{config.num_stages}", *extra])


class _Headline:
    """The headline MLP's gate/up/down operands and backward intermediates, in our layouts."""

    def __init__(self):
        rows, d_model, d_inter = self.rows, self.d_model, self.d_inter = HEADLINE
        bf16 = {"device": "cuda", "dtype": torch.bfloat16}
        self.x = torch.randn(rows, d_model, **bf16)
        self.w_gate, self.w_up = (w.t().contiguous() for w in _linear_weights([(d_inter, d_model)] * 2))
        self.w_down = _linear_weights([(d_inter, d_model)])[0]  # (d_intermediate, d_model)
        self.dy = torch.randn(rows, d_model, **bf16)
        self.g, self.u, self.h = (torch.randn(rows, d_inter, **bf16) for _ in range(3))


@pytest.fixture(scope="module")
def headline():
    return _Headline()


@pytest.mark.parametrize("kernel", ["forward", "down-projection backward", "input gradient", "weight gradients"])
def test_headline_kernels(benchmark, headline, kernel, monkeypatch):
    """Each of our kernels alone at the headline shape, then cuBLAS on the same matmul (concatenated
    operands, no activation, no fusion), and, where a Hopper TMA kernel ran, the portable pointer
    kernel on its first config (what runs off Hopper). The down-projection backward overwrites its
    g and u on every call (a kernel's time does not depend on the values)."""
    t = headline
    flops = 4 * t.rows * t.d_model * t.d_inter
    group = "swiglu MLP kernels bf16 (16384x2048->5632->2048)"
    dw_gate, dw_up = (torch.empty(t.d_model, t.d_inter, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    if kernel == "forward":
        tma = use_tma_forward(t.x, t.w_gate, t.w_up)

        def run(tma):
            launch_forward(t.x, t.w_gate, t.w_up, None, None, t.h, t.g, t.u, True, False, tma)

        w_cat = torch.cat([t.w_gate, t.w_up], 1)
        cublas = lambda: torch.mm(t.x, w_cat)  # noqa: E731
        kernels = (_swiglu_fwd_kernel, _swiglu_fwd_tma_kernel)
    elif kernel == "down-projection backward":
        flops //= 2
        tma = use_tma_down_grad(t.dy, t.w_down)

        def run(tma):
            launch_down_grad(t.dy, t.w_down, t.g, t.u, t.h, tma)

        cublas = lambda: torch.mm(t.dy, t.w_down.t())  # noqa: E731
        kernels = (_mlp_down_grad_kernel, _mlp_down_grad_tma_kernel)
    elif kernel == "input gradient":
        tma = use_tma_input_grad(t.g, t.u, t.w_gate, t.w_up)

        def run(tma):
            swiglu_input_grad(t.g, t.u, t.w_gate, t.w_up, False)

        d_cat, w_cat = torch.cat([t.g, t.u], 1), torch.cat([t.w_gate, t.w_up], 1)
        cublas = lambda: torch.mm(d_cat, w_cat.t())  # noqa: E731
        kernels = (_swiglu_input_grad_kernel, _swiglu_input_grad_tma_kernel)
    else:
        tma = use_tma_weight_grad(t.x, t.g, t.u)

        def run(tma):
            launch_weight_grad(t.x, t.g, t.u, dw_gate, dw_up, tma)

        d_cat = torch.cat([t.g, t.u], 1)
        cublas = lambda: torch.mm(t.x.t(), d_cat)  # noqa: E731
        kernels = (_swiglu_weight_grad_kernel, _swiglu_weight_grad_tma_kernel)
    pointer_kernel, tuned = kernels[0], kernels[tma]
    run(tma)  # autotune first: the label names the chosen config
    shape = f"{kernel} ({_config_label(tuned)})"
    measure_paired(benchmark, group=group, shape=shape, fns={OURS: lambda: run(tma), CUBLAS: cublas}, flops=flops)
    if tma and kernel != "input gradient":  # (the input gradient's launcher has no choice to force)
        # The portable kernel on its first config only (autotuning it would compile the rest).
        monkeypatch.setattr(pointer_kernel, "configs", pointer_kernel.configs[:1])
        run(False)
        provider = f"pointer kernel ({_config_label(pointer_kernel)})"
        measure(None, group=group, shape=shape, provider=provider, fn=lambda: run(False), flops=flops)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("d_model", SWEEP_D_MODEL)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_swiglu_sweep(benchmark, dtype, d_model, mode):
    rows, d_inter = SWEEP_ROWS, 3 * d_model
    x = torch.randn(4, rows // 4, d_model, device="cuda", dtype=DTYPES[dtype])
    w_gate, w_up = _linear_weights([(d_inter, d_model)] * 2, DTYPES[dtype])
    group, shape = f"swiglu {mode} {dtype} (batch 4 x seq 2048)", f"{d_model}->{d_inter}"
    providers = [OURS, "torch", "liger"] + ([FAST_ACCUM] if dtype == "fp16" else [])
    _run_in_turn(benchmark, group, shape, providers, False, [x, w_gate, w_up], mode,
                 4 * rows * d_model * d_inter)  # fmt: skip
