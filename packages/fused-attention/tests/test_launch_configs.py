"""The launchers with explicit block shapes, and the TMA (tensor descriptor) path, interpreter-sized.

The public API picks configs itself (one small config when interpreting); these tests drive the
launchers directly with block shapes that do not line up with each other or with the sequence
lengths, and with use_tma=True, so the descriptor loads of the Hopper path are checked here too
(Triton's interpreter executes descriptor loads; the GPU suite runs them compiled).
"""

import dataclasses
import gc
import math
import weakref

import pytest
import torch

from fused_attention import alibi_slopes
from fused_attention._runtime.compat import HAS_TENSOR_DESCRIPTORS
from fused_attention.ops.configs import KernelConfig
from fused_attention.ops.launch import AttentionSpec, attention_bwd, attention_fwd

pytestmark = pytest.mark.kernels

needs_descriptors = pytest.mark.skipif(
    not HAS_TENSOR_DESCRIPTORS, reason="triton.tools.tensor_descriptor needs Triton >= 3.4"
)


def _run(q, k, v, dout, spec, slopes, fwd_cfg, dkdv_cfg, dq_cfg, cu_q=None, cu_k=None):
    out, lse = attention_fwd(q, k, v, slopes, cu_q, cu_k, spec, fwd_cfg)
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, None, slopes, cu_q, cu_k, spec, dkdv_cfg, dq_cfg)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def _dense_spec(q, k, bhsd, causal, window, has_alibi, deterministic):
    seq, heads = (2, 1) if bhsd else (1, 2)
    left, right = window
    if causal:
        right = 0
    return AttentionSpec(
        q.shape[0], q.shape[heads], k.shape[heads], q.shape[3], q.shape[seq], k.shape[seq],
        1.0 / math.sqrt(q.shape[3]), left, right, has_alibi, False, bhsd, deterministic,
    )  # fmt: skip


C = KernelConfig
# The first block set runs the default backward (dQ by atomics in the dK/dV kernel), the second the
# deterministic one (the dQ kernel with its own config).
BLOCKS = [
    pytest.param(C(16, 32, 4, 1), C(32, 16, 4, 1), None, False, id="fwd16x32-dkdv32x16-atomic-dq"),
    pytest.param(C(64, 16, 4, 1), C(16, 64, 4, 1), C(64, 16, 4, 1), True, id="fwd64x16-dkdv16x64-dq64x16"),
]


@pytest.mark.parametrize("tma", [False, pytest.param(True, marks=needs_descriptors)], ids=["pointers", "tma"])
@pytest.mark.parametrize("fwd_cfg, dkdv_cfg, dq_cfg, deterministic", BLOCKS)
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_block_shapes_dense(layout, fwd_cfg, dkdv_cfg, dq_cfg, deterministic, tma, attn, device):
    if tma:
        fwd_cfg, dkdv_cfg, dq_cfg = (
            None if c is None else dataclasses.replace(c, use_tma=True) for c in (fwd_cfg, dkdv_cfg, dq_cfg)
        )
    q, k, v = attn.random_qkv(2, 45, 50, 4, 2, 64, torch.bfloat16, device, layout=layout)
    dout = torch.randn(q.shape, device=device).to(q.dtype)
    slopes = alibi_slopes(4, device=device)
    options = {"causal": True, "window_size": (20, -1), "alibi_slopes": slopes}
    spec = _dense_spec(q, k, layout == "bhsd", True, (20, -1), True, deterministic)
    ours = _run(q, k, v, dout, spec, slopes, fwd_cfg, dkdv_cfg, dq_cfg)
    attn.compare(
        ours,
        attn.reference(q, k, v, dout, layout=layout, **options),
        attn.lowp_twin(q, k, v, dout, layout=layout, **options),
    )


@pytest.mark.parametrize("tma", [False, pytest.param(True, marks=needs_descriptors)], ids=["pointers", "tma"])
def test_block_shapes_varlen(tma, attn, device):
    """Packed sequences: with TMA the descriptors span the whole packed tensor, so only fully visible
    blocks (which never cross a sequence end) may use them; the edges stay masked pointer loads.
    Pointers run the deterministic backward, TMA the atomic one."""
    fwd_cfg, dkdv_cfg, dq_cfg = C(16, 16, 4, 1), C(16, 16, 4, 1), C(16, 16, 4, 1)
    if tma:
        fwd_cfg, dkdv_cfg, dq_cfg = (dataclasses.replace(c, use_tma=True) for c in (fwd_cfg, dkdv_cfg, dq_cfg))
    lengths = [37, 20, 49]
    q = torch.randn(sum(lengths), 2, 32, device=device).to(torch.float16)
    k = torch.randn(sum(lengths), 2, 32, device=device).to(torch.float16)
    v = torch.randn(sum(lengths), 2, 32, device=device).to(torch.float16)
    dout = torch.randn(q.shape, device=device).to(q.dtype)
    cu = attn.cu_seqlens(lengths, device)
    spec = AttentionSpec(3, 2, 2, 32, 49, 49, 32**-0.5, 7, 3, False, True, False, not tma)
    ours = _run(q, k, v, dout, spec, None, fwd_cfg, dkdv_cfg, dq_cfg, cu, cu)
    attn.compare(ours, *attn.varlen_expected(q, k, v, dout, None, cu, cu, window_size=(7, 3)))


def test_alibi_lse_precision_with_tall_query_blocks(attn, device):
    """Causal ALiBi with slopes near 1 and 128-query blocks (the GPU's): the fp32 LSE holds to
    PyTorch's fp32 accuracy (scores formed from exact distances, not relative to a block start)."""
    q, k, v = attn.random_qkv(1, 150, 150, 2, 2, 32, torch.bfloat16, device)
    dout = torch.randn(q.shape, device=device).to(q.dtype)
    slopes = torch.tensor([0.97, 0.61], device=device)
    options = {"causal": True, "alibi_slopes": slopes}
    spec = _dense_spec(q, k, False, True, (-1, -1), True, False)
    out, lse = attention_fwd(q, k, v, slopes, None, None, spec, C(128, 32, 4, 1))
    ref, twin = attn.reference(q, k, v, dout, **options), attn.lowp_twin(q, k, v, dout, **options)
    attn.compare({"out": out, "lse": lse}, ref, twin, names=("out", "lse"))


@needs_descriptors
def test_launch_plans_keep_no_tensors(attn, device):
    """A plan's TMA descriptor templates drop the tensors they were built on: the first call's
    inputs are freed when the caller lets go of them."""
    q, k, v = attn.random_qkv(1, 40, 40, 2, 2, 32, torch.bfloat16, device)
    spec = _dense_spec(q, k, False, True, (-1, -1), False, False)
    attention_fwd(q, k, v, None, None, None, spec, C(16, 16, 4, 1, True))
    alive = weakref.ref(k)
    del k
    gc.collect()
    assert alive() is None
