"""Flash attention forward, backward and forward+backward, bf16: ours against PyTorch SDPA's cuDNN,
FlashAttention-2 and memory-efficient backends, and (ALiBi) against compiled flex_attention.

The FlashAttention benchmark grid: hidden size 2048 (H = 2048 / D heads), 16k tokens per batch
(B = 16384 / S), D in 64 and 128, causal and not. FLOPs: forward 4 * B * H * S^2 * D, halved
when causal; backward 2.5x the forward, forward+backward 3.5x (the FlashAttention convention;
recomputation is not counted). TFLOP/s in the tables use these counts.

The file runs in about two and a half minutes on an H100 (each point also runs the profiler and
a host timing, a second or two per point): forward+backward at S = 512, 1024, 4096 and 16384;
forward at S = 1024 and 4096 (D = 128) and 4096 (D = 64); backward alone at S = 4096 (D = 128);
the memory-efficient backend (the slowest anchor) at D = 128 causal S = 4096 only; ALiBi (D = 128,
causal, S = 4096) against our own plain causal run (its ratio is the cost of the bias) and
compiled flex_attention twice: causal as a block mask (its fastest set-up), and causal masked
inside the ALiBi score_mod without a block mask (flex_attention then computes the masked blocks
too). Extra rows at the headline (D = 128 causal S = 4096, forward+backward):
our deterministic backward (always the dQ kernel, the GPU's default path too, so level) and an
autograd floor (an autograd.Function that allocates the gradients and launches nothing: what
any single-op forward+backward costs the host here, the engine's hand-off to its device thread
included; at short sequences compare `host us/call` with it).

Compiles are started first, in parallel processes (`_warm_compile.py`), one per combination of
head dim, mask, ALiBi, backward mode and direction, plus flex_attention's: the benchmark's own
autotuning then finds the kernels in Triton's cache instead of compiling them one by one.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tritonformer_testkit import triton_version
from tritonformer_testkit.bench import OURS, measure

from fused_attention import alibi_slopes, flash_attention

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

HIDDEN, TOKENS = 2048, 16384
SWEEP = (512, 1024, 4096, 16384)
HEADLINE_SEQLEN = 4096
SDPA_BACKENDS = {
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-flash2": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
}
DETERMINISTIC = "tritonformer deterministic=True"
FLOOR = "autograd floor (no kernels)"
PLAIN_CAUSAL = "tritonformer causal, no ALiBi"
FLEX = "flex_attention (compiled)"
# Causal masked inside the score_mod, no block mask: flex_attention computes the masked blocks too.
FLEX_NO_BLOCK_MASK = "flex_attention (compiled), causal in the score_mod"
# (head dim, causal, ALiBi, deterministic) of every configuration of ours the file runs.
OUR_COMBINATIONS = [(64, False, False, False), (64, True, False, False), (128, False, False, False),
                    (128, True, False, False), (128, True, True, False), (128, True, False, True),
                    (128, True, True, True)]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def _compile_ahead():
    """Compile our kernels (and flex_attention) in parallel processes before any timing."""
    if not torch.cuda.is_available():
        yield
        return
    script = Path(__file__).with_name("_warm_compile.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    commands = [
        [sys.executable, str(script), *(str(int(x)) for x in combination), direction]
        for combination in OUR_COMBINATIONS
        for direction in (("bwd",) if combination[3] else ("fwd", "bwd"))  # deterministic: the backward differs
    ]
    heads = HIDDEN // 128
    if triton_version() >= (3, 0):
        commands.append([sys.executable, str(script), "flex", str(TOKENS // HEADLINE_SEQLEN), str(heads),
                         str(HEADLINE_SEQLEN), "128"])  # fmt: skip
    processes = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in commands]
    for process in processes:
        try:
            _, stderr = process.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            process.kill()
            continue
        if process.returncode:  # not fatal: the benchmark then compiles what is missing itself
            print(f"\n_warm_compile {process.args[2:]} failed:\n{stderr.decode()[-2000:]}", file=sys.stderr)
    yield


def _points():
    for head_dim in (64, 128):
        for causal in (False, True):
            for seqlen in SWEEP:
                providers = [OURS, "sdpa-cudnn", "sdpa-flash2"]
                headline = head_dim == 128 and causal and seqlen == HEADLINE_SEQLEN
                if headline:
                    providers += ["sdpa-efficient", DETERMINISTIC, FLOOR]
                for provider in providers:
                    modes = ["fwd+bwd"]
                    if seqlen == HEADLINE_SEQLEN or (head_dim == 128 and seqlen == 1024):
                        modes.append("fwd")
                    if head_dim == 128 and seqlen == HEADLINE_SEQLEN:
                        modes.append("bwd")
                    if provider in (DETERMINISTIC, FLOOR):
                        modes = ["fwd+bwd"]
                    if provider == "sdpa-efficient":
                        modes = ["fwd", "fwd+bwd"]
                    for mode in modes:
                        yield pytest.param(
                            head_dim, causal, seqlen, provider, mode,
                            id=f"d{head_dim}-{'causal' if causal else 'full'}-s{seqlen}-{provider}-{mode}",
                        )  # fmt: skip


def flops(batch, heads, seqlen, head_dim, causal, mode):
    fwd = 4 * batch * heads * seqlen * seqlen * head_dim * (0.5 if causal else 1.0)
    return fwd * {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[mode]


def _sdpa(backend_name: str, causal: bool):
    attention = pytest.importorskip("torch.nn.attention", reason="torch.nn.attention.sdpa_kernel needs torch >= 2.3")
    backend = getattr(attention.SDPBackend, SDPA_BACKENDS[backend_name], None)
    if backend is None:
        pytest.skip(f"this torch has no SDPBackend.{SDPA_BACKENDS[backend_name]}")

    def run(q, k, v):
        with attention.sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


class _AutogradFloor(torch.autograd.Function):
    """Allocates what an attention Function would (out; dq, dk, dv), launches nothing."""

    @staticmethod
    def forward(ctx, q, k, v):
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, dout):
        return torch.empty_like(dout), torch.empty_like(dout), torch.empty_like(dout)


def _timed(fn, q, k, v, mode):
    """The closure to time: forward only, backward only (graph kept), or both."""
    if mode == "fwd":

        def forward():
            with torch.no_grad():
                return fn(q, k, v)

        return forward
    out = fn(q, k, v)
    dout = torch.randn_like(out)
    if mode == "bwd":
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), dout)


def _inputs(batch, heads, seqlen, head_dim, layout):
    shape = (batch, seqlen, heads, head_dim) if layout == "bshd" else (batch, heads, seqlen, head_dim)
    return [torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("head_dim, causal, seqlen, provider, mode", list(_points()))
def test_attention(benchmark, head_dim, causal, seqlen, provider, mode):
    heads, batch = HIDDEN // head_dim, TOKENS // seqlen
    if provider in (OURS, DETERMINISTIC, FLOOR):
        q, k, v = _inputs(batch, heads, seqlen, head_dim, "bshd")  # FlashAttention's layout
        deterministic = provider == DETERMINISTIC

        def fn(q, k, v):
            if provider == FLOOR:
                return _AutogradFloor.apply(q, k, v)
            return flash_attention(q, k, v, causal=causal, deterministic=deterministic)
    else:
        q, k, v = _inputs(batch, heads, seqlen, head_dim, "bhsd")  # SDPA's layout
        fn = _sdpa(provider, causal)
        try:
            fn(q, k, v)
        except RuntimeError as error:
            pytest.skip(f"{provider} cannot run B={batch} H={heads} S={seqlen} D={head_dim}: {error}".splitlines()[0])
    measure(
        benchmark,
        group=f"attention {mode} D={head_dim} {'causal' if causal else 'full'} bf16 (hidden 2048, 16k tokens)",
        shape=f"B{batch}xH{heads}xS{seqlen}",
        provider=provider,
        fn=_timed(fn, q, k, v, mode),
        flops=None if provider == FLOOR else flops(batch, heads, seqlen, head_dim, causal, mode),
    )


def _flex_alibi(heads, block_mask=True):
    if triton_version() < (3, 0):
        pytest.skip("flex_attention compiles through Inductor, which needs Triton 3.x; this run has Triton 2.x")
    flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="flex_attention needs torch >= 2.5")
    slopes = alibi_slopes(heads, device="cuda")

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def alibi_and_causal(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, alibi(score, b, h, q_idx, kv_idx), -float("inf"))

    compiled = torch.compile(flex.flex_attention, dynamic=False)
    masks = {}

    def run(q, k, v):
        if not block_mask:
            return compiled(q, k, v, score_mod=alibi_and_causal)
        seqlen = q.shape[2]
        if seqlen not in masks:
            masks[seqlen] = flex.create_block_mask(causal, None, None, seqlen, seqlen, device="cuda")
        return compiled(q, k, v, score_mod=alibi, block_mask=masks[seqlen])

    return run


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("provider", [OURS, PLAIN_CAUSAL, FLEX, FLEX_NO_BLOCK_MASK, DETERMINISTIC])
def test_alibi_causal(benchmark, provider, mode):
    if provider == DETERMINISTIC and mode == "fwd":
        pytest.skip("deterministic=True changes the backward only")
    head_dim, seqlen = 128, HEADLINE_SEQLEN
    heads, batch = HIDDEN // head_dim, TOKENS // seqlen
    slopes = alibi_slopes(heads, device="cuda")
    if provider in (FLEX, FLEX_NO_BLOCK_MASK):
        q, k, v = _inputs(batch, heads, seqlen, head_dim, "bhsd")
        fn = _flex_alibi(heads, block_mask=provider == FLEX)
    else:
        q, k, v = _inputs(batch, heads, seqlen, head_dim, "bshd")
        with_alibi, deterministic = provider != PLAIN_CAUSAL, provider == DETERMINISTIC

        def fn(q, k, v):
            return flash_attention(
                q, k, v, causal=True, alibi_slopes=slopes if with_alibi else None, deterministic=deterministic
            )

    measure(
        benchmark,
        group=f"attention ALiBi {mode} D=128 causal bf16 (hidden 2048, 16k tokens)",
        shape=f"B{batch}xH{heads}xS{seqlen}",
        provider=provider,
        fn=_timed(fn, q, k, v, mode),
        flops=flops(batch, heads, seqlen, head_dim, True, mode),
    )
