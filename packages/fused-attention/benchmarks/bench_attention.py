"""Flash attention forward, backward and forward+backward, bf16: ours against PyTorch SDPA's cuDNN,
FlashAttention-2 and memory-efficient backends, and (ALiBi) against compiled flex_attention.

The FlashAttention benchmark grid: hidden size 2048 (H = 2048 / D heads), 16k tokens per batch
(B = 16384 / S), D in 64 and 128, causal and not. FLOPs: forward 4 * B * H * S^2 * D, halved
when causal; backward 2.5x the forward, forward+backward 3.5x (the FlashAttention convention;
recomputation is not counted). TFLOP/s in the tables use these counts.

To keep the file near three minutes on an H100 (each point also runs the profiler and a host
timing), the sweep is: forward+backward at S = 512 ... 16384; forward at S = 1024, 4096, 16384;
backward alone at S = 4096; the memory-efficient backend (the slowest anchor) at S = 4096 only;
ALiBi (D = 128, causal) at S = 2048, 4096, 8192 against our own plain causal run (its ratio is the
cost of the bias) and, at S = 4096 only, compiled flex_attention (each shape is a new Inductor
compile of its forward and backward).
"""

import pytest
import torch
from tritonformer_testkit import triton_version
from tritonformer_testkit.bench import OURS, measure

from fused_attention import alibi_slopes, flash_attention

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

HIDDEN, TOKENS = 2048, 16384
SWEEP = (512, 1024, 2048, 4096, 8192, 16384)
FWD_SWEEP = (1024, 4096, 16384)
SDPA_BACKENDS = {
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-flash2": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
}
PLAIN_CAUSAL = "tritonformer causal, no ALiBi"
FLEX = "flex_attention (compiled)"


def _points():
    for head_dim in (64, 128):
        for causal in (False, True):
            for seqlen in SWEEP:
                for provider in (OURS, "sdpa-cudnn", "sdpa-flash2", "sdpa-efficient"):
                    for mode in ("fwd", "bwd", "fwd+bwd"):
                        if mode == "fwd" and seqlen not in FWD_SWEEP:
                            continue
                        if mode == "bwd" and seqlen != 4096:
                            continue
                        if provider == "sdpa-efficient" and (seqlen != 4096 or mode == "bwd"):
                            continue
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
    if provider == OURS:
        q, k, v = _inputs(batch, heads, seqlen, head_dim, "bshd")  # FlashAttention's layout

        def fn(q, k, v):
            return flash_attention(q, k, v, causal=causal)
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
        flops=flops(batch, heads, seqlen, head_dim, causal, mode),
    )


def _flex_alibi(heads):
    if triton_version() < (3, 0):
        pytest.skip("flex_attention compiles through Inductor, which needs Triton 3.x; this run has Triton 2.x")
    flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="flex_attention needs torch >= 2.5")
    slopes = alibi_slopes(heads, device="cuda")

    def alibi(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx).abs()

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    compiled = torch.compile(flex.flex_attention, dynamic=False)
    masks = {}

    def run(q, k, v):
        seqlen = q.shape[2]
        if seqlen not in masks:
            masks[seqlen] = flex.create_block_mask(causal, None, None, seqlen, seqlen, device="cuda")
        return compiled(q, k, v, score_mod=alibi, block_mask=masks[seqlen])

    return run


def _alibi_points():
    for seqlen in (2048, 4096, 8192):
        for provider in (OURS, PLAIN_CAUSAL, FLEX):
            if provider == FLEX and seqlen != 4096:
                continue  # each shape is a fresh Inductor compile of the forward and the backward
            for mode in ("fwd", "fwd+bwd"):
                yield pytest.param(seqlen, provider, mode, id=f"s{seqlen}-{provider}-{mode}")


@pytest.mark.parametrize("seqlen, provider, mode", list(_alibi_points()))
def test_alibi_causal(benchmark, seqlen, provider, mode):
    head_dim = 128
    heads, batch = HIDDEN // head_dim, TOKENS // seqlen
    slopes = alibi_slopes(heads, device="cuda")
    if provider == FLEX:
        q, k, v = _inputs(batch, heads, seqlen, head_dim, "bhsd")
        fn = _flex_alibi(heads)
    else:
        q, k, v = _inputs(batch, heads, seqlen, head_dim, "bshd")
        with_alibi = provider == OURS

        def fn(q, k, v):
            return flash_attention(q, k, v, causal=True, alibi_slopes=slopes if with_alibi else None)

    measure(
        benchmark,
        group=f"attention ALiBi {mode} D=128 causal bf16 (hidden 2048, 16k tokens)",
        shape=f"B{batch}xH{heads}xS{seqlen}",
        provider=provider,
        fn=_timed(fn, q, k, v, mode),
        flops=flops(batch, heads, seqlen, head_dim, True, mode),
    )
