"""apply_rotary_qk against Hugging Face's formula (float64), forward and backward, in and out of place."""

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, dtype_params

from fused_rope import apply_rotary_qk
from fused_rope.ops import rope_qk as rope_qk_ops
from fused_rope.reference import rotary_qk_reference

pytestmark = pytest.mark.kernels

INPLACE = [pytest.param(False, id="new"), pytest.param(True, id="inplace")]


def make_tables(batch, n_positions, d2, device, dtype=torch.float32):
    """cos, sin (batch, n_positions, d2) of random angles, each column its own (members differ)."""
    angles = torch.rand(batch, n_positions, d2, device=device) * 40
    return angles.cos().to(dtype), angles.sin().to(dtype)


def bhsd(batch, heads, seq_len, head_dim, dtype, device):
    """(B, H, S, D) view of (B, S, H, D) memory: the layout attention code hands over."""
    return torch.randn(batch, seq_len, heads, head_dim, device=device, dtype=dtype).transpose(1, 2)


@pytest.mark.parametrize("inplace", INPLACE)
@pytest.mark.parametrize("rotary_percent", [1.0, 0.5])
@pytest.mark.parametrize("dtype", dtype_params())
def test_dtypes_partial_rotary_gqa(dtype, rotary_percent, inplace, device, rope_checks):
    head_dim = 16
    q, k = bhsd(2, 4, 5, head_dim, dtype, device), bhsd(2, 2, 5, head_dim, dtype, device)
    cos, sin = make_tables(1, 5, int(head_dim * rotary_percent), device, dtype)
    rope_checks.check_rope_qk(q, k, cos, sin, inplace=inplace)


@pytest.mark.parametrize("inplace", INPLACE)
def test_tables_per_batch_entry_fp32_with_bf16_inputs(inplace, device, rope_checks):
    q, k = bhsd(3, 2, 4, 32, torch.bfloat16, device), bhsd(3, 1, 4, 32, torch.bfloat16, device)
    cos, sin = make_tables(3, 6, 32, device)  # fp32 tables, longer than the sequence
    rope_checks.check_rope_qk(q, k, cos, sin, inplace=inplace)
    rope_checks.check_rope_qk(q, k, cos[0], sin[0], inplace=inplace)  # (positions, d2) tables


@pytest.mark.parametrize("inplace", INPLACE)
@pytest.mark.parametrize("table_batch", [1, 2])
@pytest.mark.parametrize("ids_batch", [1, 2])
def test_position_ids(ids_batch, table_batch, inplace, device, rope_checks):
    q, k = bhsd(2, 3, 5, 16, torch.float16, device), bhsd(2, 3, 5, 16, torch.float16, device)
    cos, sin = make_tables(table_batch, 11, 12, device, torch.float16)
    position_ids = torch.randint(0, 11, (ids_batch, 5), device=device)
    rope_checks.check_rope_qk(q, k, cos, sin, position_ids, inplace=inplace)


@pytest.mark.parametrize("head_dim, d2", [(80, 80), (80, 40), (96, 96), (96, 48), (32, 24), (9, 8)], ids=str)
def test_odd_head_dims_and_rotary_dims(head_dim, d2, device, rope_checks):
    q, k = bhsd(2, 3, 3, head_dim, torch.bfloat16, device), bhsd(2, 1, 3, head_dim, torch.bfloat16, device)
    rope_checks.check_rope_qk(q, k, *make_tables(1, 3, d2, device))


def test_partial_rotary_with_many_heads(device, rope_checks):
    """64 heads of 48 pairs and 32 pass-through columns (fp32: 640 bytes a row): more than one tile."""
    q, k = bhsd(1, 64, 2, 128, torch.float32, device), bhsd(1, 8, 2, 128, torch.float32, device)
    rope_checks.check_rope_qk(q, k, *make_tables(1, 2, 96, device))


@pytest.mark.parametrize(
    "q_heads, k_heads, head_dim, together",
    [(40, 8, 512, False), (8, 40, 512, False), (40, 8, 128, True), (8, 8, 128, False), (1, 1, 128, False),
     (3, 0, 128, False)],
    ids=str,
)  # fmt: skip
def test_head_counts(q_heads, k_heads, head_dim, together, device, rope_checks):
    """GQA with several row blocks for q (or k) (32-row tiles at head_dim 512), q and k in one
    program (every head in one tile of at least 4 KiB), in separate ones (smaller tiles),
    single heads, and a k with no heads."""
    choice = rope_qk_ops.kernel_config(q_heads, k_heads, head_dim, head_dim, 2, False, False)
    assert choice.constexprs["QK_TOGETHER"] == together
    q = bhsd(1, q_heads, 2, head_dim, torch.bfloat16, device)
    k = bhsd(1, k_heads, 2, head_dim, torch.bfloat16, device)
    rope_checks.check_rope_qk(q, k, *make_tables(1, 2, head_dim, device))


@pytest.mark.parametrize("inplace", INPLACE)
def test_q_and_k_slices_of_one_qkv_buffer(inplace, device, rope_checks):
    """q and k as (B, H, S, D) views into a fused (B, S, Hq + 2 Hk, D) projection output."""
    qkv = torch.randn(2, 4, 4 + 2 + 2, 16, device=device)
    q, k = qkv[:, :, :4].transpose(1, 2), qkv[:, :, 4:6].transpose(1, 2)
    rope_checks.check_rope_qk(q, k, *make_tables(2, 4, 16, device), inplace=inplace)


def test_in_place_accepts_q_and_k_interleaved_in_one_buffer(device):
    """Even heads as q, odd heads as k: their address ranges interleave, no element is shared."""
    qkv = torch.randn(2, 4, 8, 16, device=device)
    q, k = qkv[:, :, 0::2].transpose(1, 2), qkv[:, :, 1::2].transpose(1, 2)
    cos, sin = make_tables(1, 4, 16, device)
    q_ref, k_ref = rotary_qk_reference(q.double(), k.double(), cos.double(), sin.double())
    q_twin, k_twin = rotary_qk_reference(q, k, cos, sin)
    apply_rotary_qk(q, k, cos, sin, inplace=True)
    assert_close_to_reference(qkv[:, :, 0::2].transpose(1, 2), q_ref, q_twin, name="q")
    assert_close_to_reference(qkv[:, :, 1::2].transpose(1, 2), k_ref, k_twin, name="k")


def test_in_place_on_views_of_one_buffer_updates_it_and_its_gradient(device):
    qkv_weight = torch.randn(8, 8 * 16, device=device, requires_grad=True)
    x = torch.randn(2, 4, 8, device=device)
    qkv = (x @ qkv_weight).view(2, 4, 8, 16)  # (B, S, Hq + 2 Hk, D), non-leaf
    q, k = qkv[:, :, :4].transpose(1, 2), qkv[:, :, 4:6].transpose(1, 2)
    cos, sin = make_tables(1, 4, 16, device)
    expected_q, expected_k = rotary_qk_reference(q.detach(), k.detach(), cos, sin)
    q_out, k_out = apply_rotary_qk(q, k, cos, sin, inplace=True)
    assert q_out is q and k_out is k
    assert_close_to_reference(qkv[:, :, :4].transpose(1, 2), expected_q.double(), expected_q, name="qkv q part")
    qkv.sum().backward()
    x64, w64 = x.double(), qkv_weight.detach().double().requires_grad_(True)
    qkv64 = (x64 @ w64).view(2, 4, 8, 16)
    q64, k64 = rotary_qk_reference(qkv64[:, :, :4].transpose(1, 2), qkv64[:, :, 4:6].transpose(1, 2), cos.double(),
                                   sin.double())  # fmt: skip
    (q64.sum() + k64.sum() + qkv64[:, :, 6:].sum()).backward()
    assert_close_to_reference(qkv_weight.grad, w64.grad, name="weight grad through the in-place rotation")


@pytest.mark.parametrize("rotary_percent", [1.0, 0.5])
def test_backward_of_a_sum_gets_expanded_gradients(rotary_percent, device):
    """(q_out.sum() + k_out.sum()).backward() hands the backward stride-0 gradients (read as they are:
    column stride 0), the pass-through columns included."""
    q, k = bhsd(2, 3, 5, 16, torch.float32, device), bhsd(2, 1, 5, 16, torch.float32, device)
    cos, sin = make_tables(1, 5, int(16 * rotary_percent), device)
    leaves = [x.detach().requires_grad_(True) for x in (q, k)]
    q_out, k_out = apply_rotary_qk(*leaves, cos, sin)
    (q_out.sum() + k_out.sum()).backward()

    def reference_grads(dtype):
        refs = [x.detach().to(dtype).requires_grad_(True) for x in (q, k)]
        q_ref, k_ref = rotary_qk_reference(*refs, cos.to(dtype), sin.to(dtype))
        (q_ref.sum() + k_ref.sum()).backward()
        return [x.grad for x in refs]

    for name, got, ref, twin in zip(("dq", "dk"), leaves, reference_grads(torch.float64), reference_grads(q.dtype)):
        assert_close_to_reference(got.grad, ref, twin, name=name)


def test_output_keeps_the_input_layout(device):
    q, k = bhsd(2, 3, 5, 16, torch.float32, device), bhsd(2, 1, 5, 16, torch.float32, device)
    q_out, k_out = apply_rotary_qk(q, k, *make_tables(1, 5, 16, device))
    assert q_out.stride() == q.stride() and k_out.stride() == k.stride()


def test_non_contiguous_tables_and_strided_head_dim(device, rope_checks):
    cos, sin = make_tables(1, 10, 16, device)
    q = torch.randn(2, 3, 5, 16, 2, device=device)[..., 0]  # last dim stride 2: read with its column stride
    k = torch.randn(2, 5, 2, 16, device=device).transpose(1, 2)
    rope_checks.check_rope_qk(q, k, cos[:, ::2], sin[:, ::2])
    # cos and sin with different strides (the kernel indexes both with one set: copied)
    sin_in_wider = torch.cat([sin, sin], dim=-1)[..., :16]
    rope_checks.check_rope_qk(q, k, cos, sin_in_wider)
    rope_checks.check_rope_qk(q, k, cos, sin_in_wider, inplace=True)


def test_empty_inputs(device):
    cos, sin = make_tables(1, 4, 8, device)
    for shape in [(0, 2, 4, 8), (2, 2, 0, 8), (2, 0, 4, 8)]:
        q = torch.randn(shape, device=device)
        q_out, k_out = apply_rotary_qk(q, q.clone(), cos, sin)
        assert q_out.shape == k_out.shape == shape


@pytest.mark.gpu(reason="a q past 2^31 elements: 16 GiB of GPU memory (q, its result and their gradients)")
@pytest.mark.parametrize("inplace", INPLACE)
def test_int64_offsets_past_2_31_elements(inplace, rope_checks):
    """q (B, H, S, D) bf16, a view of (B, S, H, D) memory of 2^31 + 2^18 elements, and a
    one-head k: the last batch entry's last 2 positions (past 2^31) against the reference, the
    forward and the backward into new tensors, or the forward in place."""
    batch, heads, head_dim = 16, 64, 128
    seq_len = 2**31 // (batch * heads * head_dim) + 2
    numel = batch * seq_len * heads * head_dim
    rope_checks.require_free_gpu_memory(4 * 2 * numel + 2**30, f"4 bf16 tensors of {numel} elements")
    q = torch.randn(batch, seq_len, heads, head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(batch, seq_len, 1, head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = make_tables(1, seq_len, head_dim, "cuda")
    tail = (slice(-1, None), slice(None), slice(-2, None))
    q_tail, k_tail = q[tail].clone(), k[tail].clone()
    if inplace:
        with torch.no_grad():
            q_out, k_out = apply_rotary_qk(q, k, cos, sin, inplace=True)
    else:
        q.requires_grad_(True)
        q_out, k_out = apply_rotary_qk(q, k, cos, sin)
        dq_out = torch.randn_like(q_out)
        (dq,) = torch.autograd.grad(q_out, q, dq_out)

    def reference(q_x, k_x, cos_x, sin_x, dq_x):
        q_x = q_x.detach().requires_grad_(True)
        q_ref, k_ref = rotary_qk_reference(q_x, k_x, cos_x, sin_x)
        return q_ref, k_ref, None if dq_x is None else torch.autograd.grad(q_ref, q_x, dq_x)[0]

    tables = cos[:, -2:], sin[:, -2:]
    dq_tail = None if inplace else dq_out[tail]
    refs = reference(q_tail.double(), k_tail.double(), *(x.double() for x in tables),
                     None if inplace else dq_tail.double())  # fmt: skip
    twins = reference(q_tail, k_tail, *tables, dq_tail)
    assert_close_to_reference(q_out[tail], refs[0], twins[0], name="q_out past 2^31")
    assert_close_to_reference(k_out[tail], refs[1], twins[1], name="k_out")
    if not inplace:
        assert_close_to_reference(dq[tail], refs[2], twins[2], name="dq past 2^31")


def test_in_place_without_autograd(device):
    """Under no_grad (inference) in place is one launch of the in-place operator; versions bump."""
    q, k = bhsd(2, 4, 5, 16, torch.bfloat16, device), bhsd(2, 2, 5, 16, torch.bfloat16, device)
    cos, sin = make_tables(1, 5, 12, device)
    q_ref, k_ref = rotary_qk_reference(q.double(), k.double(), cos.double(), sin.double())
    q_twin, k_twin = rotary_qk_reference(q, k, cos, sin)
    versions = q._version, k._version
    with torch.no_grad():
        q_out, k_out = apply_rotary_qk(q, k, cos, sin, inplace=True)
    assert q_out is q and k_out is k and q._version > versions[0] and k._version > versions[1]
    assert_close_to_reference(q, q_ref, q_twin, name="q")
    assert_close_to_reference(k, k_ref, k_twin, name="k")
