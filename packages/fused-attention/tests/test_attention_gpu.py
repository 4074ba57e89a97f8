"""Compiled on a GPU at real sizes: lengths up to 4099, every head dim, GQA 8:1 and 32:1, every
autotune config of every kernel, int64 offsets past 2^31 elements, autocast, torch.compile.

The reference runs in fp64 on the GPU too (an fp32 reference would be as far from the truth as
the fp32 LSE it judges), and the low-precision twin is the same FlashAttention-2 computation in
torch ops (see conftest.py).
"""

import pytest
import torch
from tritonformer_testkit import triton_version

from fused_attention import alibi_slopes, flash_attention, flash_attention_varlen
from fused_attention._compat import device_capability
from fused_attention.ops.configs import candidate_configs
from fused_attention.ops.launch import AttentionSpec, attention_bwd, attention_fwd

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32


def _slopes(kind, batch, n_heads):
    if kind == "heads":
        return alibi_slopes(n_heads, device="cuda")
    if kind == "batch":
        return torch.rand(batch, n_heads, device="cuda") + 0.05
    return None


@pytest.mark.gpu(reason="real sequence lengths need the compiled kernels (and the autotuner over every config)")
@pytest.mark.parametrize("dtype", [pytest.param(FP16, id="fp16"), pytest.param(BF16, id="bf16")])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen", [1, 17, 100, 1000, 4099])
def test_sequence_lengths(seqlen, causal, dtype, attn, full_autotune):
    q, k, v = attn.random_qkv(3, seqlen, seqlen, 4, 2, 128, dtype, "cuda")
    attn.check_attention(q, k, v, with_dlse=True, causal=causal)


@pytest.mark.gpu(reason="S_q != S_k at real sizes needs the compiled kernels")
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1000, 4099), (4099, 1000), (1, 4099)])
@pytest.mark.parametrize("options", [{"causal": True}, {"window_size": (256, 32)}, {"causal": True, "alibi": "heads"}])
def test_bottom_right_alignment(seqlen_q, seqlen_k, options, attn):
    options = dict(options)
    slopes = _slopes(options.pop("alibi", None), 1, 4)
    q, k, v = attn.random_qkv(1, seqlen_q, seqlen_k, 4, 4, 64, BF16, "cuda")
    attn.check_attention(q, k, v, alibi_slopes=slopes, **options)


@pytest.mark.gpu(reason="every head dim at a real length needs the compiled kernels")
@pytest.mark.parametrize("head_dim", [16, 32, 64, 80, 96, 128, 160, 192, 256])
def test_head_dims(head_dim, attn):
    q, k, v = attn.random_qkv(2, 1000, 1000, 4, 2, head_dim, BF16, "cuda")
    attn.check_attention(q, k, v, causal=True, alibi_slopes=_slopes("heads", 2, 4))


@pytest.mark.gpu(reason="GQA at real sizes needs the compiled kernels")
@pytest.mark.parametrize("n_heads, n_kv_heads", [(8, 1), (32, 1), (16, 4)])
def test_grouped_query_heads(n_heads, n_kv_heads, attn):
    q, k, v = attn.random_qkv(2, 1000, 1000, n_heads, n_kv_heads, 128, BF16, "cuda")
    attn.check_attention(q, k, v, causal=True)


@pytest.mark.gpu(reason="option combinations at real sizes need the compiled kernels")
@pytest.mark.parametrize(
    "options",
    [
        {"alibi": "batch"},
        {"window_size": (100, 100), "alibi": "heads"},
        {"causal": True, "window_size": (512, 0), "alibi": "heads"},
        {"softmax_scale": 0.05, "causal": True},
    ],
    ids=["alibi-full", "window-alibi", "local-causal-alibi", "scale"],
)
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_options_and_layouts(layout, options, attn):
    options = dict(options)
    slopes = _slopes(options.pop("alibi", None), 2, 8)
    q, k, v = attn.random_qkv(2, 1531, 1531, 8, 8, 64, FP16, "cuda", layout=layout)
    attn.check_attention(q, k, v, layout=layout, alibi_slopes=slopes, **options)


@pytest.mark.gpu(reason="strided inputs at real sizes need the compiled kernels")
def test_packed_qkv_projection_views(attn):
    qkv = torch.randn(2, 1100, 3, 8, 128, device="cuda", dtype=BF16)
    attn.check_attention(*qkv.unbind(2), causal=True)


@pytest.mark.gpu(reason="varlen batches at real sizes need the compiled kernels")
@pytest.mark.parametrize("options", [{"causal": True}, {"window_size": (64, 0), "alibi": "batch"}, {}])
def test_varlen(options, attn):
    options = dict(options)
    lengths = [1, 1000, 17, 4099, 300, 1, 2048]
    slopes = _slopes(options.pop("alibi", None), len(lengths), 8)
    q = torch.randn(sum(lengths), 8, 128, device="cuda", dtype=BF16)
    k = torch.randn(sum(lengths), 2, 128, device="cuda", dtype=BF16)
    v = torch.randn(sum(lengths), 2, 128, device="cuda", dtype=BF16)
    cu = attn.cu_seqlens(lengths, "cuda")
    attn.check_varlen(q, k, v, cu, cu, alibi_slopes=slopes, **options)


def _all_configs(kind, block_d):
    tma = device_capability(torch.cuda.current_device())[0] >= 9 and triton_version() >= (3, 4)
    configs = candidate_configs(kind, block_d, False) + (candidate_configs(kind, block_d, True) if tma else [])
    return configs


@pytest.mark.gpu(reason="each autotune config runs compiled")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_autotune_config(head_dim, attn, full_autotune):
    """Whatever config the autotuner picks is correct: each of them, pointer and TMA loads."""
    q, k, v = attn.random_qkv(2, 777, 801, 4, 2, head_dim, BF16, "cuda")
    slopes = _slopes("heads", 2, 4)
    dout = torch.randn_like(q)
    options = {"causal": True, "window_size": (300, -1), "alibi_slopes": slopes}
    ref = attn.reference(q, k, v, dout, **options)
    twin = attn.lowp_twin(q, k, v, dout, **options)
    spec = AttentionSpec(2, 4, 2, head_dim, 777, 801, head_dim**-0.5, 300, 0, True, False, False)
    fwd_configs, dkdv_configs, dq_configs = (_all_configs(kind, head_dim) for kind in ("fwd", "dkdv", "dq"))
    for i in range(max(len(fwd_configs), len(dkdv_configs), len(dq_configs))):
        fwd, dkdv, dq = (c[i % len(c)] for c in (fwd_configs, dkdv_configs, dq_configs))
        out, lse = attention_fwd(q, k, v, slopes, None, None, spec, fwd)
        grads = attention_bwd(dout, q, k, v, out, lse, None, slopes, None, None, spec, dkdv, dq)
        attn.compare(dict(zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads))), ref, twin)


@pytest.mark.gpu(reason="a 2^31+ element tensor needs a GPU (about 24 GiB)")
def test_int64_batch_offsets(attn):
    """The second batch starts past element 2^31: offsets are computed in int64."""
    heads, head_dim, seqlen = 16, 128, 300
    stride_b = 2**31 // (heads * head_dim) + 64
    buffers = [torch.randn(2, stride_b, heads, head_dim, device="cuda", dtype=BF16) for _ in range(3)]
    q, k, v = (b[:, :seqlen] for b in buffers)
    out = flash_attention(q, k, v, causal=True)
    tail = [t[1:].contiguous() for t in (q, k, v)]
    del buffers, q, k, v
    _check_forward(out[1:], *tail, attn)


def _check_forward(out, q, k, v, attn):
    dout = torch.zeros_like(q)
    ref = attn.reference(q, k, v, dout, causal=True)
    twin = attn.lowp_twin(q, k, v, dout, causal=True)
    attn.compare({"out": out}, ref, twin, names=("out",))


@pytest.mark.gpu(reason="a packed batch of 2^31+ elements needs a GPU (about 13 GiB)")
def test_int64_varlen_row_offsets(attn):
    """Packed rows past 2^31 elements: the last sequences are still right."""
    heads, head_dim, length = 16, 128, 1024
    n_seqs = 2**31 // (length * heads * head_dim) + 2
    total = n_seqs * length
    q, k, v = (torch.randn(total, heads, head_dim, device="cuda", dtype=BF16) for _ in range(3))
    cu = torch.arange(0, total + 1, length, device="cuda", dtype=torch.int32)
    out = flash_attention_varlen(q, k, v, cu, cu, length, length, causal=True, check_seqlens=False)
    tail = slice(total - length, total)
    _check_forward(out[tail][None], *(t[tail][None] for t in (q, k, v)), attn)


@pytest.mark.gpu(reason="the backward's determinism is a property of the compiled kernels")
def test_backward_is_deterministic(attn):
    q, k, v = (t.requires_grad_(True) for t in attn.random_qkv(2, 2000, 2000, 16, 2, 128, BF16, "cuda"))
    out = flash_attention(q, k, v, causal=True)
    dout = torch.randn_like(out)
    first = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    second = torch.autograd.grad(out, (q, k, v), dout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.gpu(reason="autocast runs on CUDA")
def test_autocast_on_cuda(attn):
    q, k, v = (t.requires_grad_(True) for t in attn.random_qkv(2, 500, 500, 4, 4, 64, FP32, "cuda"))
    with torch.autocast("cuda", dtype=BF16):
        out = flash_attention(q, k, v, causal=True)
    assert out.dtype == BF16
    out.float().sum().backward()
    assert q.grad.dtype == FP32 and torch.isfinite(q.grad).all()


@pytest.mark.gpu(reason="torch.compile with Inductor compiles for the GPU")
def test_torch_compile_inductor(attn):
    if triton_version() < (3, 0):
        pytest.skip("torch.compile's Inductor needs Triton 3.x; this run has Triton 2.x first on the path")
    q, k, v = (t.requires_grad_(True) for t in attn.random_qkv(2, 512, 512, 8, 2, 64, BF16, "cuda"))

    def block(q, k, v):
        return flash_attention(q * 1.0, k, v, causal=True).float().square().mean()

    compiled = torch.compile(block, fullgraph=True)
    loss, expected = compiled(q, k, v), block(q, k, v)
    # Same kernels; Inductor only reorders the fp32 elementwise work around them (a last-bit
    # difference in the upstream gradient), so this checks the wiring, not the numerics.
    torch.testing.assert_close(loss, expected)
    grads = torch.autograd.grad(loss, (q, k, v))
    expected_grads = torch.autograd.grad(expected, (q, k, v))
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b)
