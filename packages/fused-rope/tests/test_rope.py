"""apply_rotary_pos_emb against TransformerEngine's unfused formula (float64), forward and backward.

A reduced grid (formats x interleaved x dtypes x full / partial rotary, with a margin of extra
angles) on tiny shapes, then odd sizes and layouts. The full grid at real sizes is in
test_rope_gpu.py.
"""

import itertools

import pytest
import torch
from tritonformer_testkit import assert_close_to_reference, dtype_params

from fused_rope import apply_rotary_pos_emb
from fused_rope.ops import config
from fused_rope.ops import rope as rope_ops
from fused_rope.ops import rope_qk as rope_qk_ops
from fused_rope.reference import apply_rotary_pos_emb_reference

pytestmark = pytest.mark.kernels

FORMATS = ["sbhd", "bshd", "thd"]
PAIRS = [pytest.param(False, id="rotate_half"), pytest.param(True, id="interleaved")]


def make_input(tensor_format, seq_len, batch, heads, head_dim, dtype, device):
    """t in tensor_format; for thd, `batch` packed sequences of lengths seq_len, seq_len - 1, ... (>= 1)."""
    if tensor_format == "thd":
        lengths = torch.tensor([max(1, seq_len - i) for i in range(batch)])
        cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(torch.int32).to(device)
        return torch.randn(int(lengths.sum()), heads, head_dim, device=device, dtype=dtype), cu_seqlens
    shape = (seq_len, batch, heads, head_dim) if tensor_format == "sbhd" else (batch, seq_len, heads, head_dim)
    return torch.randn(shape, device=device, dtype=dtype), None


@pytest.mark.parametrize("rotary_percent", [1.0, 0.5])
@pytest.mark.parametrize("interleaved", PAIRS)
@pytest.mark.parametrize("tensor_format", FORMATS)
@pytest.mark.parametrize("dtype", dtype_params())
def test_reduced_grid(tensor_format, interleaved, rotary_percent, dtype, device, rope_checks):
    head_dim, margin = 16, 3
    t, cu_seqlens = make_input(tensor_format, 5, 2, 3, head_dim, dtype, device)
    freqs = rope_checks.make_freqs(5 + margin, int(head_dim * rotary_percent), device)
    rope_checks.check_rope(t, freqs, tensor_format, interleaved, cu_seqlens)


@pytest.mark.parametrize("interleaved", PAIRS)
@pytest.mark.parametrize(
    "head_dim, d2",
    [(80, 80), (80, 40), (96, 96), (96, 48), (32, 24), (16, 2), (8, 6), (9, 8)],
    ids=lambda v: str(v),
)
def test_odd_head_dims_and_rotary_dims(head_dim, d2, interleaved, device, rope_checks):
    """Head dims 80 / 96 and rotary dims whose half is not a power of two (20, 24, 12, 3), d2 = 2,
    and an odd head dim (one pass-through column)."""
    t = torch.randn(3, 2, 3, head_dim, device=device, dtype=torch.bfloat16)
    rope_checks.check_rope(t, rope_checks.make_freqs(3, d2, device), "sbhd", interleaved)


@pytest.mark.parametrize("tensor_format", FORMATS)
def test_portable_interleaved_path(tensor_format, monkeypatch, device, rope_checks):
    """Interleaved pairs by two stride-2 loads: the path Triton 2.2 compiles (Triton 3 splits in registers)."""
    monkeypatch.setattr(rope_ops, "SPLIT_INTERLEAVED_PAIRS", False)
    t, cu_seqlens = make_input(tensor_format, 4, 2, 3, 16, torch.float16, device)
    rope_checks.check_rope(t, rope_checks.make_freqs(6, 12, device), tensor_format, True, cu_seqlens)


def test_thd_sequences_of_lengths_1_and_1000_forward(device):
    """Forward only here: the interpreter runs one program per token (about 4 ms each), so the
    backward of the same 1001 tokens is in test_rope_gpu.py, with every dtype and pair layout."""
    cu_seqlens = torch.tensor([0, 1, 1001], dtype=torch.int32, device=device)
    t = torch.randn(1001, 2, 8, device=device, dtype=torch.bfloat16)
    freqs = torch.rand(1000, 1, 1, 8, device=device) * 1000
    y = apply_rotary_pos_emb(t, freqs, "thd", cu_seqlens=cu_seqlens)
    expected = apply_rotary_pos_emb_reference(t.double(), freqs.double(), "thd", cu_seqlens=cu_seqlens)
    twin = apply_rotary_pos_emb_reference(t, freqs, "thd", cu_seqlens=cu_seqlens)
    assert_close_to_reference(y, expected, twin, name="y")


@pytest.mark.parametrize("interleaved", PAIRS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_thd_many_sequences_empty_ones_and_start_positions(index_dtype, interleaved, device, rope_checks):
    """Eleven packed sequences, three of them empty (the binary search must skip them)."""
    lengths = torch.tensor([3, 0, 1, 5, 0, 0, 2, 7, 1, 4, 2])
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(index_dtype).to(device)
    start_positions = torch.randint(0, 6, (len(lengths),), dtype=index_dtype, device=device)
    t = torch.randn(int(lengths.sum()), 3, 12, device=device)
    freqs = rope_checks.make_freqs(13, 8, device)
    rope_checks.check_rope(t, freqs, "thd", interleaved, cu_seqlens)
    rope_checks.check_rope(t, freqs, "thd", interleaved, cu_seqlens, start_positions)


@pytest.mark.parametrize("interleaved", PAIRS)
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
def test_start_positions(tensor_format, interleaved, device, rope_checks):
    t, _ = make_input(tensor_format, 4, 3, 2, 16, torch.float16, device)
    start_positions = torch.tensor([0, 5, 2], device=device)
    freqs = rope_checks.make_freqs(9, 12, device)  # 5 + 4 = 9: the largest start fits exactly
    rope_checks.check_rope(t, freqs, tensor_format, interleaved, None, start_positions)


@pytest.mark.parametrize("tensor_format", FORMATS)
def test_batch_1_and_length_1(tensor_format, device, rope_checks):
    for seq_len, batch in [(1, 1), (1, 3), (4, 1)]:
        t, cu_seqlens = make_input(tensor_format, seq_len, batch, 2, 8, torch.float32, device)
        rope_checks.check_rope(t, rope_checks.make_freqs(seq_len, 8, device), tensor_format, False, cu_seqlens)


def test_many_heads_span_several_row_blocks(device, rope_checks):
    """More rows (batch x heads) than one program's tile: several row blocks per position."""
    t = torch.randn(2, 3, 70, 64, device=device, dtype=torch.bfloat16)
    rope_checks.check_rope(t, rope_checks.make_freqs(2, 64, device), "sbhd", False)
    rope_checks.check_rope(t.transpose(0, 1), rope_checks.make_freqs(2, 64, device), "bshd", True)


def _power_of_2(n):
    return n > 0 and n & (n - 1) == 0


def test_tile_heights_and_warps_are_powers_of_two():
    """BLOCK_R (a tl.arange length) and num_warps are powers of 2 for any row width, also rows
    that are not a power of 2 bytes (partial rotary: 96 rotary + 32 pass-through bf16 columns
    are 320 bytes), in both kernels' plans. (The interpreter ignores num_warps: only a GPU
    would fail on it.)"""
    for n_rows, half, n_pass, element_size, copy_pass, lanes in itertools.product(
        [1, 3, 17, 64, 1024], [1, 4, 24, 40, 48, 64, 256], [0, 8, 16, 32, 48, 200], [2, 4], [False, True], [0, 1, 2]
    ):
        cfg = config.launch_config(n_rows, half, n_pass, element_size, copy_pass, lanes)
        assert _power_of_2(cfg.block_r) and _power_of_2(cfg.num_warps), (n_rows, half, n_pass, element_size, cfg)
    for heads, d2, head_dim, element_size, in_place in itertools.product(
        [1, 8, 64, 200], [8, 48, 96, 128], [128, 160], [2, 4], [False, True]
    ):
        choice = rope_qk_ops.kernel_config(heads, heads // 4, d2, head_dim, element_size, in_place, False)
        assert _power_of_2(choice.constexprs["BLOCK_R"]) and _power_of_2(choice.num_warps), (heads, d2, choice)


@pytest.mark.parametrize("interleaved", PAIRS)
def test_partial_rotary_with_many_rows(interleaved, device, rope_checks):
    """Rows of 48 pairs and 32 pass-through columns (fp32: 512 + 128 bytes), more of them
    (batch x heads) than fit one tile."""
    t = torch.randn(2, 4, 8, 128, device=device)
    rope_checks.check_rope(t, rope_checks.make_freqs(2, 96, device), "sbhd", interleaved)


@pytest.mark.parametrize("interleaved", PAIRS)
def test_non_contiguous_inputs(interleaved, device, rope_checks):
    # q of a fused qkv projection: (B, S, H, D) slice with gaps between tokens.
    qkv = torch.randn(2, 5, 3, 4, 16, device=device)
    rope_checks.check_rope(qkv[:, :, 0], rope_checks.make_freqs(5, 16, device), "bshd", interleaved)
    # sbhd view of bshd memory, and thd tokens with a strided head dim (read with its column stride).
    bshd = torch.randn(2, 5, 3, 16, device=device)
    rope_checks.check_rope(bshd.transpose(0, 1), rope_checks.make_freqs(6, 10, device), "sbhd", interleaved)
    strided_last = torch.randn(6, 2, 16, 2, device=device)[..., 0]
    cu_seqlens = torch.tensor([0, 2, 6], dtype=torch.int32, device=device)
    rope_checks.check_rope(strided_last, rope_checks.make_freqs(4, 16, device), "thd", interleaved, cu_seqlens)


@pytest.mark.parametrize(
    "make_t, tensor_format",
    [
        (lambda d: torch.randn(2, 5, 3, 16, device=d).transpose(0, 1), "sbhd"),  # dense, transposed
        (lambda d: torch.randn(5, 2, 3, 16, device=d).transpose(0, 1), "bshd"),
        (lambda d: torch.randn(2, 5, 9, 16, device=d)[:, :, :3], "bshd"),  # q of a fused qkv: gaps
        (lambda d: torch.randn(3, 6, 16, device=d).transpose(0, 1), "thd"),
    ],
)  # fmt: skip
def test_output_and_gradient_are_contiguous_as_in_te(make_t, tensor_format, device):
    """TE's fused path allocates its output (and the gradient) contiguous whatever t's strides,
    so code may .view() the result."""
    t = make_t(device).requires_grad_(True)
    cu_seqlens = torch.tensor([0, 2, 6], dtype=torch.int32, device=device) if tensor_format == "thd" else None
    freqs = torch.randn(6, 1, 1, 16, device=device)
    out = apply_rotary_pos_emb(t, freqs, tensor_format, cu_seqlens=cu_seqlens)
    assert out.is_contiguous() and out.view(-1).shape == (t.numel(),)
    dt = rope_ops.rope_bwd(torch.randn_like(out).transpose(0, 1).contiguous().transpose(0, 1), freqs, None,
                           cu_seqlens, tensor_format, False)  # fmt: skip
    assert dt.is_contiguous()
    expected = apply_rotary_pos_emb_reference(t.detach(), freqs, tensor_format, cu_seqlens=cu_seqlens)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize("freqs_dtype", dtype_params())
def test_freqs_layouts_and_dtypes(freqs_dtype, device, rope_checks):
    """freqs (s2, d2) or a non-contiguous (s2, 1, 1, d2) view, in any float dtype (upcast in the kernel)."""
    t = torch.randn(4, 2, 3, 16, device=device, dtype=torch.bfloat16)
    freqs = rope_checks.make_freqs(6, 12, device, freqs_dtype)
    rope_checks.check_rope(t, freqs.view(6, 12), "sbhd")
    wide = rope_checks.make_freqs(6, 24, device, freqs_dtype)[..., ::2]
    rope_checks.check_rope(t, wide, "sbhd", True)


def test_te_style_equal_pair_angles_are_an_exact_rotation(device):
    """With TE's cat(theta, theta) angles the backward is the inverse rotation: bwd(fwd(x)) = x."""
    theta = torch.rand(7, 8, device=device) * 50
    freqs = torch.cat((theta, theta), -1).view(7, 1, 1, 16)
    x = torch.randn(7, 2, 3, 16, device=device, requires_grad=True)
    y = apply_rotary_pos_emb(x, freqs)
    (back,) = torch.autograd.grad(y, x, y)
    torch.testing.assert_close(back, x.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(y.norm(dim=-1), x.detach().norm(dim=-1))


def test_empty_inputs(device):
    for shape, fmt in [((0, 2, 3, 8), "sbhd"), ((2, 0, 3, 8), "bshd"), ((2, 4, 0, 8), "sbhd")]:
        t = torch.randn(shape, device=device)
        assert apply_rotary_pos_emb(t, torch.randn(4, 1, 1, 8, device=device), fmt).shape == shape
    cu_seqlens = torch.zeros(1, dtype=torch.int32, device=device)
    assert apply_rotary_pos_emb(torch.randn(0, 2, 8, device=device), torch.randn(3, 8, device=device), "thd",
                                cu_seqlens=cu_seqlens).shape == (0, 2, 8)  # fmt: skip
    no_starts = torch.zeros(0, dtype=torch.int64, device=device)  # batch 0 with start positions
    assert apply_rotary_pos_emb(torch.randn(3, 0, 2, 8, device=device), torch.randn(4, 8, device=device), "sbhd",
                                start_positions=no_starts).shape == (3, 0, 2, 8)  # fmt: skip


# (s, b, h, d): 2^31 elements and 2 more positions, so the last 2 positions lie past 2^31.
LARGE_SBHD = (2**31 // (16 * 64 * 128) + 2, 16, 64, 128)


@pytest.mark.gpu(reason="tensors past 2^31 elements: 16 GiB of GPU memory (input, output and their gradients)")
@pytest.mark.parametrize(
    "tensor_format, interleaved, d2", [("sbhd", False, 128), ("bshd", True, 96), ("thd", False, 64)]
)
def test_int64_offsets_past_2_31_elements(tensor_format, interleaved, d2, rope_checks):
    """Forward and backward on a bf16 tensor of 2^31 + 2^18 elements: the elements past 2^31 (the
    last 2 positions of every batch entry; for thd the last 32 tokens) against the reference.
    bshd is a view of sbhd memory (batch stride < position stride); rotary dims below 128 copy
    the pass-through columns."""
    seq_len, batch, heads, head_dim = LARGE_SBHD
    numel = seq_len * batch * heads * head_dim
    rope_checks.require_free_gpu_memory(4 * 2 * numel + 2**30, f"4 bf16 tensors of {numel} elements")
    memory = torch.randn(LARGE_SBHD, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    freqs = torch.rand(seq_len, 1, 1, d2, device="cuda") * 100
    cu_seqlens = None
    if tensor_format == "sbhd":
        t, tail = memory, (slice(seq_len - 2, None),)
    elif tensor_format == "bshd":
        t, tail = memory.transpose(0, 1), (slice(None), slice(seq_len - 2, None))
    else:  # batch sequences of seq_len tokens; the last 32 tokens end the last one
        t, tail = memory.view(seq_len * batch, heads, head_dim), (slice(-32, None),)
        cu_seqlens = torch.arange(0, batch + 1, device="cuda", dtype=torch.int32) * seq_len
    y = apply_rotary_pos_emb(t, freqs, tensor_format, interleaved, cu_seqlens)
    dy = torch.randn_like(y)
    (dt,) = torch.autograd.grad(y, t, dy)
    tail_freqs = freqs[-32:] if tensor_format == "thd" else freqs[-2:]

    def reference(x, dy_x, freqs_x):
        """The reference on the tail (for thd: the tail tokens as one sbhd sequence of batch 1)."""
        x = x.detach().requires_grad_(True)
        fmt = "sbhd" if tensor_format == "thd" else tensor_format
        shape = x.shape
        if tensor_format == "thd":
            x, dy_x = x.unsqueeze(1), dy_x.unsqueeze(1)
        out = apply_rotary_pos_emb_reference(x, freqs_x, fmt, interleaved)
        (dx,) = torch.autograd.grad(out, x, dy_x)
        return out.reshape(shape), dx.reshape(shape)

    y_ref, dt_ref = reference(t[tail].double(), dy[tail].double(), tail_freqs.double())
    y_twin, dt_twin = reference(t[tail], dy[tail], tail_freqs)
    assert_close_to_reference(y[tail], y_ref, y_twin, name="y past 2^31")
    assert_close_to_reference(dt[tail], dt_ref, dt_twin, name="dt past 2^31")


@pytest.mark.gpu(reason="autocast runs on CUDA")
def test_autocast_keeps_input_dtype():
    t = torch.randn(8, 2, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.float16):
        y = apply_rotary_pos_emb(t, torch.randn(8, 1, 1, 64, device="cuda"))
    y.sum().backward()
    assert y.dtype == torch.bfloat16 and t.grad.dtype == torch.bfloat16


def test_backward_of_a_sum_gets_an_expanded_gradient(device):
    """y.sum().backward() hands the backward a stride-0 gradient (read as it is: column stride 0)."""
    t = torch.randn(4, 2, 3, 16, device=device, requires_grad=True)
    freqs = torch.rand(4, 1, 1, 12, device=device) * 10
    apply_rotary_pos_emb(t, freqs, "sbhd", True).sum().backward()
    t64 = t.detach().double().requires_grad_(True)
    apply_rotary_pos_emb_reference(t64, freqs.double(), "sbhd", True).sum().backward()
    t32 = t.detach().requires_grad_(True)
    apply_rotary_pos_emb_reference(t32, freqs, "sbhd", True).sum().backward()
    assert_close_to_reference(t.grad, t64.grad, t32.grad, name="dt")
