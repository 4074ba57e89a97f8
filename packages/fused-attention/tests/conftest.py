"""Helpers of this package's tests, handed to them as the `attn` fixture: our kernels against the
fp64 reference and a low-precision twin. (The shared test kit has no forward+backward comparison
of several inputs and outputs; these build on its assert_close_to_reference and
poisoned_allocations.)

The twin is PyTorch computing the same FlashAttention-2 algorithm in the low precision, built
from torch ops: fp32 scores from the fp16/bf16 inputs, fp32 softmax statistics, P rounded to the
input dtype before the P @ V product and for dV, dS rounded before the dQ/dK products, fp32
accumulation in every matmul (as tensor cores do), outputs rounded once. The project's rule then
bounds our error against the fp64 reference by 2x the twin's error plus a small atol.
"""

from __future__ import annotations

import math
import types
from typing import Dict

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, poisoned_allocations

from fused_attention import flash_attention, flash_attention_varlen
from fused_attention.ops import configs, launch
from fused_attention.ops.attention import dropout_rng
from fused_attention.reference import (
    alibi_bias,
    attention_reference,
    attention_reference_varlen,
    dropout_keep_reference,
    visible_mask,
)

GRADS = ("dq", "dk", "dv")


def random_qkv(batch, seqlen_q, seqlen_k, n_heads, n_kv_heads, head_dim, dtype, device, layout="bshd"):
    """q, k, v with unit-variance entries, in `layout`."""

    def make(seqlen, heads):
        shape = (batch, seqlen, heads, head_dim) if layout == "bshd" else (batch, heads, seqlen, head_dim)
        return torch.randn(shape, device=device).to(dtype)

    return make(seqlen_q, n_heads), make(seqlen_k, n_kv_heads), make(seqlen_k, n_kv_heads)


def _to_bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(1, 2) if layout == "bshd" else t


def lowp_twin(q, k, v, dout, dlse=None, causal=False, softmax_scale=None, alibi_slopes=None, window_size=(-1, -1),
              layout="bshd", softcap=0.0, dropout_p=0.0, dropout_keep=None) -> Dict[str, torch.Tensor]:  # fmt: skip
    """out, lse, dq, dk, dv of the FlashAttention-2 algorithm in q's dtype, from torch ops."""
    dtype = q.dtype
    lowp = lambda t: t.to(dtype).float()  # noqa: E731 - round to the input dtype, keep computing in fp32
    qf, kf, vf, dof = (_to_bhsd(t, layout).float() for t in (q, k, v, dout))
    n_heads, seqlen_q, head_dim = qf.shape[1], qf.shape[2], qf.shape[3]
    group = n_heads // kf.shape[1]
    kf, vf = kf.repeat_interleave(group, dim=1), vf.repeat_interleave(group, dim=1)
    seqlen_k = kf.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale
    scores = qf @ kf.transpose(-1, -2) * scale
    cap_grad = 1.0
    if softcap:
        capped = torch.tanh(scores / softcap)
        scores, cap_grad = softcap * capped, 1.0 - capped * capped
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, seqlen_q, seqlen_k, torch.float32)
    visible = visible_mask(seqlen_q, seqlen_k, causal, window_size, device=q.device)
    scores = scores.masked_fill(~visible, -math.inf)
    any_visible = visible.any(-1, keepdim=True)
    lse = torch.logsumexp(scores.masked_fill(~any_visible, 0.0), -1, keepdim=True).masked_fill(~any_visible, -math.inf)
    p = torch.exp(scores - lse.masked_fill(~any_visible, 0.0))
    kept = p
    dp = dof @ vf.transpose(-1, -2)
    if dropout_p:
        kept = torch.where(dropout_keep, p / (1.0 - dropout_p), 0.0)
        dp = torch.where(dropout_keep, dp / (1.0 - dropout_p), 0.0)
    out = lowp(lowp(kept) @ vf)
    delta = (dof * out).sum(-1, keepdim=True)
    if dlse is not None:
        delta = delta - (dlse.float()[..., None] if dlse.dim() == 3 else dlse.float())
    dv = lowp(kept).transpose(-1, -2) @ dof
    ds = lowp(p * (dp - delta) * cap_grad)
    dq = ds @ kf * scale
    dk = ds.transpose(-1, -2) @ qf * scale

    def fold(t):  # sum the query heads that share a kv head
        return t.unflatten(1, (-1, group)).sum(2)

    result = {"out": out, "lse": lse.squeeze(-1), "dq": dq, "dk": fold(dk), "dv": fold(dv)}
    for name in ("out", "dq", "dk", "dv"):
        result[name] = result[name].to(dtype)
        if layout == "bshd":
            result[name] = result[name].transpose(1, 2)
    return result


def reference(q, k, v, dout, dlse=None, layout="bshd", **options) -> Dict[str, torch.Tensor]:
    """out, lse and the gradients of <out, dout> + <lse, dlse> in float64."""
    q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v))
    out, lse = attention_reference(q64, k64, v64, layout=layout, **options)
    loss = (out * dout.to(torch.float64)).sum()
    if dlse is not None:
        loss = loss + (lse.masked_fill(lse.isinf(), 0.0) * dlse.to(torch.float64)).sum()
    dq, dk, dv = torch.autograd.grad(loss, (q64, k64, v64))
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def run_ours(fn, q, k, v, dout, dlse=None, **kwargs) -> Dict[str, torch.Tensor]:
    """out, lse and gradients from our kernels, every allocation poisoned."""
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    with poisoned_allocations():
        out, lse = fn(q, k, v, return_lse=True, **kwargs)
    outputs, grads = [out], [dout]
    if dlse is not None:
        outputs.append(lse)
        grads.append(dlse)
    with poisoned_allocations():
        dq, dk, dv = torch.autograd.grad(outputs, (q, k, v), grads)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def lse_atol(reference_lse: torch.Tensor) -> float:
    """A few fp32 ulps at the LSE's magnitude: our LSE and the twin's are both fp32 sums of exponentials."""
    finite = reference_lse.detach()[reference_lse.isfinite()]
    magnitude = float(finite.abs().max()) if finite.numel() else 0.0
    return 4 * torch.finfo(torch.float32).eps * (1.0 + magnitude)


def compare(ours, ref, twin, names=("out", "lse", *GRADS)) -> None:
    for name in names:
        assert ours[name].shape == ref[name].shape, f"{name}: shape {tuple(ours[name].shape)}"
        if name == "lse":
            assert ours[name].dtype == torch.float32
            assert_close_to_reference(ours[name], ref[name], twin[name], atol=lse_atol(ref[name]), name=name)
        else:
            assert_close_to_reference(ours[name], ref[name], twin[name], name=name)


def dropout_words(q, seed, seed_offset: int = 0):
    """The kernels' three int32 dropout words for `seed`; None: the words the next call on q's
    device will draw (the generator's state is put back)."""
    if seed is not None:
        return dropout_rng(q.device, seed, seed_offset).tolist()
    with torch.random.fork_rng(devices=[q.device] if q.device.type == "cuda" else []):
        return dropout_rng(q.device, None, seed_offset).tolist()


def check_attention(
    q, k, v, *, with_dlse=False, layout="bshd", fn=flash_attention, deterministic=False, seed=None, seed_offset=0,
    **options,
) -> Dict[str, torch.Tensor]:  # fmt: skip
    """Run flash_attention (or `fn` with its signature) on q, k, v and check out, lse and every
    gradient; with options["dropout_p"] > 0, under `seed` (the reference regenerates the mask)."""
    dout = torch.randn(q.shape, device=q.device).to(q.dtype)
    dlse = None
    bshd = layout == "bshd"
    if with_dlse:
        lse_shape = (q.shape[0], q.shape[2 if bshd else 1], q.shape[1 if bshd else 2])
        dlse = torch.randn(lse_shape, device=q.device)
    seeds = {}
    expected = dict(options)
    if options.get("dropout_p"):
        seeds = dict(seed=seed, seed_offset=seed_offset)
        expected["dropout_keep"] = dropout_keep_reference(
            dropout_words(q, seed, seed_offset), options["dropout_p"], q.shape[0], q.shape[2 if bshd else 1],
            q.shape[1 if bshd else 2], k.shape[1 if bshd else 2], q.device,
        )  # fmt: skip
    ours = run_ours(fn, q, k, v, dout, dlse, layout=layout, deterministic=deterministic, **options, **seeds)
    ref = reference(q, k, v, dout, dlse, layout=layout, **expected)
    twin = lowp_twin(q, k, v, dout, dlse, layout=layout, **expected)
    compare(ours, ref, twin)
    return ours


def check_varlen(
    q, k, v, cu_seqlens_q, cu_seqlens_k, *, with_dlse=False, seed=None, **options
) -> Dict[str, torch.Tensor]:  # fmt: skip
    """flash_attention_varlen on a packed batch against the per-sequence reference and twin."""
    max_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max())
    max_k = int((cu_seqlens_k[1:] - cu_seqlens_k[:-1]).max())
    dout = torch.randn(q.shape, device=q.device).to(q.dtype)
    dlse = torch.randn(q.shape[1], q.shape[0], device=q.device) if with_dlse else None

    def ours_fn(q, k, v, return_lse, **kw):
        return flash_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, return_lse=return_lse, **kw)

    seeds, words = {}, None
    if options.get("dropout_p"):
        seeds, words = dict(seed=seed), dropout_words(q, seed)
    ours = run_ours(ours_fn, q, k, v, dout, dlse, **options, **seeds)
    compare(ours, *varlen_expected(q, k, v, dout, dlse, cu_seqlens_q, cu_seqlens_k, dropout_words=words, **options))
    return ours


def varlen_expected(q, k, v, dout, dlse, cu_seqlens_q, cu_seqlens_k, dropout_words=None, **options):
    """(fp64 reference, low-precision twin) of a packed batch, each sequence on its own."""
    q64, k64, v64 = (t.detach().to(torch.float64).requires_grad_(True) for t in (q, k, v))
    out, lse = attention_reference_varlen(
        q64, k64, v64, cu_seqlens_q, cu_seqlens_k, dropout_words=dropout_words, **options
    )
    loss = (out * dout.double()).sum() + (0 if dlse is None else (lse.masked_fill(lse.isinf(), 0) * dlse).sum())
    ref = dict(zip(("out", "lse", *GRADS), (out, lse, *torch.autograd.grad(loss, (q64, k64, v64)))))
    return ref, _varlen_twin(q, k, v, dout, dlse, cu_seqlens_q, cu_seqlens_k, dropout_words, **options)


def _varlen_twin(q, k, v, dout, dlse, cu_seqlens_q, cu_seqlens_k, words, alibi_slopes=None, **options):
    parts = []
    offsets_q, offsets_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(offsets_q) - 1):
        rows_q, rows_k = slice(offsets_q[b], offsets_q[b + 1]), slice(offsets_k[b], offsets_k[b + 1])
        slopes = None if alibi_slopes is None else (alibi_slopes if alibi_slopes.dim() == 1 else alibi_slopes[b])
        keep = None
        if options.get("dropout_p"):
            keep = dropout_keep_reference(
                words, options["dropout_p"], 1, q.shape[1], rows_q.stop - rows_q.start, rows_k.stop - rows_k.start,
                q.device, b,
            )  # fmt: skip
        parts.append(
            lowp_twin(
                q[None, rows_q], k[None, rows_k], v[None, rows_k], dout[None, rows_q],
                None if dlse is None else dlse[None, :, rows_q], alibi_slopes=slopes, dropout_keep=keep, **options,
            )
        )  # fmt: skip
    twin = {name: torch.cat([p[name][0] for p in parts], dim=0) for name in ("out", "dq", "dk", "dv")}
    twin["lse"] = torch.cat([p["lse"][0] for p in parts], dim=1)
    return twin


def cu_seqlens(lengths, device) -> torch.Tensor:
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    return torch.tensor(offsets, dtype=torch.int32, device=device)


@pytest.fixture
def attn():
    """The helpers above, for the test modules (conftest modules are not importable by name)."""
    return types.SimpleNamespace(
        random_qkv=random_qkv,
        check_attention=check_attention,
        check_varlen=check_varlen,
        dropout_words=dropout_words,
        varlen_expected=varlen_expected,
        cu_seqlens=cu_seqlens,
        lowp_twin=lowp_twin,
        reference=reference,
        run_ours=run_ours,
        compare=compare,
    )


@pytest.fixture(autouse=True)
def _first_config_only(request, monkeypatch):
    """Compiled, every kernel specialization a test meets autotunes over all its candidate
    configs, a compile of seconds each. Tests pin the first candidate instead, unless they ask
    for the `full_autotune` fixture; test_every_autotune_config checks every candidate. (When
    interpreting there is one config already.)"""
    if "full_autotune" in request.fixturenames:
        yield
        return
    original = configs.candidate_configs
    monkeypatch.setattr(configs, "candidate_configs", lambda *args: original(*args)[:1])
    _forget_configs()
    yield
    _forget_configs()


def _forget_configs():
    """Drop the plans, the autotuners and their choices."""
    launch.clear_plans()


@pytest.fixture
def full_autotune():
    """Requested by tests that run the autotuner over every candidate config, as users do."""
    _forget_configs()
    yield
    _forget_configs()
