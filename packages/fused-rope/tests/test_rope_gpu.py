"""The full test grid on the GPU: forward and backward against the float64 references.

apply_rotary_pos_emb: seq_length {512, 1024, 2048, 4096} x head_dim {128, 256, 512} x
rotary_percent {0.5, 1.0} x batch {2, 4, 8, 16} x heads {8, 16, 32, 64} x margin {0, 10, 33, 77}
x format {sbhd, bshd, thd} x {rotate-half, interleaved} x {fp32, fp16, bf16} is 27648 cases,
the largest 2^31 elements: hours of GPU time. PAIRWISE_GRID is a pairwise covering array of it:
every pair of values of any two axes (every format with every dtype, every head dim with every
batch, ...) is in at least one of its 23 cases, the fewest a greedy search found (the bound is
4 x 4 = 16), under a cap of 2^26 elements per tensor (256 MiB in fp32; the cap still admits
every pair: seq 4096 with batch 16, heads 64 with head dim 512, ...). Collection checks both
properties. Addressing past 2^31 elements is test_int64_offsets_past_2_31_elements' job.
Each case runs the kernels on the whole tensor and compares a sample of positions (the first
two, the last two, the rest random, about 2^21 elements in all) with TE's unfused formula: both
the forward and the backward are local to a position, so the positions' rows of the
reference equal the rows of the reference of the whole tensor. thd packs `batch` sequences of
seq_length tokens (each starting at position 0).

apply_rotary_qk: the headline shape (4, 32, 4096, 128) and GQA variants, in and out of place,
each in every dtype (each dtype in and out of place). Also thd with sequences of 1 and 1000
tokens forward and backward (each dtype, each pair layout), and start positions.
"""

import itertools

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference

from fused_rope import apply_rotary_pos_emb, apply_rotary_qk
from fused_rope.reference import apply_rotary_pos_emb_reference, rotary_qk_reference

pytestmark = pytest.mark.gpu(reason="the full grid at real sizes: up to 2^26-element tensors")

AXES = {
    "seq_length": [512, 1024, 2048, 4096],
    "head_dim": [128, 256, 512],
    "rotary_percent": [0.5, 1.0],
    "batch": [2, 4, 8, 16],
    "heads": [8, 16, 32, 64],
    "margin": [0, 10, 33, 77],
    "tensor_format": ["sbhd", "bshd", "thd"],
    "interleaved": [False, True],
    "dtype": ["fp32", "fp16", "bf16"],
}
PAIRWISE_GRID = [
    (2048, 128, 0.5, 4, 64, 0, "bshd", False, "bf16"),
    (4096, 128, 0.5, 2, 64, 33, "bshd", False, "bf16"),
    (1024, 256, 0.5, 16, 16, 33, "bshd", False, "fp16"),
    (4096, 256, 1.0, 8, 8, 0, "bshd", True, "fp16"),
    (512, 512, 1.0, 2, 64, 10, "bshd", True, "fp16"),
    (4096, 128, 0.5, 16, 8, 0, "bshd", False, "fp32"),
    (2048, 512, 1.0, 2, 32, 33, "bshd", False, "fp32"),
    (1024, 256, 1.0, 2, 64, 77, "bshd", True, "fp32"),
    (512, 256, 1.0, 8, 64, 33, "sbhd", False, "bf16"),
    (1024, 128, 1.0, 16, 32, 33, "sbhd", True, "bf16"),
    (512, 512, 0.5, 8, 32, 77, "sbhd", False, "fp16"),
    (4096, 128, 1.0, 4, 32, 10, "sbhd", True, "fp16"),
    (1024, 512, 1.0, 16, 8, 10, "sbhd", True, "fp16"),
    (2048, 256, 0.5, 8, 16, 10, "sbhd", True, "fp32"),
    (4096, 512, 0.5, 2, 8, 0, "sbhd", True, "fp32"),
    (512, 128, 1.0, 8, 8, 10, "thd", False, "bf16"),
    (4096, 128, 1.0, 2, 16, 77, "thd", False, "bf16"),
    (512, 512, 1.0, 4, 16, 0, "thd", True, "bf16"),
    (1024, 512, 0.5, 4, 8, 33, "thd", False, "fp16"),
    (2048, 128, 0.5, 16, 8, 77, "thd", True, "fp16"),
    (1024, 256, 0.5, 8, 32, 0, "thd", True, "fp16"),
    (512, 128, 1.0, 16, 64, 0, "thd", False, "fp32"),
    (2048, 256, 1.0, 4, 32, 77, "thd", True, "fp32"),
]
MAX_ELEMENTS = 2**26
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
COMPARED_ELEMENTS = 2**21


def _pairwise_grid_params():
    """PAIRWISE_GRID as parameters, after checking that it covers every pair of axis values and
    that no case's tensor exceeds MAX_ELEMENTS."""
    values = list(AXES.values())
    for i, j in itertools.combinations(range(len(values)), 2):
        missing = set(itertools.product(values[i], values[j])) - {(case[i], case[j]) for case in PAIRWISE_GRID}
        assert not missing, f"PAIRWISE_GRID misses {list(AXES)[i]}, {list(AXES)[j]} = {sorted(missing)}"
    for case in PAIRWISE_GRID:
        seq_length, head_dim, _, batch, heads = case[:5]
        assert seq_length * batch * heads * head_dim <= MAX_ELEMENTS, case
    return [pytest.param(*case, id="-".join(map(str, case))) for case in PAIRWISE_GRID]


def _positions(seq_len: int, per_position: int) -> torch.Tensor:
    count = max(4, min(seq_len, COMPARED_ELEMENTS // per_position))
    rest = torch.randperm(seq_len - 4)[: count - 4] + 2
    return torch.cat([torch.tensor([0, 1, seq_len - 2, seq_len - 1]), rest]).unique().cuda()


@pytest.mark.parametrize(", ".join(AXES), _pairwise_grid_params())
def test_pairwise_grid(seq_length, head_dim, rotary_percent, batch, heads, margin, tensor_format, interleaved, dtype):
    dtype = DTYPES[dtype]
    shape = {"sbhd": (seq_length, batch), "bshd": (batch, seq_length), "thd": (batch * seq_length,)}[tensor_format]
    t = torch.randn(*shape, heads, head_dim, device="cuda", dtype=dtype, requires_grad=True)
    d2 = int(head_dim * rotary_percent)
    n_positions = seq_length + margin
    freqs = (torch.arange(n_positions, device="cuda")[:, None] * torch.rand(d2, device="cuda")).view(-1, 1, 1, d2)
    cu_seqlens = None
    if tensor_format == "thd":
        cu_seqlens = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * seq_length
    y = apply_rotary_pos_emb(t, freqs, tensor_format, interleaved, cu_seqlens)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, t, dy)

    def as_bshd(x):
        """(batch, seq, heads, head_dim) view of x in tensor_format."""
        if tensor_format == "sbhd":
            return x.transpose(0, 1)
        return x.view(batch, seq_length, heads, head_dim)

    pos = _positions(seq_length, batch * heads * head_dim)
    t_rows, dy_rows, freqs_rows = as_bshd(t.detach())[:, pos], as_bshd(dy)[:, pos], freqs[pos]

    def reference(x, angles, grad):
        x = x.detach().requires_grad_(True)
        out = apply_rotary_pos_emb_reference(x, angles, "bshd", interleaved)
        return out, torch.autograd.grad(out, x, grad)[0]

    y_ref, dx_ref = reference(t_rows.double(), freqs_rows.double(), dy_rows.double())
    y_torch, dx_torch = reference(t_rows, freqs_rows, dy_rows)
    assert_close_to_reference(as_bshd(y)[:, pos], y_ref, y_torch, name="y")
    assert_close_to_reference(as_bshd(dx)[:, pos], dx_ref, dx_torch, name="dx")


QK_CONFIGS = [(32, 32, 128, 128), (32, 8, 128, 128), (64, 8, 128, 64), (16, 2, 256, 256)]  # q, k heads, head dim, d2
# Every config in every dtype; each config and each dtype both in and out of place.
QK_CASES = [
    pytest.param(dtype, *config, (i + j) % 2 == 1, id=f"{dtype}-{config}-{'inplace' if (i + j) % 2 else 'new'}")
    for i, config in enumerate(QK_CONFIGS)
    for j, dtype in enumerate(DTYPES)
]


@pytest.mark.parametrize("dtype, q_heads, k_heads, head_dim, d2, inplace", QK_CASES)
def test_qk_headline_shapes(dtype, q_heads, k_heads, head_dim, d2, inplace):
    dtype, batch, seq_len = DTYPES[dtype], 4, 4096
    q = torch.randn(batch, seq_len, q_heads, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
    k = torch.randn(batch, seq_len, k_heads, head_dim, device="cuda", dtype=dtype).transpose(1, 2)
    angles = torch.arange(seq_len, device="cuda")[:, None] * torch.rand(d2, device="cuda")
    cos, sin = angles.cos()[None].to(dtype), angles.sin()[None].to(dtype)
    q_in, k_in = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    q_run, k_run = (q_in.clone(), k_in.clone()) if inplace else (q_in, k_in)  # in place: q, k stay for the reference
    q_out, k_out = apply_rotary_qk(q_run, k_run, cos, sin, inplace=inplace)
    dq_out, dk_out = torch.randn_like(q_out), torch.randn_like(k_out)
    dq, dk = torch.autograd.grad((q_out, k_out), (q_in, k_in), (dq_out, dk_out))

    pos = _positions(seq_len, batch * (q_heads + k_heads) * head_dim)

    def reference(q_rows, k_rows, cos_rows, sin_rows, dq_rows, dk_rows):
        q_rows, k_rows = q_rows.detach().requires_grad_(True), k_rows.detach().requires_grad_(True)
        outs = rotary_qk_reference(q_rows, k_rows, cos_rows, sin_rows)
        return (*outs, *torch.autograd.grad(outs, (q_rows, k_rows), (dq_rows, dk_rows)))

    rows = (q[:, :, pos], k[:, :, pos], cos[:, pos], sin[:, pos], dq_out[:, :, pos], dk_out[:, :, pos])
    refs = reference(*(x.double() for x in rows))
    twins = reference(*rows)
    for name, got, ref, twin in zip(("q_out", "k_out", "dq", "dk"), (q_out, k_out, dq, dk), refs, twins):
        assert_close_to_reference(got[:, :, pos], ref, twin, name=name)


@pytest.mark.parametrize("dtype, interleaved", [("fp32", False), ("fp16", True), ("bf16", False), ("bf16", True)])
def test_thd_sequences_of_lengths_1_and_1000(dtype, interleaved, rope_checks):
    cu_seqlens = torch.tensor([0, 1, 1001], dtype=torch.int32, device="cuda")
    t = torch.randn(1001, 8, 128, device="cuda", dtype=DTYPES[dtype])
    rope_checks.check_rope(t, rope_checks.make_freqs(1000, 96, "cuda"), "thd", interleaved, cu_seqlens)


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
def test_start_positions_at_scale(tensor_format):
    batch, seq_len, heads, head_dim = 8, 1024, 32, 128
    start_positions = torch.randint(0, 3000, (batch,), device="cuda")
    freqs = torch.rand(4096, 1, 1, head_dim, device="cuda") * 4096
    shape = {"sbhd": (seq_len, batch), "bshd": (batch, seq_len), "thd": (batch * seq_len,)}[tensor_format]
    t = torch.randn(*shape, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    cu_seqlens = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * seq_len
    y = apply_rotary_pos_emb(t, freqs, tensor_format, False, cu_seqlens if tensor_format == "thd" else None,
                             start_positions)  # fmt: skip
    as_sbhd = {"sbhd": lambda x: x, "bshd": lambda x: x.transpose(0, 1),
               "thd": lambda x: x.view(batch, seq_len, heads, head_dim).transpose(0, 1)}[tensor_format]  # fmt: skip
    expected = apply_rotary_pos_emb_reference(as_sbhd(t).double(), freqs.double(), "sbhd", False, None, start_positions)
    twin = apply_rotary_pos_emb_reference(as_sbhd(t), freqs, "sbhd", False, None, start_positions)
    assert_close_to_reference(as_sbhd(y), expected, twin, name="y")
