"""RoPE of q and k, bf16, rotate-half: ours against torch eager, torch.compile and Liger-Kernel.

Layout: q, k of (batch, seq, heads, head_dim) memory (what a fused qkv projection gives),
handed over as the (batch, heads, seq, head_dim) views that HF / Liger take (no copy) and as
bshd to the TransformerEngine-style API. Providers:
- tritonformer: apply_rotary_qk, q and k in one launch from cos/sin tables, new tensors;
- tritonformer inplace (forward only: it overwrites its inputs): the same, in place;
- tritonformer TE-style: apply_rotary_pos_emb on q then k (two launches, angles `freqs`,
  cos/sin computed in the kernel);
- torch: TransformerEngine's unfused formula (reference.py) in bf16 on q and k;
- torch.compile: the same function compiled (default automatic dynamic shapes: the first
  shape, the headline, compiles static; the sweep reuses one dynamic recompile);
- liger: liger_kernel.transformers.rope.liger_rotary_pos_emb (in place; whole heads only).
Memory-bound: bytes = q and k read once and written once, 4 * (q + k) bytes per direction
(fwd+bwd: twice that); the cos/sin or angle tables (< 0.5 %) are not counted.

Headline: q, k (4, 32, 4096, 128). Sweeps around it, one axis at a time (the seed's): seq
length, head dim (hidden size per head), rotary percent, batch, heads, margin (extra rows of
angles beyond the sequence).
"""

import pytest
import torch
from tritonformer_testkit import triton_version
from tritonformer_testkit.bench import OURS, measure

from fused_rope import apply_rotary_pos_emb, apply_rotary_qk
from fused_rope.reference import apply_rotary_pos_emb_reference

pytestmark = pytest.mark.gpu(reason="benchmarks time compiled kernels on a CUDA GPU")

BASE = dict(seq=4096, head_dim=128, rotary_percent=1.0, batch=4, heads=32, margin=0)
SWEEPS = {
    "seq": [1024, 2048],
    "head_dim": [256, 512],
    "rotary_percent": [0.5],
    "batch": [2, 16],
    "heads": [8, 64],
    "margin": [10, 77],
}
POINTS = [pytest.param("headline", BASE, id="headline")] + [
    pytest.param(axis, {**BASE, axis: value}, id=f"{axis}={value}")
    for axis, values in SWEEPS.items()
    for value in values
]
PROVIDERS = [OURS, "tritonformer inplace", "tritonformer TE-style", "torch", "torch.compile", "liger"]
COMPILED = {}


def _torch_rope(q, k, freqs):
    return apply_rotary_pos_emb_reference(q, freqs, "bshd"), apply_rotary_pos_emb_reference(k, freqs, "bshd")


def _bshd(outputs):
    """(batch, heads, seq, head_dim) views back to (batch, seq, heads, head_dim): free."""
    return tuple(x.transpose(1, 2) for x in outputs)


def _provider_fn(provider, mode, point):
    """fn(q, k, q_view, k_view, freqs, cos, sin) -> q, k results (b, s, h, d), or skip with the exact reason."""
    if provider == OURS:
        return lambda q, k, qv, kv, freqs, cos, sin: _bshd(apply_rotary_qk(qv, kv, cos, sin))
    if provider == "tritonformer inplace":
        if mode != "fwd":
            pytest.skip("in place is timed forward only: it overwrites its inputs")
        return lambda q, k, qv, kv, freqs, cos, sin: _bshd(apply_rotary_qk(qv, kv, cos, sin, inplace=True))
    if provider == "tritonformer TE-style":
        return lambda q, k, qv, kv, freqs, cos, sin: (
            apply_rotary_pos_emb(q, freqs, "bshd"),
            apply_rotary_pos_emb(k, freqs, "bshd"),
        )
    if provider == "torch":
        return lambda q, k, qv, kv, freqs, cos, sin: _torch_rope(q, k, freqs)
    if provider == "torch.compile":
        if triton_version() < (3, 0):
            pytest.skip("torch.compile's Inductor needs Triton 3.x; this run has Triton 2.x first on the path")
        compiled = COMPILED.setdefault(mode, torch.compile(_torch_rope))
        return lambda q, k, qv, kv, freqs, cos, sin: compiled(q, k, freqs)
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError as error:
        pytest.skip(f"liger_kernel is not importable here: {error}")
    if point["rotary_percent"] < 1.0:
        pytest.skip("Liger rotates whole heads: no partial rotary (rotary_percent < 1)")
    seq = point["seq"]
    return lambda q, k, qv, kv, freqs, cos, sin: _bshd(liger_rotary_pos_emb(qv, kv, cos[:, :seq], sin[:, :seq]))


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("axis, point", POINTS)
def test_rope_qk(benchmark, axis, point, provider, mode):
    batch, seq, heads, head_dim = point["batch"], point["seq"], point["heads"], point["head_dim"]
    d2, n_positions = int(head_dim * point["rotary_percent"]), seq + point["margin"]
    fn = _provider_fn(provider, mode, point)
    grad = mode != "fwd"
    q = torch.randn(batch, seq, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
    k = torch.randn(batch, seq, heads, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=grad)
    qv, kv = q.transpose(1, 2), k.transpose(1, 2)  # (batch, heads, seq, head_dim) views
    theta = torch.arange(n_positions, device="cuda")[:, None] * 10000 ** (-torch.arange(0, d2, 2, device="cuda") / d2)
    freqs = torch.cat((theta, theta), -1).view(n_positions, 1, 1, d2)
    cos = freqs.view(1, n_positions, d2).cos().to(torch.bfloat16)
    sin = freqs.view(1, n_positions, d2).sin().to(torch.bfloat16)
    args = (q, k, qv, kv, freqs, cos, sin)
    one_direction = 2 * (q.numel() + k.numel()) * q.element_size()
    group = f"rope q,k bf16 {'headline' if axis == 'headline' else axis + ' sweep'} {mode}"
    shape = f"B{batch} S{seq} H{heads} D{head_dim} rot{point['rotary_percent']} margin{point['margin']}"
    if mode == "fwd":
        with torch.no_grad():
            measure(benchmark, group=group, shape=shape, provider=provider, fn=lambda: fn(*args),
                    bytes=one_direction)  # fmt: skip
    else:
        dq, dk = torch.randn_like(q), torch.randn_like(k)

        def fwd_bwd():
            q_out, k_out = fn(*args)
            return torch.autograd.grad((q_out, k_out), (q, k), (dq, dk))

        measure(benchmark, group=group, shape=shape, provider=provider, fn=fwd_bwd, bytes=2 * one_direction)
