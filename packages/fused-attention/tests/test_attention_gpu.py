"""Compiled on a GPU at real sizes: lengths up to 4099, every head dim, GQA 8:1 and 32:1, every
autotune config of every kernel, int64 offsets past 2^31 elements, autocast, torch.compile.

The reference runs in fp64 on the GPU too (an fp32 reference would be as far from the truth as
the fp32 LSE it judges), and the low-precision twin is the same FlashAttention-2 computation in
torch ops (see conftest.py).

Budget: about a minute and a half with 3 processes on one GPU. The cost is compiles (seconds per
kernel specialization), so each case uses a specialization (dtype, head dim, mask/bias flags,
layout, dQ mode) that the small tests (test_attention.py, test_varlen.py, run first) compile
too: sizes and the LSE strides are not specialized, so real sizes hit the same compiled kernels.
Only the int64 strides, the extra autotune configs and Inductor compile anew. The fp64
references stay at a few GiB (the S x S problems at S = 4099 have one batch and two heads), and
each test returns its cached GPU memory to the driver when it ends, for the other processes.
"""

import pytest
import torch
from tritonformer_testkit import triton_version

from fused_attention import alibi_slopes, flash_attention
from fused_attention._runtime.compat import HAS_GLUON_HOPPER
from fused_attention._runtime.launch import DIRECT_LAUNCH, Launch
from fused_attention.ops import configs, launch
from fused_attention.ops.configs import candidate_configs, dq_atomic
from fused_attention.ops.launch import AttentionSpec, _tma_by_default, attention_bwd, attention_fwd

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    """Tests run in parallel processes on one GPU: give cached blocks back when a test ends."""
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _slopes(kind, batch, n_heads):
    if kind == "heads":
        return alibi_slopes(n_heads, device="cuda")
    if kind == "batch":
        return torch.rand(batch, n_heads, device="cuda") + 0.05
    return None


@pytest.mark.gpu(reason="real sequence lengths need the compiled kernels")
@pytest.mark.parametrize(
    "seqlen, causal, dtype, head_dim",
    [
        (1, True, BF16, 128), (17, True, BF16, 128), (100, True, BF16, 128), (1000, True, BF16, 128),
        (4099, True, BF16, 128), (1000, True, FP16, 64),
        (1, False, BF16, 64), (17, False, BF16, 64), (100, False, BF16, 64), (1000, False, BF16, 64),
        (4099, False, BF16, 64),
    ],
    ids=lambda x: None if isinstance(x, (int, bool)) else str(x).replace("torch.", ""),
)  # fmt: skip
def test_sequence_lengths(seqlen, causal, dtype, head_dim, attn):
    """Causal at D = 128 (bf16) and 64 (fp16), full at D = 64; B = 3 up to S = 1000, S = 4099 with
    B = 1 and 2 heads (an fp64 S x S reference per head)."""
    batch, heads, kv_heads = (3, 4, 2) if seqlen <= 1000 else (1, 2, 1)
    q, k, v = attn.random_qkv(batch, seqlen, seqlen, heads, kv_heads, head_dim, dtype, "cuda")
    attn.check_attention(q, k, v, with_dlse=True, causal=causal)


@pytest.mark.gpu(reason="S_q != S_k at real sizes needs the compiled kernels")
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1000, 4099), (4099, 1000), (1, 4099)])
@pytest.mark.parametrize("options", [{"causal": True}, {"window_size": (256, 32)}, {"causal": True, "alibi": "heads"}])
def test_bottom_right_alignment(seqlen_q, seqlen_k, options, attn):
    options = dict(options)
    slopes = _slopes(options.pop("alibi", None), 1, 4)
    q, k, v = attn.random_qkv(1, seqlen_q, seqlen_k, 4, 4, 64, BF16, "cuda")
    attn.check_attention(q, k, v, alibi_slopes=slopes, **options)


# Each head dim with the dtype and options of its small test (test_attention.test_head_dims).
HEAD_DIM_CASES = {
    16: (FP16, {"causal": True}),
    32: (BF16, {}),
    64: (BF16, {"causal": True, "alibi": "heads"}),
    80: (FP16, {"causal": True, "alibi": "heads"}),
    96: (BF16, {"window_size": (70, 20)}),
    128: (BF16, {"causal": True}),
    160: (FP16, {"alibi": "heads"}),
    192: (BF16, {"causal": True}),
    256: (FP16, {"causal": True, "window_size": (300, 0)}),
}


@pytest.mark.gpu(reason="every head dim at a real length needs the compiled kernels")
@pytest.mark.parametrize("head_dim", list(HEAD_DIM_CASES))
def test_head_dims(head_dim, attn):
    dtype, options = HEAD_DIM_CASES[head_dim]
    options = dict(options)
    slopes = _slopes(options.pop("alibi", None), 2, 4)
    q, k, v = attn.random_qkv(2, 1000, 1000, 4, 2, head_dim, dtype, "cuda")
    attn.check_attention(q, k, v, alibi_slopes=slopes, **options)


@pytest.mark.gpu(reason="GQA at real sizes needs the compiled kernels")
@pytest.mark.parametrize(
    "n_heads, n_kv_heads, causal, seqlen",
    [(8, 1, True, 1000), (32, 1, False, 1000), (8, 4, False, 2100)],
    ids=["8to1", "32to1", "2to1"],
)
def test_grouped_query_heads(n_heads, n_kv_heads, causal, seqlen, attn):
    """dK and dV sum over the query heads of a group (the dQ kernel, the GPU's default path;
    test_atomic_dq_when_forced covers the atomic one)."""
    q, k, v = attn.random_qkv(2, seqlen, seqlen, n_heads, n_kv_heads, 32, BF16, "cuda")
    attn.check_attention(q, k, v, causal=causal)


def _hopper_dkdv_runs() -> str:
    """Why kernels/attention_bwd_hopper.py cannot run here ('' where it can)."""
    if not HAS_GLUON_HOPPER:
        return "the Hopper dK/dV kernel is written against Triton 3.6's Gluon API"
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        return "the Hopper dK/dV kernel runs on sm_90 GPUs only"
    return ""


@pytest.fixture
def hopper_launches(monkeypatch):
    """Counts the launches of the Hopper dK/dV kernel (fresh plans before and after)."""
    if _hopper_dkdv_runs():
        pytest.skip(_hopper_dkdv_runs())
    calls = []
    real = launch.HopperDkdv.__call__

    def counting(self, *args):
        calls.append(self)
        return real(self, *args)

    monkeypatch.setattr(launch.HopperDkdv, "__call__", counting)
    launch.clear_plans()
    yield calls
    launch.clear_plans()


@pytest.mark.gpu(reason="the Hopper dK/dV kernel runs compiled on sm_90")
@pytest.mark.parametrize(
    "batch, seqlen, n_heads, n_kv_heads, head_dim, causal, layout, dtype",
    [
        (3, 1, 4, 2, 128, True, "bshd", BF16), (3, 17, 4, 4, 64, True, "bhsd", FP16),
        (2, 1000, 8, 1, 128, True, "bshd", BF16), (2, 1000, 32, 1, 64, False, "bshd", BF16),
        (1, 4099, 4, 2, 128, False, "bhsd", FP16), (2, 2048, 16, 4, 128, True, "bhsd", BF16),
        (4, 300, 6, 3, 64, True, "bshd", FP16),
    ],
    ids=["s1", "s17-fp16-sdpa", "gqa8-1000", "mqa32-full-d64", "s4099-full-sdpa", "gqa4-2048-sdpa", "s300-d64-fp16"],
)  # fmt: skip
def test_hopper_dkdv(batch, seqlen, n_heads, n_kv_heads, head_dim, causal, layout, dtype, attn, hopper_launches):
    """The Hopper dK/dV kernel (where the backward takes it) against the fp64 reference: lengths
    from 1 to 4099 (ragged last blocks), GQA 8:1 and 32:1, both layouts, fp16 and bf16."""
    q, k, v = attn.random_qkv(batch, seqlen, seqlen, n_heads, n_kv_heads, head_dim, dtype, "cuda", layout=layout)
    attn.check_attention(q, k, v, layout=layout, causal=causal, with_dlse=True)
    assert hopper_launches


@pytest.mark.gpu(reason="the Hopper dK/dV kernel runs compiled on sm_90")
def test_hopper_dkdv_views_and_determinism(attn, hopper_launches):
    """Strided q/k/v (views of a packed QKV projection) and the deterministic backward, whose
    gradients repeat bit for bit; a pinned dK/dV config and ALiBi take the portable kernel."""
    qkv = torch.randn(2, 1100, 3, 4, 128, device="cuda", dtype=BF16)
    attn.check_attention(*qkv.unbind(2), causal=True, deterministic=True)
    assert hopper_launches
    q, k, v = (t.detach().requires_grad_() for t in qkv.unbind(2))
    grads = []
    for _ in range(2):
        out = flash_attention(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), torch.ones_like(out)))
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    hopper_launches.clear()
    slopes = alibi_slopes(4, device="cuda")
    attn.check_attention(*qkv.unbind(2), causal=True, alibi_slopes=slopes)
    assert not hopper_launches


@pytest.mark.gpu(reason="direct launches need the compiled kernels")
def test_direct_launches_repeat_the_jit_launch(attn, monkeypatch):
    """A plan's Launches go through Triton's JIT on their first call and, on Triton 3.4-3.9, call
    the compiled kernel directly after: the second call of a forward and backward gives the first
    call's results bit for bit (the default backward has no atomics on the GPU)."""
    launched = []
    call = Launch.__call__

    def recording(self, *args):
        launched.append(self)
        return call(self, *args)

    monkeypatch.setattr(Launch, "__call__", recording)
    q, k, v = attn.random_qkv(2, 300, 300, 4, 2, 64, BF16, "cuda")
    dout = torch.randn_like(q)
    results = []
    for _ in range(2):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = flash_attention(*leaves, causal=True)
        out.backward(dout)
        results.append([out, *(t.grad for t in leaves)])
    for first, second in zip(*results):
        assert torch.equal(first, second)
    assert len(launched) == 8  # forward, pre-pass, dK/dV and dQ kernels, twice: the same Launches
    assert launched[:4] == launched[4:]
    if DIRECT_LAUNCH:  # each Launch keeps the compiled kernel it calls directly
        assert all(launch._compiled for launch in launched)


@pytest.mark.gpu(reason="autotuning times several configs, which happens only compiled")
def test_an_autotuned_plan_launches_its_choice(attn, monkeypatch, full_autotune):
    """With several candidate configs the autotuner chooses on a plan's first call; the plan's later
    calls launch that choice (the runtime's tuning publishes it whole) with the same results."""
    original = configs.candidate_configs
    monkeypatch.setattr(configs, "candidate_configs", lambda *args: original(*args)[:2])
    q, k, v = attn.random_qkv(2, 300, 300, 4, 2, 64, BF16, "cuda")
    dout = torch.randn_like(q)
    results = []
    for _ in range(2):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = flash_attention(*leaves, causal=True, deterministic=True)
        out.backward(dout)
        results.append([out, *(t.grad for t in leaves)])
    for first, second in zip(*results):
        assert torch.equal(first, second)
    tma = _tma_by_default(q.device)
    for kind in ("fwd", "dkdv", "dq"):
        (entry,) = configs.tuned_kernel(kind, 64, tma, 10).entries()
        assert entry.config in configs.autotuned_kernel(kind, 64, tma, 10).configs
    attn.check_attention(q, k, v, causal=True, deterministic=True)


@pytest.mark.gpu(reason="the atomic dQ path at real sizes needs the compiled kernels")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_atomic_dq_when_forced(causal, attn, monkeypatch):
    """The atomic dQ path (configs.DQ_ATOMIC), which the GPU does not take by default (the dQ
    kernel is faster at every length: configs.DQ_ATOMIC_MIN_SEQLEN), forced at a real size: GQA 2:1, a
    ragged key tail, with and without the causal mask (the rotated loop start)."""
    monkeypatch.setattr(configs, "DQ_ATOMIC_MIN_SEQLEN", 0)
    monkeypatch.setattr(configs, "DQ_ATOMIC_MIN_SEQLEN_CAUSAL", 0)
    kv_programs = 2 * 4 * -(-2100 // 128)
    assert configs.dq_atomic(
        64, False, 2100, causal, kv_programs, 2, torch.cuda.get_device_properties(0).multi_processor_count
    )
    q, k, v = attn.random_qkv(2, 2100, 2100, 8, 4, 64, BF16, "cuda")
    attn.check_attention(q, k, v, causal=causal)


@pytest.mark.gpu(reason="option combinations at real sizes need the compiled kernels")
@pytest.mark.parametrize(
    "options, layout, dtype",
    [
        ({"alibi": "batch"}, "bshd", BF16),
        ({"window_size": (100, 100), "alibi": "batch"}, "bshd", FP16),
        ({"causal": True, "window_size": (512, 0), "alibi": "batch"}, "bshd", FP16),
        ({"causal": True, "alibi": "heads", "softmax_scale": 0.05}, "bhsd", FP16),
        ({}, "bhsd", FP16),
        ({"causal": True, "window_size": (512, 0), "softcap": 2.0}, "bhsd", BF16),
        ({"alibi": "batch", "softcap": 50.0}, "bshd", BF16),
        ({"causal": True, "dropout_p": 0.1, "seed": 2024}, "bshd", BF16),
        ({"window_size": (300, 300), "softcap": 30.0, "dropout_p": 0.3, "seed": 7}, "bhsd", FP16),
    ],
    ids=[
        "alibi-full",
        "window-alibi",
        "local-causal-alibi",
        "causal-alibi-scale-sdpa",
        "full-sdpa",
        "local-causal-softcap-sdpa",
        "alibi-softcap",
        "causal-dropout",
        "window-softcap-dropout-sdpa",
    ],  # fmt: skip
)
def test_options_and_layouts(options, layout, dtype, attn):
    """ALiBi with and without masks (per-batch slopes up to 1.05 test the fp32 LSE near the
    diagonal), a softmax scale, softcapped scores, dropout, and the SDPA layout (TMA descriptors
    with heads outside positions)."""
    options = dict(options)
    slopes = _slopes(options.pop("alibi", None), 2, 8)
    q, k, v = attn.random_qkv(2, 1531, 1531, 8, 8, 64, dtype, "cuda", layout=layout)
    attn.check_attention(q, k, v, layout=layout, alibi_slopes=slopes, **options)


@pytest.mark.gpu(reason="strided inputs at real sizes need the compiled kernels")
def test_packed_qkv_projection_views(attn):
    qkv = torch.randn(2, 1100, 3, 4, 128, device="cuda", dtype=BF16)
    attn.check_attention(*qkv.unbind(2), causal=True)


@pytest.mark.gpu(reason="varlen batches at real sizes need the compiled kernels")
@pytest.mark.parametrize(
    "options, dtype",
    [({"causal": True}, BF16), ({"causal": True, "window_size": (64, 0), "alibi": "batch"}, BF16), ({}, FP16)],
    ids=["causal", "local-causal-alibi", "full"],
)
def test_varlen(options, dtype, attn):
    options = dict(options)
    lengths = [1, 1000, 17, 4099, 300, 1, 2048]
    slopes = _slopes(options.pop("alibi", None), len(lengths), 8)
    q = torch.randn(sum(lengths), 8, 64, device="cuda", dtype=dtype)
    k = torch.randn(sum(lengths), 2, 64, device="cuda", dtype=dtype)
    v = torch.randn(sum(lengths), 2, 64, device="cuda", dtype=dtype)
    cu = attn.cu_seqlens(lengths, "cuda")
    attn.check_varlen(q, k, v, cu, cu, alibi_slopes=slopes, **options)


@pytest.mark.gpu(reason="each autotune config runs compiled")
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_every_autotune_config(head_dim, attn, full_autotune):
    """Whatever config the autotuner picks here is correct: each candidate of each kernel (TMA ones
    on Hopper with Triton >= 3.4, pointer ones otherwise), the dK/dV kernel in its class's dQ mode
    and the dQ kernel with the deterministic backward. The options are test_head_dims' for this
    head dim, so the first configs are compiled already."""
    dtype, options = HEAD_DIM_CASES[head_dim]
    options = dict(options)
    slopes = _slopes(options.pop("alibi", None), 2, 4)
    window = options.get("window_size", (-1, -1))
    q, k, v = attn.random_qkv(2, 777, 801, 4, 2, head_dim, dtype, "cuda")
    dout = torch.randn_like(q)
    ref = attn.reference(q, k, v, dout, alibi_slopes=slopes, **options)
    twin = attn.lowp_twin(q, k, v, dout, alibi_slopes=slopes, **options)
    configs = {kind: candidate_configs(kind, head_dim, _tma_by_default(q.device)) for kind in ("fwd", "dkdv", "dq")}
    first = {kind: candidates[0] for kind, candidates in configs.items()}
    right = 0 if options.get("causal") else window[1]
    default_deterministic = not dq_atomic(head_dim, False, 801, right == 0, 1 << 20, 1, 0)
    runs = [(default_deterministic, dict(first, fwd=config)) for config in configs["fwd"]]
    runs += [(default_deterministic, dict(first, dkdv=config)) for config in configs["dkdv"][1:]]
    runs += [(True, dict(first, dq=config)) for config in configs["dq"]]  # the dQ kernel: deterministic path
    for deterministic, chosen in runs:
        spec = AttentionSpec(
            2, 4, 2, head_dim, 777, 801, head_dim**-0.5, window[0], right, slopes is not None, False, False,
            deterministic,
        )  # fmt: skip
        out, lse = attention_fwd(q, k, v, slopes, None, None, spec, chosen["fwd"])
        grads = attention_bwd(dout, q, k, v, out, lse, None, slopes, None, None, spec, chosen["dkdv"], chosen["dq"])
        attn.compare(dict(zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads))), ref, twin)


def _strided_views(buffer, shape, strides, offsets):
    return [buffer.as_strided(shape, strides, offset).normal_() for offset in offsets]


@pytest.mark.gpu(reason="a 2^31+ element tensor needs a GPU (one 4.3 GB buffer)")
def test_int64_batch_offsets(attn):
    """Batch 1 of q, k and v starts past element 2^31 of one buffer: offsets are computed in int64,
    forward and backward."""
    heads, head_dim, seqlen = 8, 64, 300
    row = heads * head_dim
    stride_b = (2**31 // 16 + 1) * 16  # past 2^31, a multiple of 16 elements (aligned rows)
    buffer = torch.empty(stride_b + 3 * seqlen * row, device="cuda", dtype=BF16)
    shape, strides = (2, seqlen, heads, head_dim), (stride_b, row, head_dim, 1)
    q, k, v = _strided_views(buffer, shape, strides, [0, seqlen * row, 2 * seqlen * row])
    assert q[1].storage_offset() >= 2**31
    attn.check_attention(q, k, v, causal=True)


@pytest.mark.gpu(reason="a packed batch past 2^31 elements needs a GPU (one 5 GB buffer)")
def test_int64_varlen_row_offsets(attn):
    """Packed rows whose offsets pass 2^31 elements (rows 2^22 elements apart, as q, k, v slices of
    one wide buffer): the sequences past the mark are right, forward and backward."""
    heads, head_dim = 4, 64  # the specialization of test_varlen's causal case (strides fit in int32)
    lengths = [300, 211, 89]
    total = sum(lengths)
    stride_s = 2**22 + 256  # elements between packed rows; row 512 starts past 2^31
    buffer = torch.empty((total - 1) * stride_s + 3 * heads * head_dim, device="cuda", dtype=BF16)
    shape, strides = (total, heads, head_dim), (stride_s, head_dim, 1)
    q, k, v = _strided_views(buffer, shape, strides, [0, heads * head_dim, 2 * heads * head_dim])
    assert q[total - 1].storage_offset() >= 2**31
    cu = attn.cu_seqlens(lengths, "cuda")
    attn.check_varlen(q, k, v, cu, cu, causal=True)


# Tensors of more than 2^31 elements, allocated as they are (B, S, H, H_kv, D, layout, GiB of GPU
# memory the test needs): the batch offsets pass 2^31 elements; the head offsets do (one batch);
# q and dO are (S, B, H, D) tensors seen as (B, S, H, D), positions 17.2M elements apart, so that
# 125 rows of a tile span more than 2^31 (the launchers copy such inputs, see ops/attention.py).
# Each is checked on a first and a last slice (batches, or the 8 query heads of a kv head).
LARGE_CASES = {
    "batch-offsets": (2049, 512, 16, 2, 128, "bshd", 24),
    "head-offsets": (1, 4096, 8200, 1025, 64, "bhsd", 32),
    "head-offsets-atomic-dq": (1, 4096, 8200, 1025, 64, "bhsd", 40),
    "position-stride": (2100, 128, 64, 1, 128, "sbhd", 34),
}


def _large_slices(batch, n_heads, n_kv_heads, layout):
    """(q-side index, kv-side index) pairs of the slices compared with the reference."""
    if layout == "bhsd":
        group = n_heads // n_kv_heads
        every = slice(None)
        return [((every, slice(g * group, (g + 1) * group)), (every, slice(g, g + 1))) for g in (0, n_kv_heads - 1)]
    return [((slice(b, b + 1),), (slice(b, b + 1),)) for b in (0, batch - 1)]


@pytest.mark.gpu(reason="tensors of more than 2^31 elements need a GPU's memory")
@pytest.mark.parametrize("case", list(LARGE_CASES))
def test_more_than_2_31_elements(case, attn, monkeypatch):
    """q, O, dO and dQ hold more than 2^31 elements each: forward and backward (both outputs) are
    right on the first and the last slice, where the offsets pass 2^31 (int64 in the kernels)."""
    batch, seqlen, n_heads, n_kv_heads, head_dim, layout, need_gib = LARGE_CASES[case]
    free_gib = (torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()) / 2**30
    if free_gib < need_gib:
        pytest.skip(f"needs {need_gib} GiB of free GPU memory, {free_gib:.1f} GiB free")
    if case.endswith("atomic-dq"):
        monkeypatch.setattr(configs, "DQ_ATOMIC_MIN_SEQLEN_CAUSAL", 0)

    def randn(seqlen, heads):
        if layout == "sbhd":  # positions outermost, seen as (B, S, H, D)
            return torch.randn(seqlen, batch, heads, head_dim, device="cuda", dtype=BF16).transpose(0, 1)
        shape = (batch, heads, seqlen, head_dim) if layout == "bhsd" else (batch, seqlen, heads, head_dim)
        return torch.randn(shape, device="cuda", dtype=BF16)

    q, k, v = randn(seqlen, n_heads), randn(seqlen, n_kv_heads), randn(seqlen, n_kv_heads)
    dout = randn(seqlen, n_heads)
    assert q.numel() > 2**31 and dout.numel() > 2**31
    api_layout = "bhsd" if layout == "bhsd" else "bshd"
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    out, lse = flash_attention(*leaves, causal=True, return_lse=True, layout=api_layout)
    dlse = torch.randn_like(lse)
    dq, dk, dv = torch.autograd.grad((out, lse), leaves, (dout, dlse))
    del leaves
    for on_q, on_kv in _large_slices(batch, n_heads, n_kv_heads, api_layout):
        inputs = (q[on_q].detach(), k[on_kv].detach(), v[on_kv].detach(), dout[on_q], dlse[on_q])
        ref = attn.reference(*inputs, layout=api_layout, causal=True)
        twin = attn.lowp_twin(*inputs, layout=api_layout, causal=True)
        ours = {"out": out[on_q], "lse": lse[on_q], "dq": dq[on_q], "dk": dk[on_kv], "dv": dv[on_kv]}
        attn.compare(ours, ref, twin)
        del ref, twin


@pytest.mark.gpu(reason="the backward's determinism is a property of the compiled kernels")
def test_backward_is_deterministic(attn):
    """deterministic=True gives bit-identical gradients run after run (the default dQ is an fp32
    atomic sum, equal to it within rounding: both are checked against the reference elsewhere)."""
    q, k, v = (t.requires_grad_(True) for t in attn.random_qkv(2, 2000, 2000, 16, 2, 128, BF16, "cuda"))
    out = flash_attention(q, k, v, causal=True, deterministic=True)
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
    weight = torch.randn(q.shape, device="cuda").to(BF16)
    slopes = alibi_slopes(8, device="cuda")

    def block(q, k, v):
        # The upstream gradient is `weight` exactly in both runs, so compiled and eager launch the
        # same kernels on the same inputs (deterministic backward): identical results.
        out = flash_attention(q * 1.0, k, v, causal=True, alibi_slopes=slopes, deterministic=True)
        return (out.float() * weight).sum()

    compiled = torch.compile(block, fullgraph=True)
    loss, expected = compiled(q, k, v), block(q, k, v)
    torch.testing.assert_close(loss, expected)
    grads = torch.autograd.grad(loss, (q, k, v))
    expected_grads = torch.autograd.grad(expected, (q, k, v))
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
